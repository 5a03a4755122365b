"""Dequantization against gguf-py's, bit for bit: quantized data, random blocks, real files."""

import warnings

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT
from quant_data import F16_FIELDS, QUANTIZABLE, gguf_reference, quantized, random_blocks

from ember.backend.quant import (
    QuantError,
    UnsupportedTypeError,
    dequantize,
    dequantize_rows,
    int4_codes,
    int4_planes,
    is_supported,
)
from ember.errors import EmberError
from ember.gguf import BLOCK_SIZES, GGMLType, GGUFFile


@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda t: t.name)
def test_dequantize_matches_gguf_on_quantized_data(qtype: QT) -> None:
    raw = quantized(qtype, (6, 256))
    got = dequantize(raw, qtype, (6, 256))
    assert got.dtype == torch.float32
    assert torch.equal(got, gguf_reference(raw, qtype, (6, 256)))


@pytest.mark.parametrize("qtype", list(F16_FIELDS), ids=lambda t: t.name)
def test_dequantize_matches_gguf_on_random_blocks(qtype: QT) -> None:
    raw = random_blocks(qtype, (8, 512))
    assert torch.equal(dequantize(raw, qtype, (8, 512)), gguf_reference(raw, qtype, (8, 512)))


def test_dequantize_keeps_any_shape() -> None:
    raw = quantized(QT.Q8_0, (4, 64))
    flat = gguf_reference(raw, QT.Q8_0, (4, 64))
    assert torch.equal(dequantize(raw, QT.Q8_0, (2, 2, 64)), flat.reshape(2, 2, 64))
    assert torch.equal(dequantize(raw, QT.Q8_0, (256,)), flat.reshape(256))


def test_dequantize_takes_a_read_only_map_and_a_torch_tensor() -> None:
    raw = random_blocks(QT.Q4_K, (2, 256))
    ref = gguf_reference(raw, QT.Q4_K, (2, 256))
    frozen = raw.copy()
    frozen.setflags(write=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "non-writable array" warning from torch
        assert torch.equal(dequantize(frozen, GGMLType.Q4_K, (2, 256)), ref)
    assert torch.equal(dequantize(torch.from_numpy(raw), GGMLType.Q4_K, (2, 256)), ref)


@pytest.mark.parametrize("qtype", [QT.F32, QT.F16, QT.Q4_0, QT.Q8_0, QT.Q4_K, QT.Q6_K])
def test_dequantize_rows_equals_rows_of_the_table(qtype: QT) -> None:
    raw = quantized(qtype, (10, 256)) if qtype in QUANTIZABLE else random_blocks(qtype, (10, 256))
    table = dequantize(raw, qtype, (10, 256))
    ids = torch.tensor([9, 0, 3, 3, 7])
    assert torch.equal(dequantize_rows(raw, qtype, (10, 256), ids), table[ids])
    assert dequantize_rows(raw, qtype, (10, 256), ids[:0]).shape == (0, 256)


def test_dequantize_rows_rejects_ids_outside_the_table() -> None:
    raw = quantized(QT.Q8_0, (4, 32))
    for bad in (4, -1):
        with pytest.raises(QuantError, match="out of range"):
            dequantize_rows(raw, QT.Q8_0, (4, 32), torch.tensor([0, bad]))


def test_unsupported_types_raise_a_named_error() -> None:
    assert not is_supported(GGMLType.IQ2_XXS)
    block_elems, block_bytes = BLOCK_SIZES[GGMLType.IQ2_XXS]
    with pytest.raises(UnsupportedTypeError, match="IQ2_XXS") as err:
        dequantize(np.zeros(block_bytes, np.uint8), GGMLType.IQ2_XXS, (block_elems,))
    assert isinstance(err.value, EmberError)
    with pytest.raises(UnsupportedTypeError):
        dequantize(np.zeros(4, np.uint8), 99, (1,))


def test_wrong_sizes_raise_quant_errors() -> None:
    raw = quantized(QT.Q4_0, (2, 64))
    with pytest.raises(QuantError, match="bytes"):
        dequantize(raw[:-1], QT.Q4_0, (2, 64))
    with pytest.raises(QuantError, match="whole 32"):
        dequantize(raw, QT.Q4_0, (4, 24))
    with pytest.raises(QuantError, match="uint8"):
        dequantize(raw.view(np.int8), QT.Q4_0, (2, 64))


@pytest.mark.parametrize(
    ("qtype", "num_planes"),
    [(QT.Q4_0, 1), (QT.Q4_1, 1), (QT.Q4_K, 1), (QT.Q5_0, 2), (QT.Q5_1, 2), (QT.Q8_0, 2)],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_int4_codes_rebuild_the_weights(qtype: QT, num_planes: int) -> None:
    raw = random_blocks(qtype, (4, 512))
    codes, scales, zeros = int4_codes(raw, qtype, (4, 512))
    assert int4_planes(qtype) == num_planes
    assert codes.shape == (4, num_planes * 512)
    assert scales.shape == zeros.shape == (4, num_planes * 16)
    assert int(codes.min()) >= 0 and int(codes.max()) <= 15
    scale, zero = scales.repeat_interleave(32, 1), zeros.repeat_interleave(32, 1)
    per_plane = (codes.float() - 8) * scale + zero
    rebuilt = per_plane.view(4, num_planes, 512).sum(1)
    ref = dequantize(raw, qtype, (4, 512))
    if qtype in (QT.Q4_0, QT.Q5_0, QT.Q8_0):
        assert torch.equal(rebuilt, ref)
    else:  # the same affine map regrouped: a few float32 roundings apart
        step = scales[:, :16].abs().repeat_interleave(32, 1)
        assert ((rebuilt - ref).abs() <= 1e-5 * (step + ref.abs())).all()


def test_int4_codes_refuse_other_types() -> None:
    with pytest.raises(UnsupportedTypeError, match="Q6_K"):
        int4_codes(random_blocks(QT.Q6_K, (1, 256)), QT.Q6_K, (1, 256))
    with pytest.raises(UnsupportedTypeError):
        int4_planes(GGMLType.F32)


def real_tensors_by_type(path: str) -> dict[GGMLType, str]:
    """The first tensor of each type in a GGUF file."""
    with GGUFFile.open(path) as f:
        first: dict[GGMLType, str] = {}
        for info in f.tensors.values():
            first.setdefault(info.ggml_type, info.name)
        return first


def check_real_file(path: str, expected_types: set[GGMLType]) -> None:
    names = real_tensors_by_type(path)
    assert set(names) == expected_types
    with GGUFFile.open(path) as f:
        for qtype, name in names.items():
            info = f.tensors[name]
            raw = f.raw(name)
            rows = info.shape[0] if len(info.shape) == 2 else 1
            cols = info.shape[-1]
            if rows > 4096:  # big tables: the first rows are enough for the format
                rows = 4096
                raw = raw[: rows * len(raw) // info.shape[0]]
            ref = gguf_reference(raw, QT(int(qtype)), (rows, cols))
            assert torch.equal(dequantize(raw, qtype, (rows, cols)), ref), name


@pytest.mark.model
def test_real_smollm2_tensors_match_gguf(smollm2_path: str) -> None:
    check_real_file(smollm2_path, {GGMLType.F32, GGMLType.Q4_1, GGMLType.Q8_0})


@pytest.mark.model
def test_real_gemma3_tensors_match_gguf(gemma3_path: str) -> None:
    types = {GGMLType.F32, GGMLType.Q5_0, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K}
    check_real_file(gemma3_path, types)
