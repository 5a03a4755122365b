"""A prompt's causal attention (ember/nn/prompt_attention.py), by the native kernel on every ISA
path this CPU runs and by oneDNN's products: SDPA's results up to accumulation order, for
grouped and plain heads, prompts after cached cells, lengths that are not whole blocks or tiles,
and scores large enough that a running softmax must rescale; the products only ever see a
small set of shapes."""

import ctypes
import importlib

import pytest
import torch
import torch.nn.functional as F

from ember.backend import gemm, native
from ember.batch import Batch
from ember.kvcache import CausalCache
from ember.nn import prompt_attention

attention_module = importlib.import_module("ember.nn.attention")  # not ember.nn's function

needs_onednn = pytest.mark.skipif(not gemm.available(), reason="torch without oneDNN here")


def sdpa(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, window: int = 0
) -> torch.Tensor:
    tokens, cells = q.shape[0], keys.shape[1]
    mask = torch.full((tokens, cells), float("-inf")).triu(cells - tokens + 1)
    if window:  # and before the last `window` cells of each token's
        mask += torch.full((tokens, cells), float("-inf")).tril(cells - tokens - window)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        keys[None],
        values[None],
        attn_mask=mask,
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1).flatten(1)


SHAPES = [  # heads, KV heads, head size, earlier cells, tokens
    (4, 1, 256, 0, 512),
    (4, 1, 256, 0, 2),
    (9, 3, 64, 0, 150),
    (14, 2, 64, 20, 65),
    (6, 6, 32, 70, 3),
    (8, 2, 128, 1000, 130),  # past 1,024 cells: rounded to steps of 64 or more
    (3, 1, 40, 5, 37),  # a head size and lengths that are not whole registers or blocks
]


def inputs(heads, kv_heads, dim, earlier, tokens, dim_v=None):
    g = torch.Generator().manual_seed(tokens + earlier)
    cells = earlier + tokens
    q = torch.randn(tokens, heads, dim, generator=g)
    keys = torch.randn(kv_heads, cells, dim, generator=g)
    return q, keys, torch.randn(kv_heads, cells, dim_v or dim, generator=g)


def kernel_attention(isa, q, keys, values, scale, window=0):
    """The native kernel of one ISA path, called straight (the portable C included)."""
    tokens, heads, dim = q.shape
    kv_heads, cells, dim_v = values.shape
    out = torch.empty(tokens, heads * dim_v)
    rc = native.kernels(isa).prompt_attend(
        q.data_ptr(), tokens, heads, dim, keys.data_ptr(), values.data_ptr(), kv_heads, cells,
        dim_v, ctypes.c_float(scale), window, out.data_ptr(),
    )  # fmt: skip
    assert rc == 0
    return out


@needs_onednn
@pytest.mark.parametrize(("heads", "kv_heads", "dim", "earlier", "tokens"), SHAPES)
@pytest.mark.parametrize("scale", [0.3, 1.0])
def test_equals_sdpa(heads, kv_heads, dim, earlier, tokens, scale):
    q, keys, values = inputs(heads, kv_heads, dim, earlier, tokens)
    want = sdpa(q, keys, values, scale)
    for path in (prompt_attention.causal_attention, prompt_attention.matmul_attention):
        got = path(q, keys, values, scale)
        assert got.shape == (tokens, heads * dim)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("isa", native.runnable_isas())
@pytest.mark.parametrize(("heads", "kv_heads", "dim", "earlier", "tokens"), SHAPES)
def test_the_native_kernel_equals_sdpa_on_every_isa_path(
    isa, heads, kv_heads, dim, earlier, tokens
):
    q, keys, values = inputs(heads, kv_heads, dim, earlier, tokens, dim_v=dim + 16)
    got = kernel_attention(isa, q, keys, values, 0.3)
    torch.testing.assert_close(got, sdpa(q, keys, values, 0.3), rtol=1e-5, atol=1e-4)


WINDOWED = [  # heads, KV heads, head size, earlier cells, tokens, window
    (4, 1, 256, 512, 512, 512),  # Gemma 3's local layers: a second batch of 512 tokens
    (9, 3, 64, 100, 150, 64),  # windows that are not whole blocks or tiles
    (6, 2, 40, 0, 70, 5),
    (4, 2, 32, 30, 40, 1),  # each token sees itself alone
    (4, 2, 32, 30, 40, 500),  # wider than every token's cells: plain causal
]


@pytest.mark.parametrize("isa", native.runnable_isas())
@pytest.mark.parametrize(("heads", "kv_heads", "dim", "earlier", "tokens", "window"), WINDOWED)
def test_the_native_kernel_takes_a_sliding_window_on_every_isa_path(
    isa, heads, kv_heads, dim, earlier, tokens, window
):
    q, keys, values = inputs(heads, kv_heads, dim, earlier, tokens, dim_v=dim + 8)
    got = kernel_attention(isa, q, keys, values, 0.3, window)
    torch.testing.assert_close(got, sdpa(q, keys, values, 0.3, window), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("isa", native.runnable_isas())
def test_the_running_softmax_holds_scores_far_apart(isa):
    # scores in the hundreds, rising along the cells: each block's maximum outgrows the last
    # one's, so every row rescales what it has summed (exp of the old maximum's distance)
    q, keys, values = inputs(5, 1, 64, 30, 70)
    keys = keys + torch.linspace(0, 3, keys.shape[1])[None, :, None]
    got = kernel_attention(isa, q * 8, keys, values, 1.0)
    torch.testing.assert_close(got, sdpa(q * 8, keys, values, 1.0), rtol=1e-5, atol=1e-4)
    assert torch.isfinite(got).all()


@pytest.mark.skipif(not native.available(), reason="no native kernels")
def test_the_native_kernel_refuses_bad_shapes():
    kern = native.kernels()
    q, keys, values = inputs(4, 2, 16, 0, 8)
    out = torch.empty(8, 64)

    def call(tokens, heads, kv_heads, cells, window=0):
        return kern.prompt_attend(
            q.data_ptr(), tokens, heads, 16, keys.data_ptr(), values.data_ptr(), kv_heads,
            cells, 16, ctypes.c_float(1.0), window, out.data_ptr(),
        )  # fmt: skip

    assert call(8, 4, 2, 8) == 0
    assert call(8, 4, 2, 8, window=-1) == -2  # a window is at least 1 cell (0: none)
    assert call(8, 4, 2, 7) == -2  # fewer cells than tokens
    assert call(8, 4, 3, 8) == -2  # heads not a multiple of the KV heads
    assert call(0, 4, 2, 8) == -2


@pytest.fixture(params=[True, False], ids=["intel", "amd"])
def intel(request, monkeypatch):
    """The cell limit as chosen on an Intel CPU, and on another"""
    monkeypatch.setattr(native, "cpu_is_intel", lambda: request.param)
    prompt_attention.native_kv_bytes.cache_clear()
    yield request.param
    prompt_attention.native_kv_bytes.cache_clear()


def test_x86_paths_take_the_native_kernel_up_to_its_cells(monkeypatch, intel):
    kern = native.usable_kernels()
    native_path = kern is not None and kern.isa in {"avx2", "avxvnni", "avx512", "amx"}
    wide = native_path and kern is not None and kern.isa in {"avx512", "amx"}
    cells, limit = prompt_attention.NATIVE_CELLS, prompt_attention.native_kv_bytes()
    assert (limit is not None) == intel
    # up to NATIVE_CELLS on every x86 path, whatever the heads' size
    q, keys, values = inputs(4, 2, 16, cells - 8, 8)
    assert (prompt_attention.native_attention(q, keys, values, 0.5) is not None) == native_path
    assert prompt_attention.native_runs(cells, 1024) == native_path
    # past it, on AVX-512's paths alone: on Intel's CPUs while a KV head's keys and values fit
    # half the L2, on others at any length
    q, keys, values = inputs(4, 2, 16, cells - 7, 8)  # one cell more, 128 bytes a cell
    assert (prompt_attention.native_attention(q, keys, values, 0.5) is not None) == wide
    if limit is None:
        assert prompt_attention.native_runs(65536, 1024) == wide
    else:
        assert not prompt_attention.native_runs(cells + 1, limit // 4 // (cells + 1) + 1)
        assert prompt_attention.native_runs(limit // 128, 32) == wide
        assert not prompt_attention.native_runs(limit // 128 + 1, 32)
    monkeypatch.setattr(prompt_attention, "matmul_attention", None)  # never reached there
    if native_path:
        q, keys, values = inputs(4, 2, 16, 3, 8)
        prompt_attention.causal_attention(q, keys, values, 0.5)


@pytest.mark.parametrize(
    ("size", "limit"),
    [("2048K", 1 << 20), ("1M\n", 1 << 19), ("512K", 1 << 18), ("", 1 << 20), ("big", 1 << 20)],
)
def test_the_kv_limit_is_half_the_l2_cache(size, limit):
    assert prompt_attention.NATIVE_KV_BYTES == 1 << 20  # where the size cannot be read
    assert prompt_attention.half_of_cache(size) == limit


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
        prompt_attention.matmul_attention(q, keys, keys, 0.25)
    assert shapes
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


def test_a_prompt_past_a_sliding_window_takes_the_band(monkeypatch):
    # a second batch of one sequence past a window of 48: the cache's cells come out of order
    # (a freed early cell is taken again), yet each token sees its last 48 positions; the
    # native kernel takes them in order of position where its path has the band, else SDPA
    # under the mask: the same attention either way
    windows = []
    real = prompt_attention.native_attention

    def spy(q, keys, values, scale, window=0):
        out = real(q, keys, values, scale, window)
        if window and out is not None:
            windows.append(window)
        return out

    monkeypatch.setattr(prompt_attention, "native_attention", spy)
    cache = CausalCache(window=48)
    cache.init(max_sequences=1, capacity=200, max_batch=40)
    cache.set_layer(0)
    g = torch.Generator().manual_seed(2)
    seen_k, seen_v = [], []
    for start in (0, 40, 80):
        cache.start_forward(Batch.single(list(range(start, start + 40)), start))
        q, k, v = (torch.randn(40, n, 64, generator=g) for n in (6, 2, 2))
        seen_k.append(k)
        seen_v.append(v)
        got = attention_module.attention(q, k, v, cache, scale=0.2)
    band = cache.sliding_band()
    assert band is not None and band[1] == 48
    # the last batch's first token (80) sees positions 33 on: every cell from there, in order
    keys, values = (torch.cat(kv)[33:].transpose(0, 1) for kv in (seen_k, seen_v))
    want = sdpa(q, keys, values, 0.2, window=48)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    kern = native.usable_kernels()
    assert bool(windows) == (kern is not None and kern.isa in {"avx512", "amx"})
