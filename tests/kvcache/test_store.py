"""KV cache types: q8_0 and q4_0 blocks equal gguf-py's encoders byte for byte, every type reads
back within its quantization error, and the cache holds what it is told in the size it says."""

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import quantize as gguf_quantize

from ember.batch import Batch
from ember.kvcache import CausalCache
from ember.kvcache.store import BYTES_PER_VALUE, QK, LayerStore, dequantize, quantize

GGML = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}


def sample(rows: int, dim: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, dim, generator=g) * torch.rand(rows, 1, generator=g) * 4
    x[0, :QK] = 0.0  # an all-zero block: scale 0
    x[1, 5] = 50.0  # an outlier: the rest of its block rounds to few levels
    return x


def as_ggml_blocks(codes: torch.Tensor, scales: torch.Tensor) -> np.ndarray:
    """Our codes and scales in ggml's block layout: f16 scale, then the block's bytes."""
    n = scales.numel()
    d = scales.reshape(n, 1).numpy().view(np.uint8)
    qs = codes.reshape(n, -1).numpy().view(np.uint8)
    return np.concatenate([d, qs], axis=1).reshape(codes.shape[0], -1)


@pytest.mark.parametrize("kind", ["q8_0", "q4_0"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_blocks_equal_gguf_py(kind, seed):
    x = sample(64, 128, seed)
    codes, scales = quantize(kind, x)
    expected = gguf_quantize(x.numpy(), GGML[kind])
    assert np.array_equal(as_ggml_blocks(codes, scales), expected)


@pytest.mark.parametrize(("kind", "bound"), [("q8_0", 0.5 + 2**-5), ("q4_0", 1.0 + 2**-7)])
def test_round_trip_within_a_step_of_the_block_scale(kind, bound):
    x = sample(256, 64, 3)
    codes, scales = quantize(kind, x)
    back = dequantize(kind, codes, scales)
    step = scales.float().abs().repeat_interleave(QK, dim=-1)  # the block's scale d
    assert (back - x).abs().le(step * bound + 1e-12).all()
    assert back[0, :QK].eq(0).all()


@pytest.mark.parametrize(
    ("kind", "tolerance"), [("f32", 0.0), ("f16", 2e-3), ("bf16", 8e-3), ("q8_0", 2e-2)]
)
def test_store_reads_back_what_it_holds(kind, tolerance):
    heads, cells, dim = 2, 10, 64
    store = LayerStore(kind, heads, cells, dim, dim)
    k, v = (
        sample(6 * heads, dim, 4).view(6, heads, dim),
        sample(6 * heads, dim, 5).view(6, heads, dim),
    )
    store.put(torch.tensor([1, 2, 3]), (1, 4), k[:3], v[:3])  # a run of cells
    store.put(torch.tensor([7, 5, 9]), None, k[3:], v[3:])  # scattered cells
    keys, values = store.get(0, cells)
    assert keys.dtype == values.dtype == torch.float32 and keys.shape == (heads, cells, dim)
    order = [1, 2, 3, 7, 5, 9]
    for got, want in ((keys, k), (values, v)):
        err = (got[:, order].transpose(0, 1) - want).abs().max()
        assert err <= tolerance * want.abs().max()
    assert store.nbytes() == 2 * heads * cells * dim * BYTES_PER_VALUE[kind]


def test_q4_0_store_is_an_eighth_of_f32():
    assert LayerStore("q4_0", 2, 10, 64, 64).nbytes() * 64 == 2 * 2 * 10 * 64 * 4 * 9
    assert LayerStore("q8_0", 2, 10, 64, 64).nbytes() * 32 == 2 * 2 * 10 * 64 * 34


def test_head_sizes_that_are_not_blocks_keep_float16():
    store = LayerStore("q4_0", 1, 4, 48, 48)
    assert store.kind == "f16"


def test_cache_type_is_chosen_at_init_and_shifts_through_dequantization():
    cache = CausalCache(shift=lambda layer, k, delta: k + delta[None, :, None])
    cache.init(max_sequences=1, capacity=8, max_batch=8, dtype="q8_0")
    cache.start_forward(Batch.single([1, 2, 3, 4], 0))
    cache.set_layer(0)
    keys = torch.arange(4.0)[:, None, None].expand(4, 1, 32).contiguous()
    cache.put(keys, keys)
    cache.remove(0, 0, 2)  # positions 2 and 3 move to 0 and 1: keys 2, 3 become 0, 1
    k, v, _ = cache.get()
    assert cache.stores[0].kind == "q8_0"
    assert torch.allclose(k[0, 2:4, 0], torch.tensor([0.0, 1.0]), atol=1e-3)
    assert torch.allclose(v[0, 2:4, 0], torch.tensor([2.0, 3.0]), atol=1e-3)
