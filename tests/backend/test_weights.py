"""Linear and embedding weights: kernels against the exact dequantized matmul, fusion, lookup."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from quant_data import quantized, random_blocks

from ember.backend.quant import QuantError, dequantize
from ember.backend.weights import EmbeddingWeight, LinearWeight, concat_linear
from ember.gguf import GGUFFile

# bf16 keeps 8 significant bits: the int4 kernel rounds x, scales/zeros and y to it.
BF16_EPS = 2.0**-8


def q4(qtype: QT, shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    return random_blocks(qtype, shape, seed) if qtype == QT.Q4_K else quantized(qtype, shape, seed)


def exact(raw: np.ndarray, qtype: QT, shape: tuple[int, int], x: torch.Tensor) -> torch.Tensor:
    """x @ W^T in float64 with W dequantized exactly."""
    return x.double() @ dequantize(raw, qtype, shape).double().t()


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_1, QT.Q4_K], ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 7])
def test_int4_matmul_matches_the_exact_product(qtype: QT, rows: int) -> None:
    shape = (192, 512)
    raw = q4(qtype, shape)
    w = LinearWeight.from_gguf(raw, qtype, shape)
    assert (w.kind, w.out_features, w.in_features) == ("int4", 192, 512)
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(1))
    y = w(x)
    assert y.dtype == torch.float32 and y.shape == (rows, 192)
    # Measured: 1.5e-3 to 3e-3 of the largest output.
    assert relative_error(y, exact(raw, qtype, shape, x)) < 2 * BF16_EPS
    # Against the weights the kernel holds: only bf16 rounding of x and of each output is left.
    held = x.to(torch.bfloat16).double() @ w.dequantize().double().t()
    assert ((y.double() - held).abs() <= BF16_EPS * held.abs() + 1e-6).all()


@pytest.mark.parametrize("qtype", [QT.Q4_0, QT.Q4_K], ids=lambda t: t.name)
def test_int4_dequantize_is_the_weight_up_to_bf16_scales(qtype: QT) -> None:
    shape = (64, 256)
    raw = q4(qtype, shape)
    want = dequantize(raw, qtype, shape)
    got = LinearWeight.from_gguf(raw, qtype, shape).dequantize()
    step = want.abs().reshape(64, 8, 32).amax(-1, keepdim=True).expand(64, 8, 32).reshape(shape)
    assert ((got - want).abs() <= 2 * BF16_EPS * step).all()


def test_int4_packing_in_chunks_keeps_every_row() -> None:
    # 4096 + 64 + 16 rows: two load chunks, the last with a partial 64-row pack block.
    shape = (4176, 64)
    raw = quantized(QT.Q4_0, shape)
    w = LinearWeight.from_gguf(raw, QT.Q4_0, shape)
    want = dequantize(raw, QT.Q4_0, shape)
    assert ((w.dequantize() - want).abs() <= BF16_EPS * want.abs().amax(1, keepdim=True)).all()


@pytest.mark.parametrize("qtype", [QT.F32, QT.F16, QT.Q8_0, QT.Q5_0, QT.Q6_K], ids=lambda t: t.name)
def test_other_types_are_exact_fp32(qtype: QT) -> None:
    shape = (48, 256)
    raw = random_blocks(qtype, shape) if qtype == QT.Q6_K else quantized(qtype, shape)
    w = LinearWeight.from_gguf(raw, qtype, shape)
    assert w.kind == "f32" and w.nbytes == 48 * 256 * 4
    assert torch.equal(w.dequantize(), dequantize(raw, qtype, shape))
    x = torch.randn(3, 256)
    assert relative_error(w(x), exact(raw, qtype, shape, x)) < 1e-6


def test_use_int4_false_and_odd_row_counts_give_fp32() -> None:
    raw = quantized(QT.Q4_0, (64, 64))
    assert LinearWeight.from_gguf(raw, QT.Q4_0, (64, 64), use_int4=False).kind == "f32"
    odd = quantized(QT.Q4_0, (40, 64))  # the kernel packs 16 rows at a time
    w = LinearWeight.from_gguf(odd, QT.Q4_0, (40, 64))
    assert w.kind == "f32"
    assert torch.equal(w.dequantize(), dequantize(odd, QT.Q4_0, (40, 64)))


def test_int4_memory_and_leading_dims() -> None:
    raw = quantized(QT.Q4_1, (128, 256))
    w = LinearWeight.from_gguf(raw, QT.Q4_1, (128, 256))
    assert w.nbytes == 128 * 256 // 2 + (256 // 32) * 128 * 2 * 2  # codes + bf16 scale/zero
    x = torch.randn(2, 3, 256)
    assert torch.equal(w(x), w(x.reshape(6, 256)).reshape(2, 3, 128))


@pytest.mark.parametrize("qtype", [QT.Q5_0, QT.Q5_1, QT.Q8_0], ids=lambda t: t.name)
def test_int4_planes_for_five_and_eight_bit_types(qtype: QT) -> None:
    shape = (128, 256)
    raw = quantized(qtype, shape)
    w = LinearWeight.from_gguf(raw, qtype, shape, use_int4_planes=True)
    assert (w.kind, w.out_features, w.in_features) == ("int4x2", 128, 256)
    assert w.nbytes == 128 * 256 + 2 * (256 // 32) * 128 * 2 * 2  # 1.25 bytes a weight
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(2))
    want = exact(raw, qtype, shape, x)
    assert relative_error(w(x), want) < 2 * BF16_EPS
    held = w.dequantize()
    assert relative_error(held.double(), dequantize(raw, qtype, shape).double()) < 2 * BF16_EPS
    parts = [
        w,
        LinearWeight.from_gguf(
            quantized(qtype, (64, 256), 1), qtype, (64, 256), use_int4_planes=True
        ),
    ]
    fused = concat_linear(parts)
    assert fused.kind == "int4x2"
    assert torch.equal(fused(x), torch.cat([p(x) for p in parts], dim=-1))


def test_concat_of_one_and_two_plane_parts_falls_back_to_fp32() -> None:
    one = LinearWeight.from_gguf(quantized(QT.Q4_0, (64, 64)), QT.Q4_0, (64, 64))
    two = LinearWeight.from_gguf(
        quantized(QT.Q8_0, (64, 64)), QT.Q8_0, (64, 64), use_int4_planes=True
    )
    assert concat_linear([one, two]).kind == "f32"


def test_linear_rejects_a_non_matrix() -> None:
    with pytest.raises(QuantError, match="2-D"):
        LinearWeight.from_gguf(quantized(QT.Q8_0, (1, 64)), QT.Q8_0, (64,))


def test_concat_of_int4_parts_stays_int4_and_equals_separate_calls() -> None:
    shapes = [(576, 576), (192, 576), (192, 576)]  # SmolLM2's q, k, v
    parts = [LinearWeight.from_gguf(q4(QT.Q4_1, s, i), QT.Q4_1, s) for i, s in enumerate(shapes)]
    fused = concat_linear(parts)
    assert (fused.kind, fused.out_features) == ("int4", 960)
    assert fused.nbytes == sum(p.nbytes for p in parts)
    x = torch.randn(5, 576)
    assert torch.equal(fused(x), torch.cat([p(x) for p in parts], dim=-1))


def test_concat_of_mixed_parts_falls_back_to_fp32() -> None:
    int4 = LinearWeight.from_gguf(quantized(QT.Q4_0, (64, 256)), QT.Q4_0, (64, 256))
    dense_raw = quantized(QT.Q8_0, (32, 256), seed=1)
    dense = LinearWeight.from_gguf(dense_raw, QT.Q8_0, (32, 256))
    fused = concat_linear([int4, dense])
    assert fused.kind == "f32"
    dense_weights = dequantize(dense_raw, QT.Q8_0, (32, 256))
    assert torch.equal(fused.dequantize(), torch.cat([int4.dequantize(), dense_weights]))
    x = torch.randn(4, 256)
    y = fused(x)
    assert relative_error(y[:, 64:], x.double() @ dense_weights.double().t()) < 1e-6
    assert relative_error(y[:, :64], int4(x).double()) < 2 * BF16_EPS


def test_concat_packs_apart_only_at_64_row_boundaries() -> None:
    a = LinearWeight.from_gguf(quantized(QT.Q4_0, (48, 64)), QT.Q4_0, (48, 64))
    b = LinearWeight.from_gguf(quantized(QT.Q4_0, (64, 64), seed=1), QT.Q4_0, (64, 64))
    assert concat_linear([a, b]).kind == "f32"
    assert concat_linear([b, a]).kind == "int4"
    x = torch.randn(2, 64)
    assert torch.equal(concat_linear([b, a])(x), torch.cat([b(x), a(x)], dim=-1))
    with pytest.raises(QuantError):
        concat_linear([])


@pytest.mark.parametrize("qtype", [QT.F32, QT.F16, QT.Q8_0, QT.Q4_K], ids=lambda t: t.name)
def test_embedding_lookup_equals_rows_of_the_table(qtype: QT) -> None:
    shape = (100, 256)
    raw = random_blocks(qtype, shape) if qtype == QT.Q4_K else quantized(qtype, shape)
    emb = EmbeddingWeight.from_gguf(raw, qtype, shape)
    ids = torch.tensor([5, 99, 0, 5])
    assert torch.equal(emb.lookup(ids), dequantize(raw, qtype, shape)[ids])
    assert emb.nbytes == raw.nbytes  # still quantized
    with pytest.raises(QuantError):
        emb.lookup(torch.tensor([100]))


def test_embedding_shares_the_file_bytes() -> None:
    raw = quantized(QT.Q8_0, (16, 64))
    emb = EmbeddingWeight.from_gguf(raw, QT.Q8_0, (16, 64))
    raw[:] = 0  # the table is a view of the map, not a copy
    assert torch.equal(emb.lookup(torch.tensor([3])), torch.zeros(1, 64))


def test_embedding_as_linear_for_tied_heads() -> None:
    raw8 = quantized(QT.Q8_0, (64, 128))
    head = EmbeddingWeight.from_gguf(raw8, QT.Q8_0, (64, 128)).as_linear()
    assert head.kind == "f32"
    assert torch.equal(head.dequantize(), dequantize(raw8, QT.Q8_0, (64, 128)))
    planes = EmbeddingWeight.from_gguf(raw8, QT.Q8_0, (64, 128)).as_linear(use_int4_planes=True)
    assert planes.kind == "int4x2"
    raw4 = quantized(QT.Q4_0, (64, 128))
    assert EmbeddingWeight.from_gguf(raw4, QT.Q4_0, (64, 128)).as_linear().kind == "int4"


def test_embedding_rejects_a_bad_table() -> None:
    with pytest.raises(QuantError):
        EmbeddingWeight.from_gguf(quantized(QT.Q8_0, (4, 64)), QT.Q8_0, (5, 64))


@pytest.mark.model
def test_real_smollm2_layer_int4_against_exact(smollm2_path: str) -> None:
    with GGUFFile.open(smollm2_path) as f:
        info = f.tensors["blk.0.ffn_gate.weight"]  # Q4_1 (1536, 576)
        raw = f.raw(info.name)
        w = LinearWeight.from_gguf(raw, info.ggml_type, info.shape)
        x = torch.randn(4, 576, generator=torch.Generator().manual_seed(0))
        assert w.kind == "int4"
        # Measured 4.1e-3: bf16 rounding of x, of scales/zeros and of y add about equally.
        want = exact(raw, QT(int(info.ggml_type)), info.shape, x)
        assert relative_error(w(x), want) < 2 * BF16_EPS
        emb_info = f.tensors["token_embd.weight"]
        emb = EmbeddingWeight.from_gguf(f.raw(emb_info.name), emb_info.ggml_type, emb_info.shape)
        ids = torch.tensor([1, 2, 49151])
        full = dequantize(f.raw(emb_info.name), emb_info.ggml_type, emb_info.shape)
        assert torch.equal(emb.lookup(ids), full[ids])
