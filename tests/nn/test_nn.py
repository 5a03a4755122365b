"""RoPE's one-op-per-layer Rotation against the pairwise formula, and one-token attention
against torch's SDPA, with and without a mask, over cache types."""

import math

import pytest
import torch
import torch.nn.functional as F

from ember.batch import Batch
from ember.kvcache import CausalCache
from ember.nn import RoPE, attention


@pytest.mark.parametrize("is_neox", [False, True])
@pytest.mark.parametrize("dim", [16, 8])  # 8: partial rotary, the last 8 dims pass through
def test_rotation_equals_pairwise_rope_with_scaled_queries(is_neox, dim):
    rope = RoPE(dim, 10000.0, is_neox, scale=2.0)
    g = torch.Generator().manual_seed(0)
    positions = torch.tensor([0, 3, 17, 4095])
    q, k = torch.randn(4, 6, 16, generator=g), torch.randn(4, 2, 16, generator=g)
    rot = rope.rotation(positions, 16, [(6, 0.25), (2, 1.0)])
    out = rot(torch.cat((q, k), 1))
    cos, sin = rope.cos_sin(positions)
    assert torch.allclose(out[:, :6], rope.apply(q, cos, sin) * 0.25, atol=1e-6)
    assert torch.allclose(out[:, 6:], rope.apply(k, cos, sin), atol=1e-6)


@pytest.mark.parametrize("is_neox", [False, True])
@pytest.mark.parametrize("dim", [16, 8])
def test_a_rotations_partner_swaps_each_rotated_dimension_with_its_pair(is_neox, dim):
    rot = RoPE(dim, 10000.0, is_neox).rotation(torch.tensor([1]), 16, [(1, 1.0)])
    x = torch.arange(16.0).expand(2, 3, 16)
    half = dim // 2
    pairs = [(i + half) % dim if is_neox else i ^ 1 for i in range(dim)]
    assert torch.equal(rot.partner(x), x[..., pairs + list(range(dim, 16))])


def reference(q, keys, values, mask, scale):
    g = q.shape[1] // keys.shape[0]
    return (
        F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],
            keys.repeat_interleave(g, 0)[None],
            values.repeat_interleave(g, 0)[None],
            attn_mask=mask,
            scale=scale,
        )[0]
        .transpose(0, 1)
        .flatten(1)
    )


@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize(
    ("kind", "tolerance"), [("f32", 1e-5), ("f16", 2e-3), ("q8_0", 2e-2), ("q4_0", 0.15)]
)
def test_one_token_attention_equals_sdpa_over_the_used_cells(window, kind, tolerance):
    g = torch.Generator().manual_seed(1)
    cache = CausalCache(window=window)
    cache.init(max_sequences=2, capacity=32, max_batch=16, dtype=kind)
    prompt_k, prompt_v = torch.randn(10, 2, 64, generator=g), torch.randn(10, 2, 64, generator=g)
    cache.start_forward(Batch.single(list(range(10)), 0))
    cache.set_layer(0)
    cache.put(prompt_k, prompt_v)
    q, k, v = (torch.randn(1, n, 64, generator=g) for n in (6, 2, 2))
    cache.start_forward(Batch.single([5], 10))
    out = attention(q, k, v, cache, scale=0.125)
    keys = torch.cat((prompt_k, k)).transpose(0, 1)
    values = torch.cat((prompt_v, v)).transpose(0, 1)
    if window is not None:
        keys, values = keys[:, -window:], values[:, -window:]
    want = reference(q, keys, values, None, 0.125)
    assert cache.hi - cache.lo <= 11  # the used cells only, not the 64 allocated
    assert out.shape == (1, 6 * 64)
    assert (out - want).abs().max() <= tolerance * want.abs().max()


def test_several_tokens_attend_as_sdpa_with_the_scale_given():
    g = torch.Generator().manual_seed(2)
    cache = CausalCache()
    cache.init(max_sequences=1, capacity=8, max_batch=8)
    q, k, v = (torch.randn(5, n, 32, generator=g) for n in (4, 2, 2))
    cache.start_forward(Batch.single([1, 2, 3, 4, 5], 0))
    cache.set_layer(0)
    out = attention(q, k, v, cache, scale=1 / math.sqrt(32))
    causal = torch.full((5, 5), float("-inf")).triu(1)
    want = reference(q, k.transpose(0, 1), v.transpose(0, 1), causal, 1 / math.sqrt(32))
    assert torch.allclose(out, want, atol=1e-5)
