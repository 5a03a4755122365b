"""The native block kernels against gguf-py's dequantization and a float64 matmul."""

import gguf
import numpy as np
import pytest
import torch

from ember.backend import native
from ember.backend.native import NativeLinear

TYPES = {
    2: gguf.GGMLQuantizationType.Q4_0,
    3: gguf.GGMLQuantizationType.Q4_1,
    6: gguf.GGMLQuantizationType.Q5_0,
    8: gguf.GGMLQuantizationType.Q8_0,
}

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler here")


def quantized(ggml_type: int, out_features: int, in_features: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((out_features, in_features), dtype=np.float32)
    raw = gguf.quants.quantize(w, TYPES[ggml_type])
    exact = gguf.quants.dequantize(raw, TYPES[ggml_type])
    return torch.from_numpy(raw.reshape(-1).copy()), torch.from_numpy(exact.astype(np.float32))


@pytest.mark.parametrize("ggml_type", sorted(TYPES))
def test_dequant_is_bit_exact(ggml_type):
    raw, exact = quantized(ggml_type, 40, 96)
    assert torch.equal(native.dequant(ggml_type, raw, 40, 96), exact)


@pytest.mark.parametrize("ggml_type", sorted(TYPES))
@pytest.mark.parametrize("rows", [0, 1, 3, 8, 9, 20])
def test_matmul_equals_float64_reference(ggml_type, rows):
    raw, exact = quantized(ggml_type, 72, 128, seed=rows)
    x = torch.randn(rows, 128)
    ours = NativeLinear(raw, ggml_type, 72, 128)(x)
    reference = (x.double() @ exact.double().t()).float()
    assert ours.shape == (rows, 72)
    if rows:
        assert (ours - reference).abs().max() <= 1e-5 * reference.abs().max()


@pytest.mark.parametrize("ggml_type", sorted(TYPES))
def test_a_row_does_not_depend_on_its_batch(ggml_type):
    raw, _ = quantized(ggml_type, 64, 160)
    x = torch.randn(6, 160)
    batched = native.qmatmul(ggml_type, raw, x, 64)
    alone = torch.cat([native.qmatmul(ggml_type, raw, x[i : i + 1], 64) for i in range(6)])
    assert torch.equal(batched, alone)


def test_concat_stacks_outputs():
    (a, ea), (b, eb) = quantized(3, 32, 64, 1), quantized(3, 16, 64, 2)
    fused = NativeLinear.concat([NativeLinear(a, 3, 32, 64), NativeLinear(b, 3, 16, 64)])
    assert fused.out_features == 48
    assert torch.equal(fused.dequantize(), torch.cat([ea, eb]))


def test_unknown_type_is_refused():
    with pytest.raises(ValueError):
        NativeLinear.concat(
            [
                NativeLinear(torch.zeros(18, dtype=torch.uint8), 2, 1, 32),
                NativeLinear(torch.zeros(34, dtype=torch.uint8), 8, 1, 32),
            ]
        )
