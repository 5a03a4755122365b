"""A prompt's causal attention through oneDNN's products (ember/nn/prompt_attention.py): SDPA's
results up to accumulation order, for grouped and plain heads, prompts after cached cells, and
lengths that are not whole blocks; the products only ever see a small set of shapes."""

import importlib

import pytest
import torch
import torch.nn.functional as F

from ember.backend import gemm
from ember.batch import Batch
from ember.kvcache import CausalCache
from ember.nn import prompt_attention

attention_module = importlib.import_module("ember.nn.attention")  # not ember.nn's function

needs_onednn = pytest.mark.skipif(not gemm.available(), reason="torch without oneDNN here")


def sdpa(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    tokens, cells = q.shape[0], keys.shape[1]
    mask = torch.full((tokens, cells), float("-inf")).triu(cells - tokens + 1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        keys[None],
        values[None],
        attn_mask=mask,
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1).flatten(1)


@needs_onednn
@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "earlier", "tokens"),
    [
        (4, 1, 256, 0, 512),
        (4, 1, 256, 0, 2),
        (9, 3, 64, 0, 150),
        (14, 2, 64, 20, 65),
        (6, 6, 32, 70, 3),
        (8, 2, 128, 1000, 130),  # past 1,024 cells: rounded to steps of 64 or more
    ],
)
@pytest.mark.parametrize("scale", [0.3, 1.0])
def test_equals_sdpa(heads, kv_heads, dim, earlier, tokens, scale):
    g = torch.Generator().manual_seed(tokens + earlier)
    cells = earlier + tokens
    q = torch.randn(tokens, heads, dim, generator=g)
    keys, values = (torch.randn(kv_heads, cells, dim, generator=g) for _ in range(2))
    got = prompt_attention.causal_attention(q, keys, values, scale)
    assert got.shape == (tokens, heads * dim)
    torch.testing.assert_close(got, sdpa(q, keys, values, scale), rtol=1e-5, atol=1e-4)


def test_cells_come_in_few_sizes():
    sizes = {prompt_attention.cells_for(n) for n in range(1, 65537)}
    assert all(prompt_attention.cells_for(n) >= n for n in (1, 63, 64, 65, 1025, 5000, 65536))
    assert max(prompt_attention.cells_for(n) / n for n in range(1025, 65537)) <= 1.125
    assert len(sizes) == 16 + 8 * 6  # 64..1024 by 64, then eight an octave to 65,536


@needs_onednn
def test_the_products_see_a_bounded_set_of_shapes(monkeypatch):
    shapes = set()

    def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        shapes.add((tuple(x.shape), tuple(w.shape)))
        assert w.is_contiguous()
        return x @ w.t()

    monkeypatch.setattr(gemm, "linear", linear)
    g = torch.Generator().manual_seed(0)
    prompts = [(0, t) for t in range(2, 300, 7)] + [(e, 40) for e in range(1, 200, 13)]
    for earlier, tokens in prompts:
        q = torch.randn(tokens, 4, 16, generator=g)
        keys = torch.randn(2, earlier + tokens, 16, generator=g)
        prompt_attention.causal_attention(q, keys, keys, 0.25)
    # queries always one block of each of the group's 2 heads; cells a multiple of 64 to 384
    rows = prompt_attention.block_for(2) * 2
    assert shapes <= {((rows, 16), (n, 16)) for n in range(64, 385, 64)} | {
        ((rows, n), (16, n)) for n in range(64, 385, 64)
    }


@needs_onednn
def test_a_prompt_through_the_cache_takes_it(monkeypatch):
    calls = []
    real = prompt_attention.causal_attention

    def spy(*args):
        calls.append(args[0].shape)
        return real(*args)

    monkeypatch.setattr(prompt_attention, "causal_attention", spy)
    monkeypatch.setattr(prompt_attention, "available", lambda: True)
    cache = CausalCache()
    cache.init(max_sequences=1, capacity=256, max_batch=100)
    cache.set_layer(0)
    cache.start_forward(Batch.single(list(range(100)), 0))
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(100, n, 128, generator=g) for n in (4, 2, 2))
    got = attention_module.attention(q, k, v, cache, scale=0.1)
    assert calls == [(100, 4, 128)]
    want = sdpa(q, k.transpose(0, 1), v.transpose(0, 1), 0.1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
