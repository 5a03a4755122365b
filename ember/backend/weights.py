"""Weight objects models hold: linear layers (int4-packed where torch has a kernel, else fp32) and
embedding tables kept quantized in memory and decoded by row. CPU kernels only.

Kernels (torch 2.13): Q4_0, Q4_1 and Q4_K run on `aten._weight_int4pack_mm_for_cpu` (groups of
32). Only its bf16 entry point is vectorised on x86 (the fp32 one is a scalar loop, 20-100x
slower than a dense fp32 matmul), so the int4 kinds round activations, scales/zeros and outputs
to bf16: outputs differ from `dequantize(W) @ x` by ~3e-3 rms relative (bf16 rounding), not by
fp32 rounding. `use_int4=False` gives the exact path. Every other type is expanded once to fp32
(exact): Q8_0, Q5_x and Q6_K have no exact torch kernel (`_weight_int8pack_mm` has one scale per
output channel, not per 32-block). Opt-in `use_int4_planes` runs Q5_0/Q5_1/Q8_0 as two int4
planes: 1.25 bytes a weight, bf16 precision, faster than fp32 for big heads at one row.

`.venv/bin/python tests/backend/bench_weights.py 2` (and `1`), quiet machine, median ms a call,
2 threads / 1 thread:
    out x in     rows   fp32         int4 (Q4_0)   int4x2 (Q8_0)
    576 x 1536      1   0.067/0.074  0.033/0.049   0.052/0.086
    1536 x 576      1   0.058/0.070  0.032/0.048   0.050/0.086
    49152 x 576     1   4.9/5.9      1.2/1.6       2.0/2.8
    576 x 1536    512   5.3/10.2     4.2/9.5       8.2/18.5
    1536 x 576    512   5.6/10.5     5.3/9.5       9.5/18.7
    49152 x 576   512   221/421      192/299       326/585
With a neighbour busy on the other core, each 2-thread int4 call stalls to ~8 ms (OpenMP waits
for its descheduled thread); fp32 calls slow down ~5x.
"""

from dataclasses import dataclass

import numpy as np
import torch

from ember.backend.quant import (
    QuantError,
    as_byte_tensor,
    dequantize,
    dequantize_rows,
    int4_codes,
    int4_planes,
)
from ember.gguf import GGMLType

GROUP_SIZE = 32  # int4 scales/zeros: one pair per 32 weights along `in`
INT4_TYPES = frozenset({GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q4_K})
PLANE_TYPES = frozenset({GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0})  # two int4 planes each
# The packed layout works in blocks of up to 64 output rows (AVX-512); parts cut at multiples of
# 64 can be packed apart and joined, and loading packs 4096 rows at a time to bound the int32 copy.
_PACK_ROWS = 64
_LOAD_CHUNK_ROWS = 4096
_INT4_MM = torch.ops.aten._weight_int4pack_mm_for_cpu.default
_INT4_PACK = torch.ops.aten._convert_weight_to_int4pack_for_cpu.default


@dataclass(frozen=True, slots=True)
class Int4Pack:
    """int4 codes in the CPU kernel's packed layout, with their per-32 scales and zeros."""

    packed: torch.Tensor  # (out, P * in / 2) uint8, layout of _convert_weight_to_int4pack_for_cpu
    scales_zeros: torch.Tensor  # (P * in / 32, out, 2) bf16: weight = (code - 8) * scale + zero
    num_planes: int = 1  # P: planes side by side along `in`, summed (the input is repeated)


class LinearWeight:
    """A linear layer's weight of shape (out, in): `w(x)` maps (..., in) float32 to (..., out)."""

    __slots__ = ("_w", "in_features", "kind", "out_features")

    def __init__(self, w: torch.Tensor | Int4Pack) -> None:
        """`w` is an fp32 (in, out) tensor (W transposed) or an Int4Pack; prefer the from_*."""
        self._w = w
        if isinstance(w, Int4Pack):
            self.kind = "int4" if w.num_planes == 1 else f"int4x{w.num_planes}"
            self.out_features = w.packed.shape[0]
            self.in_features = w.packed.shape[1] * 2 // w.num_planes
        else:
            self.kind = "f32"
            self.in_features, self.out_features = w.shape

    @classmethod
    def from_gguf(
        cls,
        raw: torch.Tensor | np.ndarray,
        ggml_type: int,
        shape: tuple[int, ...],
        *,
        use_int4: bool = True,
        use_int4_planes: bool = False,
    ) -> "LinearWeight":
        """From a GGUF tensor's bytes, `shape` (out, in): int4 for Q4_0/Q4_1/Q4_K, else fp32.

        `use_int4_planes` also runs Q5_0/Q5_1/Q8_0 on the int4 kernel, as two planes (low
        nibble, high bits): 1.25 bytes a weight instead of 4, at bf16 precision.
        """
        if len(shape) != 2:
            raise QuantError(f"a linear weight is 2-D (out, in), got shape {shape}")
        out_features, in_features = shape
        wanted = (INT4_TYPES if use_int4 else set()) | (PLANE_TYPES if use_int4_planes else set())
        if ggml_type in wanted and out_features % 16 == 0:
            return cls(_pack_int4(as_byte_tensor(raw), ggml_type, (out_features, in_features)))
        return cls.from_dense(dequantize(raw, ggml_type, shape))

    @classmethod
    def from_dense(cls, weight: torch.Tensor) -> "LinearWeight":
        """From a float (out, in) tensor, held as fp32 (in, out) for `x @ W^T`."""
        return cls(weight.detach().float().t().contiguous())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., in) float32 -> (..., out) float32."""
        w = self._w
        if not isinstance(w, Int4Pack):
            return x @ w
        # Small ops cost microseconds here: reshape only when needed, cat (not repeat) planes.
        flat = x.to(torch.bfloat16) if x.dim() == 2 else x.reshape(-1, x.shape[-1]).bfloat16()
        if w.num_planes > 1:
            flat = torch.cat([flat] * w.num_planes, dim=-1)
        y = _INT4_MM(flat, w.packed, GROUP_SIZE, w.scales_zeros).float()  # (T, out)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    @property
    def nbytes(self) -> int:
        """Bytes of weight data this object holds."""
        w = self._w
        return w.packed.nbytes + w.scales_zeros.nbytes if isinstance(w, Int4Pack) else w.nbytes

    def dequantize(self) -> torch.Tensor:
        """The weight as (out, in) float32, as the kernel sees it (bf16 scales for int4)."""
        w = self._w
        if not isinstance(w, Int4Pack):
            return w.t()
        codes = _int4_codes_of(w.packed)  # (out, P * in) values q - 8
        scales_zeros = w.scales_zeros.float().repeat_interleave(GROUP_SIZE, dim=0)
        planes = codes * scales_zeros[..., 0].t() + scales_zeros[..., 1].t()
        return planes.view(self.out_features, w.num_planes, self.in_features).sum(1)

    def __repr__(self) -> str:
        return f"LinearWeight({self.kind}, out={self.out_features}, in={self.in_features})"


def _pack_int4(data: torch.Tensor, ggml_type: int, shape: tuple[int, int]) -> Int4Pack:
    num_rows, num_cols = shape
    rows = data.view(num_rows, -1)  # (out, row bytes)
    packed, scales_zeros = [], []
    for start in range(0, num_rows, _LOAD_CHUNK_ROWS):
        chunk = rows[start : start + _LOAD_CHUNK_ROWS]
        codes, scales, zeros = int4_codes(chunk, ggml_type, (chunk.shape[0], num_cols))
        packed.append(_INT4_PACK(codes.to(torch.int32), 1))  # (rows, in / 2)
        # (in / 32, rows, 2): the kernel reads one (scale, zero) pair per group and row
        scales_zeros.append(torch.stack([scales.t(), zeros.t()], dim=-1).to(torch.bfloat16))
    return Int4Pack(torch.cat(packed), torch.cat(scales_zeros, dim=1), int4_planes(ggml_type))


def _int4_codes_of(packed: torch.Tensor) -> torch.Tensor:
    """Read packed codes back as (out, in) float32 values q - 8: the kernel with unit scales and
    zero offsets on the identity gives them exactly (small integers survive bf16)."""
    out_features, in_features = packed.shape[0], packed.shape[1] * 2
    unit = torch.zeros(in_features // GROUP_SIZE, out_features, 2, dtype=torch.bfloat16)
    unit[..., 0] = 1
    eye = torch.eye(in_features, dtype=torch.bfloat16)
    return _INT4_MM(eye, packed, GROUP_SIZE, unit).float().t()


def concat_linear(parts: list[LinearWeight]) -> LinearWeight:
    """Fuse weights with the same `in` along `out` (q/k/v, gate/up): one matmul for all.

    int4 parts stay packed when all have the same number of planes and every part but the last
    has a multiple of 64 rows (the packed layout's block); otherwise the result is fp32,
    expanded from each part.
    """
    if not parts or len({p.in_features for p in parts}) != 1:
        raise QuantError("concat_linear needs one or more weights with the same in_features")
    packs = [p._w for p in parts if isinstance(p._w, Int4Pack)]
    same_kernel = len(packs) == len(parts) and len({w.num_planes for w in packs}) == 1
    if same_kernel and all(p.out_features % _PACK_ROWS == 0 for p in parts[:-1]):
        packed = torch.cat([w.packed for w in packs])
        scales_zeros = torch.cat([w.scales_zeros for w in packs], dim=1)
        return LinearWeight(Int4Pack(packed, scales_zeros, packs[0].num_planes))
    return LinearWeight.from_dense(torch.cat([p.dequantize() for p in parts]))


class EmbeddingWeight:
    """A (vocab, dim) table kept as its GGUF bytes; `lookup` decodes only the rows asked for."""

    __slots__ = ("_table", "embedding_dim", "ggml_type", "num_embeddings")

    def __init__(self, table: torch.Tensor, ggml_type: int, shape: tuple[int, int]) -> None:
        self._table = table
        self.ggml_type = ggml_type
        self.num_embeddings, self.embedding_dim = shape
        # Validates type, shape and size once, so lookups can trust them.
        dequantize_rows(table, ggml_type, shape, torch.zeros(0, dtype=torch.long))

    @classmethod
    def from_gguf(
        cls, raw: torch.Tensor | np.ndarray, ggml_type: int, shape: tuple[int, ...]
    ) -> "EmbeddingWeight":
        """From a GGUF tensor's bytes (shared, not copied), `shape` (vocab, dim)."""
        if len(shape) != 2:
            raise QuantError(f"an embedding table is 2-D (vocab, dim), got shape {shape}")
        return cls(as_byte_tensor(raw), ggml_type, (shape[0], shape[1]))

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (T,) int64 -> (T, dim) float32; raises QuantError for an id outside the table."""
        shape = (self.num_embeddings, self.embedding_dim)
        return dequantize_rows(self._table, self.ggml_type, shape, ids)

    def as_linear(self, *, use_int4: bool = True, use_int4_planes: bool = False) -> LinearWeight:
        """The table as an output head (tied embeddings), as LinearWeight.from_gguf makes it."""
        shape = (self.num_embeddings, self.embedding_dim)
        return LinearWeight.from_gguf(
            self._table, self.ggml_type, shape, use_int4=use_int4, use_int4_planes=use_int4_planes
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the quantized table (shared with the file's memory map)."""
        return self._table.nbytes


# The short names the model layer binds with.
Linear = LinearWeight
Embedding = EmbeddingWeight
