"""Linear and embedding weights: every type kept as its blocks, the torch path against the exact
dequantized matmul, fusion, lookup. (The native kernels: test_native.py.)"""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from quant_data import quantized, random_blocks

from ember.backend.embedding import NATIVE_LOOKUP_ROWS, EmbeddingWeight
from ember.backend.quant import QuantError, dequantize
from ember.backend.weights import (
    FusedLinear,
    LinearWeight,
    NativeLinear,
    concat_linear,
    expert_linears,
    linear_from_gguf,
)
from ember.gguf import GGUFFile

K_TYPES = [QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_XS]
ALL_TYPES = [QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.IQ4_NL, *K_TYPES]


def blocks(qtype: QT, shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    if qtype in K_TYPES or qtype == QT.IQ4_NL:
        return random_blocks(qtype, shape, seed)
    return quantized(qtype, shape, seed)


def exact(raw: np.ndarray, qtype: QT, shape: tuple[int, int], x: torch.Tensor) -> torch.Tensor:
    """x @ W^T in float64 with W dequantized exactly."""
    return x.double() @ dequantize(raw, qtype, shape).double().t()


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_every_type_stays_blocks(qtype: QT) -> None:
    shape = (48, 512)
    raw = blocks(qtype, shape)
    w = linear_from_gguf(raw, qtype, shape)
    assert isinstance(w, NativeLinear) and w.kind == qtype.name.lower()
    assert w.nbytes == raw.nbytes
    raw_view = w.raw.numpy()
    assert np.shares_memory(raw_view, raw)  # the caller's bytes (the file's map), not a copy
    assert torch.equal(w.dequantize(), dequantize(raw, qtype, shape))
    x = torch.randn(20, 512)  # a prompt's rows: gemm16 (x in int16) where it runs, else float32
    tolerance = 1e-4 if w.takes_int16(20) else 1e-5
    assert relative_error(w(x), exact(raw, qtype, shape, x)) < tolerance
    assert w(torch.zeros(0, 512)).shape == (0, 48)


@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q6_K, QT.Q8_0], ids=lambda t: t.name)
def test_torch_path_is_exact(qtype: QT) -> None:
    shape = (40, 256)
    raw = blocks(qtype, shape)
    w = NativeLinear(raw, qtype, *shape, kernels=False)
    x = torch.randn(3, 256)
    assert relative_error(w(x), exact(raw, qtype, shape, x)) < 1e-5


@pytest.mark.parametrize("kernels", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q5_0], ids=lambda t: t.name)
def test_prefill_dequantizes_in_chunks_of_one_buffer(monkeypatch, qtype: QT, kernels) -> None:
    """Many rows of x take the weight in chunks (the last one shorter), each dequantized into
    the same buffer: the product is still the exact one."""
    monkeypatch.setattr("ember.backend.weights.CHUNK_ROWS", 7)
    monkeypatch.setattr("ember.backend.weights.gemm16_prefill", lambda isa, ggml_type: False)
    shape = (48, 256)
    raw = blocks(qtype, shape)
    w = NativeLinear(raw, qtype, *shape, kernels=kernels)
    x = torch.randn(40, 256)
    assert relative_error(w(x), exact(raw, qtype, shape, x)) < 1e-5
    buffer = torch.full((9, 256), float("nan"))
    assert w.dequantize(3, 12, out=buffer) is buffer
    assert torch.equal(buffer, dequantize(raw, qtype, shape)[3:12])


def test_f32_is_dense() -> None:
    raw = quantized(QT.F32, (48, 256))
    w = linear_from_gguf(raw, QT.F32, (48, 256))
    assert isinstance(w, LinearWeight) and w.kind == "f32" and w.nbytes == 48 * 256 * 4
    x = torch.randn(2, 3, 256)
    assert torch.equal(w(x), w(x.reshape(6, 256)).reshape(2, 3, 48))


def test_linear_rejects_a_non_matrix_and_wrong_sizes() -> None:
    with pytest.raises(QuantError, match="2-D"):
        linear_from_gguf(quantized(QT.Q8_0, (1, 64)), QT.Q8_0, (64,))
    with pytest.raises(QuantError, match="bytes"):
        NativeLinear(quantized(QT.Q8_0, (2, 64)), QT.Q8_0, 3, 64)


def test_concat_of_one_type_is_stacked_blocks() -> None:
    shapes = [(576, 576), (192, 576), (192, 576)]  # SmolLM2's q, k, v
    parts = [linear_from_gguf(blocks(QT.Q4_1, s, i), QT.Q4_1, s) for i, s in enumerate(shapes)]
    fused = concat_linear(parts)
    assert isinstance(fused, NativeLinear) and (fused.kind, fused.out_features) == ("q4_1", 960)
    assert fused.nbytes == sum(p.nbytes for p in parts)
    for rows in (1, 5, 30):
        x = torch.randn(rows, 576)
        assert torch.equal(fused(x), torch.cat([p(x) for p in parts], dim=-1))


def test_concat_of_mixed_types_keeps_the_parts() -> None:
    a = linear_from_gguf(blocks(QT.Q4_K, (64, 256)), QT.Q4_K, (64, 256))
    b = linear_from_gguf(blocks(QT.Q6_K, (32, 256), 1), QT.Q6_K, (32, 256))
    fused = concat_linear([a, b])
    assert isinstance(fused, FusedLinear) and fused.nbytes == a.nbytes + b.nbytes
    for rows in (4, 40):  # decode's kernels, a prompt's (x quantized once for both parts)
        x = torch.randn(2, rows // 2, 256)
        assert torch.equal(fused(x), torch.cat([a(x), b(x)], dim=-1))
    assert torch.equal(fused.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    f32 = linear_from_gguf(quantized(QT.F32, (16, 256)), QT.F32, (16, 256))
    x = torch.randn(40, 256)  # a dense part beside them
    assert torch.equal(concat_linear([a, f32, b])(x), torch.cat([a(x), f32(x), b(x)], dim=-1))
    with pytest.raises(QuantError):
        concat_linear([])


@pytest.mark.parametrize("isa", [None, "generic"])
@pytest.mark.parametrize(
    "qtype",
    [QT.F32, QT.F16, QT.BF16, QT.Q4_1, QT.Q5_0, QT.Q8_0, QT.Q4_K, QT.Q6_K],
    ids=lambda t: t.name,
)
def test_embedding_lookup_equals_rows_of_the_table(
    qtype: QT, isa: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A few ids (a decode step's: the native rows) and many (a prompt's: torch's decoding)
    give the table's rows bit for bit, on the chosen ISA's kernels and the portable ones."""
    if isa:
        monkeypatch.setenv("EMBER_CPU_ISA", isa)
    shape = (100, 256)
    raw = random_blocks(qtype, shape) if qtype in (QT.Q4_K, QT.Q6_K) else quantized(qtype, shape)
    emb = EmbeddingWeight.from_gguf(raw, qtype, shape)
    table = dequantize(raw, qtype, shape)
    for ids in (torch.tensor([5, 99, 0, 5]), torch.arange(NATIVE_LOOKUP_ROWS + 1) % 100):
        assert torch.equal(emb.lookup(ids), table[ids])
    assert emb.nbytes == raw.nbytes  # still quantized
    for bad in ([100], [-1], [3, 100]):
        with pytest.raises(QuantError):
            emb.lookup(torch.tensor(bad))


def test_embedding_shares_the_file_bytes() -> None:
    raw = quantized(QT.Q8_0, (16, 64))
    emb = EmbeddingWeight.from_gguf(raw, QT.Q8_0, (16, 64))
    raw[:] = 0  # the table is a view of the map, not a copy
    assert torch.equal(emb.lookup(torch.tensor([3])), torch.zeros(1, 64))


def test_embedding_as_linear_for_tied_heads() -> None:
    raw8 = quantized(QT.Q8_0, (64, 128))
    head = EmbeddingWeight.from_gguf(raw8, QT.Q8_0, (64, 128)).as_linear()
    assert isinstance(head, NativeLinear) and head.kind == "q8_0"
    assert torch.equal(head.dequantize(), dequantize(raw8, QT.Q8_0, (64, 128)))
    raw8[:] = 0  # the head shares the table's bytes
    assert torch.equal(head.dequantize(), torch.zeros(64, 128))


def test_embedding_rejects_a_bad_table() -> None:
    with pytest.raises(QuantError):
        EmbeddingWeight.from_gguf(quantized(QT.Q8_0, (4, 64)), QT.Q8_0, (5, 64))


@pytest.mark.model
def test_real_smollm2_layer_stays_blocks(smollm2_path: str) -> None:
    with GGUFFile.open(smollm2_path) as f:
        info = f.tensors["blk.0.ffn_gate.weight"]  # Q4_1 (1536, 576)
        raw = f.raw(info.name)
        w = linear_from_gguf(raw, info.ggml_type, info.shape)
        assert w.kind == "q4_1" and w.nbytes == raw.nbytes
        x = torch.randn(4, 576, generator=torch.Generator().manual_seed(0))
        want = exact(raw, QT(int(info.ggml_type)), info.shape, x)
        assert relative_error(w(x), want) < 2e-2  # int8 activations on the native path
        x = torch.randn(40, 576, generator=torch.Generator().manual_seed(0))  # a prompt's rows
        tolerance = 1e-4 if w.takes_int16(40) else 1e-5  # gemm16 (x in int16), or float32
        assert relative_error(w(x), exact(raw, QT(int(info.ggml_type)), info.shape, x)) < tolerance
        emb_info = f.tensors["token_embd.weight"]
        emb = EmbeddingWeight.from_gguf(f.raw(emb_info.name), emb_info.ggml_type, emb_info.shape)
        ids = torch.tensor([1, 2, 49151])
        full = dequantize(f.raw(emb_info.name), emb_info.ggml_type, emb_info.shape)
        assert torch.equal(emb.lookup(ids), full[ids])


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q4_K, QT.MXFP4, QT.F32], ids=lambda t: t.name)
def test_expert_stacks_split_into_views_of_each_experts_blocks(qtype: QT) -> None:
    """A 3-D stack (experts, out, in) becomes one weight per expert over its own slice of the
    bytes: no copy for block types (F32 is expanded, as every F32 weight), the same values."""
    shape = (3, 8, 256)
    raw = quantized(qtype, (24, 256)) if qtype != QT.Q4_K else random_blocks(qtype, (24, 256))
    experts = expert_linears(raw, qtype, shape)
    whole = dequantize(raw, qtype, shape)
    for e, linear in enumerate(experts):
        assert torch.equal(linear.dequantize(), whole[e])
        if isinstance(linear, NativeLinear):
            assert linear.raw.data_ptr() == raw.ctypes.data + e * raw.nbytes // 3
    with pytest.raises(QuantError, match="3-D"):
        expert_linears(raw, qtype, (24, 256))
