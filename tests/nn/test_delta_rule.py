"""The gated delta rule in blocks equals it token by token, from a zero or a carried state,
over runs shorter than a block and across several blocks."""

import pytest
import torch
import torch.nn.functional as F

from ember.nn import delta_rule


def inputs(n: int, seed: int):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    h, dk, dv = 3, 8, 6
    q = F.normalize(torch.randn(n, h, dk, generator=gen), dim=-1) * dk**-0.5
    k = F.normalize(torch.randn(n, h, dk, generator=gen), dim=-1)
    v = torch.randn(n, h, dv, generator=gen)
    g = -torch.rand(n, h, generator=gen) * 0.5  # the log of a decay in (0.6, 1]
    beta = torch.rand(n, h, generator=gen)
    state = torch.randn(h, dk, dv, generator=gen)
    return state, q, k, v, g, beta


@pytest.mark.parametrize("n", [1, 5, 64, 150])
def test_blocks_equal_token_by_token(n):
    state, q, k, v, g, beta = inputs(n, n)
    out, final = delta_rule.chunked(state, q, k, v, g, beta)
    expected = []
    for t in range(n):
        o, state = delta_rule.step(state, q[t], k[t], v[t], g[t], beta[t])
        expected.append(o)
    assert (out - torch.stack(expected)).abs().max() < 1e-4
    assert (final - state).abs().max() < 1e-4
