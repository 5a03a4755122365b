"""The paths that make attention scores in torch (Gemma 2's softcap, gpt-oss's sinks) take their
queries in blocks whose scores stay within SCORES_BYTES: the same result as one block, with
the memory of one block."""

import importlib
import math

import pytest
import torch
import torch.nn.functional as F

from ember.batch import Batch
from ember.kvcache import CausalCache
from ember.nn.sinks import sink_attention
from ember.nn.softcap import softcap_attention

attention_module = importlib.import_module("ember.nn.attention")  # not ember.nn's function
TOKENS, HEADS, KV_HEADS, DIM = 37, 4, 2, 16


def filled_cache(g: torch.Generator) -> tuple[CausalCache, torch.Tensor, torch.Tensor]:
    """A cache holding a 20-token prompt, started for a batch of TOKENS more."""
    cache = CausalCache()
    cache.init(max_sequences=1, capacity=64, max_batch=TOKENS)
    k, v = torch.randn(20, KV_HEADS, DIM, generator=g), torch.randn(20, KV_HEADS, DIM, generator=g)
    cache.start_forward(Batch.single(list(range(20)), 0))
    cache.set_layer(0)
    cache.put(k, v)
    cache.start_forward(Batch.single(list(range(TOKENS)), 20))
    return cache, k, v


def sdpa(q, keys, values, scale):
    """Grouped-query causal attention of q after 20 cached tokens, by torch's SDPA."""
    g = HEADS // KV_HEADS
    mask = torch.full((TOKENS, 20 + TOKENS), float("-inf")).triu(21)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        keys.transpose(0, 1).repeat_interleave(g, 0)[None],
        values.transpose(0, 1).repeat_interleave(g, 0)[None],
        attn_mask=mask,
        scale=scale,
    )
    return out[0].transpose(0, 1).flatten(1)


@pytest.mark.parametrize("budget", [16 << 20, 4 * HEADS * 57 * 5])  # one block; blocks of 5
@pytest.mark.parametrize("path", ["softcap", "sinks"])
def test_blocks_of_queries_equal_attention_over_all_of_them(monkeypatch, budget, path):
    monkeypatch.setattr(attention_module, "SCORES_BYTES", budget)
    g = torch.Generator().manual_seed(3)
    cache, old_k, old_v = filled_cache(g)
    q, k, v = (torch.randn(TOKENS, n, DIM, generator=g) for n in (HEADS, KV_HEADS, KV_HEADS))
    scale = 1 / math.sqrt(DIM)
    if path == "softcap":  # a cap far above every score leaves them as they are
        out = softcap_attention(q, k, v, cache, scale=scale, cap=1e4)
    else:  # a sink of -inf takes no weight
        sinks = torch.full((HEADS,), float("-inf"))
        out = sink_attention(q, k, v, cache, scale=scale, sinks=sinks)
    want = sdpa(q, torch.cat((old_k, k)), torch.cat((old_v, v)), scale)
    assert out.shape == (TOKENS, HEADS * DIM)
    assert torch.allclose(out, want, atol=1e-5)


def test_a_sink_takes_its_share_of_every_block(monkeypatch):
    """A sink's weight lowers each query's output alike, in whichever block the query is."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(TOKENS, n, DIM, generator=g) for n in (HEADS, KV_HEADS, KV_HEADS))
    sinks = torch.linspace(-1.0, 2.0, HEADS)
    outs = []
    for budget in (16 << 20, 4 * HEADS * 57 * 3):
        monkeypatch.setattr(attention_module, "SCORES_BYTES", budget)
        cache, _, _ = filled_cache(torch.Generator().manual_seed(5))
        outs.append(sink_attention(q, k, v, cache, scale=0.25, sinks=sinks))
    assert torch.allclose(outs[0], outs[1], atol=1e-6)


@pytest.mark.parametrize(("cached", "tokens"), [(0, 2), (0, 64), (0, 150), (20, 65), (70, 3)])
def test_plain_causal_attention_in_query_blocks_equals_one_masked_call(cached, tokens):
    # one sequence's prompt takes its queries in blocks, each with the cells up to its last
    g = torch.Generator().manual_seed(tokens)
    cache = CausalCache()
    cache.init(max_sequences=1, capacity=256, max_batch=max(cached, tokens))
    cache.set_layer(0)
    total = cached + tokens
    k, v = (
        torch.randn(total, KV_HEADS, DIM, generator=g),
        torch.randn(total, KV_HEADS, DIM, generator=g),
    )
    if cached:
        cache.start_forward(Batch.single(list(range(cached)), 0))
        cache.put(k[:cached], v[:cached])
    cache.start_forward(Batch.single(list(range(tokens)), cached))
    assert cache.plain_causal()
    q = torch.randn(tokens, HEADS, DIM, generator=g)
    got = attention_module.attention(q, k[cached:], v[cached:], cache, scale=0.3)
    mask = torch.full((tokens, total), float("-inf")).triu(cached + 1)
    want = (
        F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],
            k.transpose(0, 1)[None],
            v.transpose(0, 1)[None],
            attn_mask=mask,
            scale=0.3,
            enable_gqa=True,
        )[0]
        .transpose(0, 1)
        .flatten(1)
    )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
