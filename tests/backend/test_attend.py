"""The native one-token attention (attend.h) on every ISA this CPU runs, against float64 torch
attention: cache types, grouped-query tiles, head sizes that are no multiple of 8 or 64, masks
(and a head that sees nothing), strided cache views; and `attention()` taking it in decode."""

import math
import sys

import pytest
import torch
from native_isas import ISAS

from ember.backend import attend, native
from ember.batch import Batch
from ember.kvcache import CausalCache
from ember.nn import attention

pytestmark = pytest.mark.skipif(not native.available(), reason="the native library was not built")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (query heads, KV heads, key size, value size, cells): tiles of 4 and their rests, D % 8 != 0,
# value sizes below, at and past the 16 lanes a tile's heads hold in registers, and between
SHAPES = [(9, 3, 64, 64, 549), (4, 1, 256, 256, 37), (14, 2, 64, 64, 5), (8, 8, 80, 80, 1)]
SHAPES += [(5, 1, 20, 12, 19), (6, 2, 128, 96, 64), (6, 2, 32, 40, 23)]


def reference(q, keys, values, mask, scale):
    group = q.shape[0] // keys.shape[0]
    k = keys.double().repeat_interleave(group, 0)
    v = values.double().repeat_interleave(group, 0)
    scores = (q.double()[:, None, :] @ k.transpose(1, 2))[:, 0] * scale
    if mask is not None:
        scores = scores + mask.double()
    probs = torch.softmax(scores, -1).nan_to_num(0.0)  # a head that sees nothing: zeros
    return (probs[:, None, :] @ v)[:, 0].reshape(1, -1)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("masked", [False, True])
def test_equals_float64_attention(isa, dtype, shape, masked, monkeypatch):
    monkeypatch.setenv("EMBER_CPU_ISA", isa)
    heads, kv_heads, dim, v_dim, cells = shape
    gen = torch.Generator().manual_seed(sum(shape))
    q = torch.randn(heads, dim, generator=gen)
    # views into larger buffers, as the cache hands them out: cells [3, 3 + S) of 2 * S + 8
    keys = torch.randn(kv_heads, 2 * cells + 8, dim, generator=gen).to(dtype)[:, 3 : 3 + cells]
    values = torch.randn(kv_heads, 2 * cells + 8, v_dim, generator=gen).to(dtype)[:, 3 : 3 + cells]
    mask = None
    if masked:
        mask = torch.where(torch.rand(1, cells, generator=gen) < 0.4, -math.inf, 0.0)
        mask[0, -1] = 0.0
    got = attend.attend_one(q, keys, values, mask, 0.125)
    assert got is not None
    want = reference(q, keys, values, mask, 0.125)
    assert got.shape == (1, heads * v_dim)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_hidden_cells_are_skipped_so_a_sequence_gets_the_bits_of_its_cells_alone(
    isa, dtype, monkeypatch
):
    # eight sequences' decode cells interleave in one range; the mask shows a row its own. Its
    # result has the bits of attending over its cells alone, as if stored contiguously.
    monkeypatch.setenv("EMBER_CPU_ISA", isa)
    gen = torch.Generator().manual_seed(8)
    q = torch.randn(9, 64, generator=gen)
    keys = torch.randn(3, 8 * 70, 64, generator=gen).to(dtype)
    values = torch.randn(3, 8 * 70, 64, generator=gen).to(dtype)
    mine = torch.arange(8 * 70) % 8 == 5
    mask = torch.where(mine, 0.0, -math.inf)[None]
    together = attend.attend_one(q, keys, values, mask, 0.125)
    alone = attend.attend_one(q, keys[:, mine], values[:, mine], None, 0.125)
    assert together is not None and alone is not None
    assert torch.equal(together, alone)


@pytest.mark.parametrize("isa", ISAS)
def test_a_head_that_sees_no_cell_gets_zeros_and_large_scores_stay_finite(isa, monkeypatch):
    monkeypatch.setenv("EMBER_CPU_ISA", isa)
    gen = torch.Generator().manual_seed(3)
    q = torch.full((2, 16), 30.0)
    keys, values = torch.randn(1, 9, 16, generator=gen).abs(), torch.randn(1, 9, 16, generator=gen)
    hidden = torch.full((1, 9), -math.inf)
    assert attend.attend_one(q, keys, values, hidden, 1.0).abs().sum() == 0
    got = attend.attend_one(q, keys, values, None, 1.0)  # scores in the thousands
    assert got is not None
    want = reference(q, keys, values, None, 1.0)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_what_it_cannot_read_falls_back():
    q = torch.randn(2, 8)
    keys = torch.randn(1, 4, 8).to(torch.float64)
    assert attend.attend_one(q, keys, keys, None, 1.0) is None
    strided = torch.randn(1, 8, 4).transpose(1, 2)  # unit stride along cells, not along D
    assert attend.attend_one(q, strided, strided, None, 1.0) is None


@pytest.mark.parametrize("kv_type", ["f32", "f16", "q8_0"])
def test_attention_in_decode_equals_the_torch_path(kv_type, monkeypatch):
    """A few sequences' prompts, then one token of one of them: the native path (float caches)
    and the torch path over cache.get() give the same output."""
    heads, kv_heads, dim = 6, 2, 64

    def run() -> torch.Tensor:
        cache = CausalCache(shift=lambda layer, k, d: k)
        cache.init(max_sequences=2, capacity=64, max_batch=32, dtype=kv_type)
        torch.manual_seed(0)
        for batch in (
            Batch.single(list(range(20)), 0, seq=0),
            Batch.single(list(range(9)), 0, seq=1),
        ):
            cache.start_forward(batch)
            n = len(batch)
            attention(
                torch.randn(n, heads, dim),
                torch.randn(n, kv_heads, dim),
                torch.randn(n, kv_heads, dim),
                cache,
                scale=dim**-0.5,
            )
        cache.start_forward(Batch.single([5], 9, seq=1))  # the mask hides sequence 0's cells
        return attention(
            torch.randn(1, heads, dim),
            torch.randn(1, kv_heads, dim),
            torch.randn(1, kv_heads, dim),
            cache,
            scale=dim**-0.5,
        )

    module = sys.modules["ember.nn.attention"]  # the package's `attention` is the function
    calls = []

    def counted(*args):
        out = attend.attend_one(*args)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(module, "attend_one", counted)
    native_out = run()
    assert calls == ([True] if kv_type != "q8_0" else [])  # quantized caches: the torch path
    monkeypatch.setattr(module, "attend_one", lambda *args: None)
    torch_out = run()
    torch.testing.assert_close(native_out, torch_out, rtol=1e-5, atol=1e-5)
