"""Dequantize ggml tensor bytes to float32 with vectorised torch ops, bit-exact with gguf-py.

Covers F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, IQ4_NL and IQ4_XS, whole
tensors or chosen rows.
Choosing a matmul kernel for a weight is weights.py's business.
"""

import warnings
from collections.abc import Callable

import numpy as np
import torch

from ember.errors import EmberError
from ember.gguf import BLOCK_SIZES, GGMLType


class QuantError(EmberError, ValueError):
    """Tensor bytes that do not fit the given type and shape, or rows out of range."""


class UnsupportedTypeError(EmberError):
    """A ggml tensor type Ember cannot decode (the IQ, TQ and FP4 families, integers ...)."""


_U8 = torch.uint8
_NIBBLE_SHIFTS = torch.tensor([0, 4], dtype=_U8)
_CRUMB_SHIFTS = torch.tensor([0, 2, 4, 6], dtype=_U8)
_BIT_SHIFTS = torch.arange(8, dtype=_U8)


def as_byte_tensor(raw: torch.Tensor | np.ndarray) -> torch.Tensor:
    """`raw` as a flat uint8 tensor, sharing memory with a numpy array (even a read-only map)."""
    if isinstance(raw, np.ndarray):
        if raw.dtype != np.uint8:
            raise QuantError(f"tensor bytes must be uint8, got numpy {raw.dtype}")
        with warnings.catch_warnings():
            # Read-only memory maps are never written through these views.
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.from_numpy(raw.reshape(-1))
    if raw.dtype != _U8:
        raise QuantError(f"tensor bytes must be uint8, got {raw.dtype}")
    return raw.reshape(-1)


def row_nbytes(ggml_type: int, num_cols: int) -> int:
    """Bytes of one row of `num_cols` elements; raises when the row is not whole blocks."""
    block_elems, block_bytes = _block_size(ggml_type)
    if num_cols % block_elems:
        name = GGMLType(ggml_type).name
        raise QuantError(f"a {name} row of {num_cols} elements is not whole {block_elems} blocks")
    return num_cols // block_elems * block_bytes


def is_supported(ggml_type: int) -> bool:
    """Whether `dequantize` can decode this type."""
    return ggml_type in _DECODERS


def dequantize(
    raw: torch.Tensor | np.ndarray, ggml_type: int, shape: tuple[int, ...]
) -> torch.Tensor:
    """Decode a whole tensor to float32 of `shape` (torch order, the last axis along blocks)."""
    data = as_byte_tensor(raw)
    num_cols = shape[-1] if shape else 1
    num_rows = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    _check_nbytes(data, ggml_type, shape, num_rows * row_nbytes(ggml_type, num_cols))
    return _decode(data, ggml_type).reshape(shape)


def dequantize_rows(
    raw: torch.Tensor | np.ndarray, ggml_type: int, shape: tuple[int, int], rows: torch.Tensor
) -> torch.Tensor:
    """Decode only `rows` (a LongTensor of row indices) of a 2-D tensor: (len(rows), shape[1])."""
    num_rows, num_cols = shape
    table = as_byte_tensor(raw)
    nbytes = row_nbytes(ggml_type, num_cols)
    _check_nbytes(table, ggml_type, shape, num_rows * nbytes)
    rows = rows.reshape(-1)
    if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= num_rows):
        raise QuantError(f"row index out of range: the table has {num_rows} rows")
    picked = table.view(num_rows, nbytes).index_select(0, rows)  # (R, row bytes)
    return _decode(picked.reshape(-1), ggml_type).reshape(rows.numel(), num_cols)


def int4_planes(ggml_type: int) -> int:
    """How many int4 planes `int4_codes` splits a type into: 1 for Q4_0/Q4_1/Q4_K, 2 for
    Q5_0/Q5_1/Q8_0 (low nibble and high bits); raises for the others."""
    if ggml_type not in _INT4_SPLITTERS:
        raise UnsupportedTypeError(f"{GGMLType(ggml_type).name} has no int4 form")
    return _INT4_SPLITTERS[ggml_type][0]


def int4_codes(
    raw: torch.Tensor | np.ndarray, ggml_type: int, shape: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A tensor as int4 planes for kernels with one (scale, zero) per 32 values along `in`.

    Returns codes (out, P * in) in 0..15 and scales, zeros (out, P * in / 32) float32, with P =
    int4_planes(type) planes side by side; a weight is the sum over planes of
    (code - 8) * scale + zero. Exact for Q4_0, Q5_0 and Q8_0; Q4_1, Q5_1 and Q4_K regroup the
    arithmetic, so they agree up to float32 rounding.
    """
    num_rows, num_cols = shape
    data = as_byte_tensor(raw)
    _check_nbytes(data, ggml_type, shape, num_rows * row_nbytes(ggml_type, num_cols))
    num_planes, split = int4_planes(ggml_type), _INT4_SPLITTERS[ggml_type][1]
    codes, scales, zeros = split(data.view(-1, _block_size(ggml_type)[1]))  # (n, P, ...)

    def side_by_side(t: torch.Tensor) -> torch.Tensor:  # (blocks, P, k) -> (out, P * row)
        return t.view(num_rows, -1, num_planes, t.shape[-1]).transpose(1, 2).reshape(num_rows, -1)

    return side_by_side(codes), side_by_side(scales), side_by_side(zeros)


def _check_nbytes(data: torch.Tensor, ggml_type: int, shape: tuple[int, ...], want: int) -> None:
    if data.numel() != want:
        name = GGMLType(ggml_type).name
        raise QuantError(f"a {name} tensor of shape {shape} has {want} bytes, got {data.numel()}")


def _block_size(ggml_type: int) -> tuple[int, int]:
    if ggml_type not in _DECODERS:
        name = GGMLType(ggml_type).name if ggml_type in GGMLType._value2member_map_ else ggml_type
        raise UnsupportedTypeError(f"tensor type {name} is not supported by Ember")
    return BLOCK_SIZES[GGMLType(ggml_type)]


def _decode(data: torch.Tensor, ggml_type: int) -> torch.Tensor:
    """Flat bytes of whole blocks -> (num_blocks, block elements) float32."""
    _, block_bytes = _block_size(ggml_type)
    blocks = data.view(data.numel() // block_bytes, block_bytes)
    return _DECODERS[ggml_type](blocks)


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 field at byte `start` of each block, as (n, 1) float32."""
    return blocks[:, start : start + 2].contiguous().view(torch.float16).float()


def _unpack(packed: torch.Tensor, shifts: torch.Tensor, mask: int, run: int) -> torch.Tensor:
    """Split bit fields: runs of `run` bytes give one run of values per shift, in shift order."""
    n, width = packed.shape
    grouped = packed.reshape(n, width // run, 1, run) >> shifts.view(
        1, 1, -1, 1
    )  # (n, runs, shifts, run)
    return (grouped & mask).reshape(n, width * shifts.numel())


def _plain(dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    def decode(blocks: torch.Tensor) -> torch.Tensor:
        return blocks.contiguous().view(dtype).float()

    return decode


def _bf16(blocks: torch.Tensor) -> torch.Tensor:
    # Widen the bits by hand, as gguf-py does, so every NaN payload survives unchanged.
    bits = blocks.contiguous().view(torch.int16).to(torch.int32) << 16
    return bits.view(torch.float32)


def _q4_0(blocks: torch.Tensor) -> torch.Tensor:
    q = _unpack(blocks[:, 2:], _NIBBLE_SHIFTS, 0x0F, 16).to(torch.int8) - 8
    return _f16(blocks, 0) * q.float()


def _q4_1(blocks: torch.Tensor) -> torch.Tensor:
    q = _unpack(blocks[:, 4:], _NIBBLE_SHIFTS, 0x0F, 16).float()
    return _f16(blocks, 0) * q + _f16(blocks, 2)


def _five_bit(qh: torch.Tensor, qs: torch.Tensor) -> torch.Tensor:
    """32 five-bit values: low nibbles from qs, bit 4 of value j is bit j of the 4 bytes qh."""
    high = _unpack(qh, _BIT_SHIFTS, 0x01, 1)  # (n, 32): byte j // 8, bit j % 8
    return _unpack(qs, _NIBBLE_SHIFTS, 0x0F, 16) | (high << 4)


def _q5_0(blocks: torch.Tensor) -> torch.Tensor:
    q = _five_bit(blocks[:, 2:6], blocks[:, 6:]).to(torch.int8) - 16
    return _f16(blocks, 0) * q.float()


def _q5_1(blocks: torch.Tensor) -> torch.Tensor:
    q = _five_bit(blocks[:, 4:8], blocks[:, 8:]).float()
    return _f16(blocks, 0) * q + _f16(blocks, 2)


def _q8_0(blocks: torch.Tensor) -> torch.Tensor:
    q = blocks[:, 2:].contiguous().view(torch.int8).float()
    return q * _f16(blocks, 0)


def _q2_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    scales, qs = blocks[:, :16], blocks[:, 16:80]
    dl = (_f16(blocks, 80) * (scales & 0x0F).float()).view(n, 16, 1)
    ml = (_f16(blocks, 82) * (scales >> 4).float()).view(n, 16, 1)
    q = _unpack(qs, _CRUMB_SHIFTS, 0x03, 32).view(n, 16, 16).float()
    return (dl * q - ml).view(n, 256)


def _q3_k_scales(packed: torch.Tensor) -> torch.Tensor:
    """16 six-bit signed scales from 12 bytes: low nibbles from bytes 0-7, high crumbs 8-11."""
    low = _unpack(packed[:, :8], _NIBBLE_SHIFTS, 0x0F, 8)
    high = _unpack(packed[:, 8:], _CRUMB_SHIFTS, 0x03, 4)
    return ((low | (high << 4)).to(torch.int8) - 32).float()


def _q3_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    hmask, qs = blocks[:, :32], blocks[:, 32:96]
    dl = (_f16(blocks, 108) * _q3_k_scales(blocks[:, 96:108])).view(n, 16, 1)
    low = _unpack(qs, _CRUMB_SHIFTS, 0x03, 32).to(torch.int8)
    # A clear high bit means "subtract 4": the bit stores the absence of the offset.
    high = (_unpack(hmask, _BIT_SHIFTS, 0x01, 32) ^ 1).to(torch.int8) << 2
    q = (low - high).view(n, 16, 16).float()
    return (dl * q).view(n, 256)


def _k_scale_min(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 8 six-bit scales and mins of Q4_K/Q5_K from their 12 packed bytes, each (n, 8)."""
    d, m, md = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scale = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    low = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return scale, low


def _k_affine(blocks: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Q4_K/Q5_K: value = d * scale * q - dmin * min, per sub-block of 32."""
    n = blocks.shape[0]
    scale, low = _k_scale_min(blocks[:, 4:16])
    d = (_f16(blocks, 0) * scale.float()).view(n, 8, 1)
    dm = (_f16(blocks, 2) * low.float()).view(n, 8, 1)
    return (d * q.view(n, 8, 32).float() - dm).view(n, 256)


def _q4_k(blocks: torch.Tensor) -> torch.Tensor:
    return _k_affine(blocks, _unpack(blocks[:, 16:], _NIBBLE_SHIFTS, 0x0F, 32))


def _q5_k(blocks: torch.Tensor) -> torch.Tensor:
    low = _unpack(blocks[:, 48:], _NIBBLE_SHIFTS, 0x0F, 32)
    high = _unpack(blocks[:, 16:48], _BIT_SHIFTS, 0x01, 32)
    return _k_affine(blocks, low | (high << 4))


def _q6_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    ql, qh, scales = blocks[:, :128], blocks[:, 128:192], blocks[:, 192:208]
    d = (_f16(blocks, 208) * scales.contiguous().view(torch.int8).float()).view(n, 16, 1)
    low = _unpack(ql, _NIBBLE_SHIFTS, 0x0F, 64)
    high = _unpack(qh, _CRUMB_SHIFTS, 0x03, 32)
    q = ((low | (high << 4)).to(torch.int8) - 32).view(n, 16, 16).float()
    return (d * q).view(n, 256)


_IQ4_VALUES = torch.tensor(
    [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=torch.float32
)


def _iq4_nl(blocks: torch.Tensor) -> torch.Tensor:
    q = _unpack(blocks[:, 2:], _NIBBLE_SHIFTS, 0x0F, 16).long()
    return _f16(blocks, 0) * _IQ4_VALUES[q]


def _iq4_xs(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    high = blocks[:, 2:4].contiguous().view(torch.int16).to(torch.int32)  # (n, 1): 8 crumbs
    high = (high >> (2 * torch.arange(8, dtype=torch.int32))) & 0x03  # (n, 8)
    low = _unpack(blocks[:, 4:8], _NIBBLE_SHIFTS, 0x0F, 1).to(torch.int32)  # (n, 8)
    scales = ((low | (high << 4)) - 32).float()
    dl = (_f16(blocks, 0) * scales).view(n, 8, 1)
    q = _unpack(blocks[:, 8:], _NIBBLE_SHIFTS, 0x0F, 16).long().view(n, 8, 32)
    return (dl * _IQ4_VALUES[q]).view(n, 256)


# MXFP4 (gpt-oss): 32 E2M1 values, doubled as ggml stores them, times one E8M0 power of two
# halved (ggml_e8m0_to_fp32_half); the low nibbles are the first 16 values.
_MXFP4_VALUES = torch.tensor(
    [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], dtype=torch.float32
)


def _mxfp4(blocks: torch.Tensor) -> torch.Tensor:
    e = blocks[:, :1].to(torch.int32)  # (n, 1)
    bits = torch.where(e < 2, torch.full_like(e, 0x00200000) << e, (e - 1) << 23)
    q = _unpack(blocks[:, 1:], _NIBBLE_SHIFTS, 0x0F, 16).long()
    return bits.view(torch.float32) * _MXFP4_VALUES[q]


Int4Split = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # codes, scales, zeros: (n, P, k)


def _planes(*parts: Int4Split) -> Int4Split:
    codes, scales, zeros = zip(*parts, strict=True)
    return torch.stack(codes, 1), torch.stack(scales, 1), torch.stack(zeros, 1)


def _q4_0_int4(blocks: torch.Tensor) -> Int4Split:
    d = _f16(blocks, 0)
    return _planes((_unpack(blocks[:, 2:], _NIBBLE_SHIFTS, 0x0F, 16), d, torch.zeros_like(d)))


def _q4_1_int4(blocks: torch.Tensor) -> Int4Split:
    # d * q + m == (q - 8) * d + (m + 8 * d)
    d = _f16(blocks, 0)
    return _planes((_unpack(blocks[:, 4:], _NIBBLE_SHIFTS, 0x0F, 16), d, _f16(blocks, 2) + 8 * d))


def _q4_k_int4(blocks: torch.Tensor) -> Int4Split:
    # d * sc * q - dmin * m == (q - 8) * (d * sc) + (8 * d * sc - dmin * m), per 32 values
    scale, low = _k_scale_min(blocks[:, 4:16])
    s = _f16(blocks, 0) * scale.float()  # (n, 8)
    zero = 8 * s - _f16(blocks, 2) * low.float()
    return _planes((_unpack(blocks[:, 16:], _NIBBLE_SHIFTS, 0x0F, 32), s, zero))


def _five_bit_int4(blocks: torch.Tensor, offset: int, low_zero: torch.Tensor) -> Int4Split:
    # q = l + 16 * b: plane 1 codes l with (scale d, zero low_zero); plane 2 codes b + 8 with
    # (16 d, 0), giving 16 d b.
    d = _f16(blocks, 0)
    high = _unpack(blocks[:, offset : offset + 4], _BIT_SHIFTS, 0x01, 1) + 8
    low = _unpack(blocks[:, offset + 4 :], _NIBBLE_SHIFTS, 0x0F, 16)
    return _planes((low, d, low_zero), (high, 16 * d, torch.zeros_like(d)))


def _q5_0_int4(blocks: torch.Tensor) -> Int4Split:
    return _five_bit_int4(blocks, 2, -8 * _f16(blocks, 0))  # d (l - 16) = (l - 8) d - 8 d


def _q5_1_int4(blocks: torch.Tensor) -> Int4Split:
    return _five_bit_int4(blocks, 4, _f16(blocks, 2) + 8 * _f16(blocks, 0))


def _q8_0_int4(blocks: torch.Tensor) -> Int4Split:
    # q = l + 16 h with l in 0..15 and h in -8..7: planes (l, d, 8 d) and (h + 8, 16 d, 0)
    d = _f16(blocks, 0)
    q = blocks[:, 2:].contiguous().view(torch.int8)
    low, high = (q & 0x0F).to(_U8), ((q >> 4) + 8).to(_U8)
    return _planes((low, d, 8 * d), (high, 16 * d, torch.zeros_like(d)))


_INT4_SPLITTERS: dict[int, tuple[int, Callable[[torch.Tensor], Int4Split]]] = {
    GGMLType.Q4_0: (1, _q4_0_int4),
    GGMLType.Q4_1: (1, _q4_1_int4),
    GGMLType.Q4_K: (1, _q4_k_int4),
    GGMLType.Q5_0: (2, _q5_0_int4),
    GGMLType.Q5_1: (2, _q5_1_int4),
    GGMLType.Q8_0: (2, _q8_0_int4),
}

_DECODERS: dict[int, Callable[[torch.Tensor], torch.Tensor]] = {
    GGMLType.F32: _plain(torch.float32),
    GGMLType.F16: _plain(torch.float16),
    GGMLType.BF16: _bf16,
    GGMLType.Q4_0: _q4_0,
    GGMLType.Q4_1: _q4_1,
    GGMLType.Q5_0: _q5_0,
    GGMLType.Q5_1: _q5_1,
    GGMLType.Q8_0: _q8_0,
    GGMLType.Q2_K: _q2_k,
    GGMLType.Q3_K: _q3_k,
    GGMLType.Q4_K: _q4_k,
    GGMLType.Q5_K: _q5_k,
    GGMLType.Q6_K: _q6_k,
    GGMLType.IQ4_NL: _iq4_nl,
    GGMLType.IQ4_XS: _iq4_xs,
    GGMLType.MXFP4: _mxfp4,
}
