"""The linear layers models hold, kept as their GGUF blocks, run by the native kernels
(ember/backend/native) or, without them, by torch (embedding tables: ember/backend/embedding.py).

Every quantized type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K..Q6_K, IQ4_NL, IQ4_XS) and F16/BF16
stays in memory as the file's bytes (a view of the memory map where the caller passes one). A
call with at most NATIVE_ROWS rows (decode, small batches) runs the native kernel of the ISA
chosen at load (activations quantized per block for the quantized types: int8 for the K types,
int16 for the 32-element ones, and for Q4_K, Q5_K and Q6_K too where the lane kernels take them
(vnni.h on the avx512 and amx paths, rows8.h from 2-3 rows on avx2 and avxvnni), IQ4_NL and
one row of Q8_0 reading float32 on the avx512 and amx paths; float32 for F16/BF16); more rows
(prefill) expand the weight to float32 in chunks of at most CHUNK_FLOATS values for a float32 matmul
(ember/backend/gemm.py), so prefill keeps a BLAS's speed and the memory stays bounded, except a
K type taking one q8_K pass: its int8 kernel (or gemm8, x in int8 per 32 values) outruns that;
on the x86 paths every other weight of the types gemm16 has takes it (x in int16 per 32 values,
the decode kernels' rounding: 1.2-1.4x the float32 matmul), so a prompt's rows round as they
would one at a time (precision.py says why the 32-element types never take gemm8's int8). F32
weights stay a dense float32 tensor. Without the library (or for a type it lacks), every call
takes the chunked dequantize-then-matmul path (ember/backend/quant.py, bit-equal to gguf-py).
"""

import numpy as np
import torch

from ember.backend import gemm, native
from ember.backend.precision import INT8_PREFILL, gemm8_prefill, gemm16_prefill, int8_prefill
from ember.backend.quant import QuantError, as_byte_tensor, dequantize, row_nbytes
from ember.gguf import GGMLType

NATIVE_ROWS = 16  # rows of x up to which the native kernel runs (it quantizes them once)
# values expanded at a time on the float32 path, at most (32 MiB: a 3B model's down projection
# was 100 MiB at once, 5% of its peak memory; smaller chunks are still large matmuls)
CHUNK_FLOATS = 8 << 20
# weight rows expanded at a time, at most, in chunks of equal size: a chunk still in cache when
# the matmul reads it. Chunks of CHUNK_FLOATS alone had expanded Qwen 0.5B's fused gate/up
# (9728 x 896) as one 33 MB chunk and a small one; 512 rows lifted its 512-token prefill from
# 97-113 to 137-171 tok/s (AVX2, 2 threads, benchmarks/bench_generate.py's Ember worker).
CHUNK_ROWS = 512


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x (..., in) as float32 rows (M, in)."""
    flat = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    return flat if flat.dtype == torch.float32 else flat.float()


def _shaped(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """y (M, out) with x's leading dimensions."""
    return y if x.dim() == 2 else y.reshape(*x.shape[:-1], y.shape[-1])


class LinearWeight:
    """A dense float32 weight (out, in), for F32 tensors: `w(x)` maps (..., in) to (..., out)."""

    __slots__ = ("_w", "in_features", "kind", "out_features")

    def __init__(self, w: torch.Tensor) -> None:
        """`w` is the float32 (in, out) tensor, W transposed; prefer from_dense."""
        self._w, self.kind = w, "f32"
        self.in_features, self.out_features = w.shape

    @classmethod
    def from_dense(cls, weight: torch.Tensor) -> "LinearWeight":
        """From a float (out, in) tensor, held as fp32 (in, out) for `x @ W^T`."""
        return cls(weight.detach().float().t().contiguous())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self._w

    @property
    def nbytes(self) -> int:
        return self._w.nbytes

    def dequantize(self) -> torch.Tensor:
        """The weight as (out, in) float32."""
        return self._w.t()

    def __repr__(self) -> str:
        return f"LinearWeight(f32, out={self.out_features}, in={self.in_features})"


class NativeLinear:
    """A weight (out, in) kept as its GGUF blocks: `w(x)` maps (..., in) float32 to (..., out)."""

    __slots__ = (
        "_gemm8",
        "_gemm16",
        "_int8_any_rows",
        "_kernels",
        "_row_bytes",
        "activation_passes",
        "ggml_type",
        "in_features",
        "kind",
        "out_features",
        "prefill_int8",
        "raw",
    )

    def __init__(
        self,
        raw: torch.Tensor | np.ndarray,
        ggml_type: int,
        out_features: int,
        in_features: int,
        *,
        kernels: "native.Kernels | bool | None" = True,
        activation_passes: int = 2,
        prefill_int8: bool = False,
    ) -> None:
        """raw: the tensor's bytes (shared, not copied); kernels: True for the chosen ISA's,
        a native.Kernels for that ISA's, False/None for the torch path; activation_passes: the
        q8_K passes over x of a K type's native kernel (2: x and its rounding error, ~int16
        precision; 1: x alone, llama.cpp's precision, ~2/3 of the time, in the lane kernels too
        but on the amx path; see activation_passes); prefill_int8: a prompt of a 32-element type
        takes gemm8 (x in int8 per 32 values, llama.cpp's q8_0) where the path has it, which no
        loaded model asks for (precision.py: Gemma 3's chats) but its benchmarks and tests do."""
        if activation_passes not in (1, 2):
            raise QuantError(f"activation_passes is 1 or 2, got {activation_passes}")
        self.activation_passes = activation_passes
        self.raw, self.ggml_type = as_byte_tensor(raw), int(ggml_type)
        self.out_features, self.in_features = out_features, in_features
        self._row_bytes = row_nbytes(self.ggml_type, in_features)
        if self.raw.numel() != out_features * self._row_bytes:
            name = GGMLType(self.ggml_type).name
            raise QuantError(
                f"a {name} weight of shape ({out_features}, {in_features}) has "
                f"{out_features * self._row_bytes} bytes, got {self.raw.numel()}"
            )
        kern = native.kernels() if kernels is True else kernels or None
        self._kernels = kern if kern is not None and kern.supports(self.ggml_type) else None
        self.kind = GGMLType(self.ggml_type).name.lower()
        self._int8_any_rows = (
            activation_passes == 1 and self.ggml_type in INT8_PREFILL and int8_prefill(self.isa)
        )
        self.prefill_int8 = prefill_int8
        # gemm8 also takes over the one-pass K types' int8 prefill (q8_K: int8 per 256 values)
        # where it has fast code for the type: finer rounding, and on the avx2 path 380 GFLOPS
        # against the q8_K kernel's 250 (Q4_K, the 3B file's q/k/v and gate/up shapes)
        self._gemm8 = gemm8_prefill(self.isa, self.ggml_type) and (
            prefill_int8 or self._int8_any_rows
        )
        # gemm16 (x in int16 per 32 values, the decode kernels' rounding) takes the prefill of
        # every other weight of a type it has fast code for: faster than the float32 path
        self._gemm16 = (
            not self._gemm8 and not self._int8_any_rows and gemm16_prefill(self.isa, self.ggml_type)
        )

    @property
    def isa(self) -> str | None:
        """The ISA of the kernels this weight runs on; None on the torch path."""
        return self._kernels.isa if self._kernels is not None else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = _rows(x)
        rows = flat.shape[0]
        if rows == 0:
            y = flat.new_empty(0, self.out_features)
        elif self.takes_codes(rows):
            y = flat.new_empty(rows, self.out_features)
            self.codes_into(self.quantize_rows(flat.contiguous()), 0, self.out_features, y)
        elif not self.takes_dense(rows):
            y = self._native(flat.contiguous())
        else:
            y = flat.new_empty(rows, self.out_features)
            self.dense_into(flat.contiguous(), 0, self.out_features, y)
        return _shaped(y, x)

    def takes_dense(self, rows: int) -> bool:
        """Whether `rows` rows of x take the float32 path (dense_into), not the native kernel."""
        return self._kernels is None or (
            rows > NATIVE_ROWS and not self._int8_any_rows and not self.takes_codes(rows)
        )

    def takes_int8(self, rows: int) -> bool:
        """Whether `rows` rows of x take gemm8 (quantize_rows, then codes_into)."""
        return self._gemm8 and rows > NATIVE_ROWS

    def takes_int16(self, rows: int) -> bool:
        """Whether `rows` rows of x take gemm16 (quantize_rows, then codes_into)."""
        return self._gemm16 and rows > NATIVE_ROWS

    def takes_codes(self, rows: int) -> bool:
        """Whether `rows` rows of x take gemm8 or gemm16: x quantized once (quantize_rows),
        then any range of the weight's rows (codes_into)."""
        return self.takes_int8(rows) or self.takes_int16(rows)

    def quantize_rows(self, x: torch.Tensor) -> torch.Tensor:
        """Contiguous float32 x (M, in) quantized for codes_into: (M, q8_row_bytes) bytes for
        gemm8, (M, q16_row_bytes) for gemm16."""
        kern = self._kernels
        assert kern is not None and (self._gemm8 or self._gemm16)
        native.set_threads(torch.get_num_threads())
        size, quantize = (
            (native.q8_row_bytes, kern.q8_rows)
            if self._gemm8
            else (native.q16_row_bytes, kern.q16_rows)
        )
        xq = torch.empty(x.shape[0], size(self.in_features), dtype=torch.uint8)
        rc = quantize(x.data_ptr(), x.shape[0], self.in_features, xq.data_ptr())
        if rc:
            raise native.NativeError(_failure(rc, self.ggml_type, kern.isa))
        return xq

    def codes_into(self, xq: torch.Tensor, start: int, stop: int, out: torch.Tensor) -> None:
        """out = x @ W[start:stop]^T by gemm8 or gemm16, x as quantize_rows made it; out
        (M, stop - start) with unit column stride may be a column slice of a wider tensor."""
        kern = self._kernels
        assert kern is not None and out.stride(1) == 1
        native.set_threads(torch.get_num_threads())
        rc = (kern.gemm8 if self._gemm8 else kern.gemm16)(
            self.ggml_type,
            self.raw.data_ptr() + start * self._row_bytes,
            xq.data_ptr(),
            xq.shape[0],
            stop - start,
            self.in_features,
            out.data_ptr(),
            out.stride(0),
        )
        if rc:
            raise native.NativeError(_failure(rc, self.ggml_type, kern.isa))

    def _native(self, x: torch.Tensor) -> torch.Tensor:
        kern = self._kernels
        assert kern is not None
        native.set_threads(torch.get_num_threads())
        y = torch.empty(x.shape[0], self.out_features)
        rc = kern.matmul(
            self.ggml_type,
            self.raw.data_ptr(),
            x.data_ptr(),
            y.data_ptr(),
            x.shape[0],
            self.out_features,
            self.in_features,
            self.activation_passes,
        )
        if rc:
            raise native.NativeError(_failure(rc, self.ggml_type, kern.isa))
        return y

    @property
    def chunk_rows(self) -> int:
        """The most weight rows the float32 path expands at a time (CHUNK_ROWS, CHUNK_FLOATS)."""
        return max(1, min(CHUNK_ROWS, CHUNK_FLOATS // self.in_features))

    def dense_into(
        self,
        x: torch.Tensor,
        start: int,
        stop: int,
        out: torch.Tensor,
        chunk: torch.Tensor | None = None,
    ) -> None:
        """out = x @ W[start:stop]^T by the float32 path, for contiguous float32 x (M, in); out
        (M, stop - start) may be a column slice of a wider tensor. The rows are expanded in
        equal chunks (no small one at the end) into `chunk` (contiguous float32, at least
        chunk_rows rows of in) where given, else into a buffer of the call's own."""
        rows = -(-(stop - start) // -(-(stop - start) // self.chunk_rows))
        if chunk is None:
            chunk = torch.empty(rows, self.in_features)  # one buffer for every chunk
        for first in range(start, stop, rows):
            last = min(first + rows, stop)
            # straight into out's columns (BLAS takes its row stride): a product then its copy
            # was ~6% of Qwen 0.5B's and Gemma 3's prefill (torch profiler, AVX2, 2 threads)
            w = self.dequantize(first, last, out=chunk[: last - first])
            gemm.matmul_into(x, w, out[:, first - start : last - start])

    def dequantize(
        self, start: int = 0, stop: int | None = None, *, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Rows start..stop of the weight as (rows, in) float32, bit-equal to gguf-py; into
        `out` (contiguous, that shape) where given."""
        stop = self.out_features if stop is None else stop
        raw = self.raw[start * self._row_bytes : stop * self._row_bytes]
        kern = self._kernels
        if kern is None:
            rows = dequantize(raw, self.ggml_type, (stop - start, self.in_features))
            return rows if out is None else out.copy_(rows)
        if out is None:
            out = torch.empty(stop - start, self.in_features)
        elif out.shape != (stop - start, self.in_features) or not out.is_contiguous():
            raise QuantError(
                f"dequantize(out=) needs a contiguous ({stop - start}, "
                f"{self.in_features}) tensor, got {tuple(out.shape)}"
            )
        native.set_threads(torch.get_num_threads())
        rc = kern.dequant(
            self.ggml_type, raw.data_ptr(), out.data_ptr(), stop - start, self.in_features
        )
        if rc:
            raise native.NativeError(_failure(rc, self.ggml_type, kern.isa))
        return out

    @property
    def nbytes(self) -> int:
        return self.raw.nbytes

    @classmethod
    def concat(cls, parts: list["NativeLinear"]) -> "NativeLinear":
        """Weights of one type and input size stacked along out (their blocks simply follow)."""
        if not parts or len({(p.ggml_type, p.in_features) for p in parts}) != 1:
            raise QuantError("only weights of one type and input size can be stacked")
        return cls(
            torch.cat([p.raw for p in parts]),
            parts[0].ggml_type,
            sum(p.out_features for p in parts),
            parts[0].in_features,
            kernels=parts[0]._kernels,
            activation_passes=max(p.activation_passes for p in parts),
            prefill_int8=all(p.prefill_int8 for p in parts),
        )

    def __repr__(self) -> str:
        path = self.isa or "torch"
        return f"NativeLinear({self.kind}, out={self.out_features}, in={self.in_features}, {path})"


def _failure(rc: int, ggml_type: int, isa: str) -> str:
    name = GGMLType(ggml_type).name if ggml_type in GGMLType._value2member_map_ else ggml_type
    what = {
        -1: f"do not read type {name}",
        -2: "were given a shape that is not whole blocks",
        -3: "ran out of memory",
    }.get(rc, f"failed ({rc})")
    return f"the native {isa} kernels {what}"


class FusedLinear:
    """Projections of one input whose parts cannot be stacked (different types): each part runs
    on its own and the outputs are joined along out."""

    __slots__ = ("in_features", "kind", "out_features", "parts")

    def __init__(self, parts: "list[LinearWeight | NativeLinear | FusedLinear]") -> None:
        self.parts = parts
        self.in_features: int = parts[0].in_features
        self.out_features: int = sum(p.out_features for p in parts)
        self.kind: str = "+".join(p.kind for p in parts)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = _rows(x).contiguous()
        rows = flat.shape[0]
        out = flat.new_empty(rows, self.out_features)
        # a prompt's x quantized once for the parts whose kernel takes it so (gemm8's codes for
        # some, gemm16's for others): Gemma 3's q/k/v (Q5_0, Q5_0, Q8_0) quantized it thrice
        quantized: dict[bool, torch.Tensor] = {}
        col = 0
        for part in self.parts:
            n, dst = part.out_features, out[:, col : col + part.out_features]
            if isinstance(part, NativeLinear) and part.takes_codes(rows):
                int8 = part.takes_int8(rows)
                if int8 not in quantized:
                    quantized[int8] = part.quantize_rows(flat)
                part.codes_into(quantized[int8], 0, n, dst)
            else:
                dst.copy_(part(flat))
            col += n
        return _shaped(out, x)

    def dequantize(self) -> torch.Tensor:
        return torch.cat([p.dequantize() for p in self.parts])

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


AnyLinear = LinearWeight | NativeLinear | FusedLinear


def linear_from_gguf(
    raw: torch.Tensor | np.ndarray,
    ggml_type: int,
    shape: tuple[int, ...],
    *,
    passes: int = 2,
) -> AnyLinear:
    """A projection from a GGUF tensor's bytes, `shape` (out, in): F32 as a dense tensor, every
    other type kept as its blocks (passes: NativeLinear's activation_passes)."""
    if len(shape) != 2:
        raise QuantError(f"a linear weight is 2-D (out, in), got shape {shape}")
    if int(ggml_type) == GGMLType.F32:
        return LinearWeight.from_dense(dequantize(raw, ggml_type, shape))
    return NativeLinear(raw, ggml_type, shape[0], shape[1], activation_passes=passes)


def expert_linears(
    raw: torch.Tensor | np.ndarray,
    ggml_type: int,
    shape: tuple[int, ...],
    *,
    passes: int = 2,
) -> list[AnyLinear]:
    """One projection per expert of a stacked GGUF tensor, `shape` (experts, out, in): each a
    view of its expert's blocks (no copy), so running an expert reads only its own bytes."""
    if len(shape) != 3:
        raise QuantError(f"a stack of expert weights is 3-D (experts, out, in), got {shape}")
    num_experts, out_features, in_features = shape
    data = as_byte_tensor(raw)
    step = out_features * row_nbytes(ggml_type, in_features)
    if data.numel() != num_experts * step:
        raise QuantError(
            f"a stack of shape {shape} has {num_experts * step} bytes, got {data.numel()}"
        )
    return [
        linear_from_gguf(
            data[e * step : (e + 1) * step],
            ggml_type,
            (out_features, in_features),
            passes=passes,
        )
        for e in range(num_experts)
    ]


def concat_linear(parts: list[AnyLinear]) -> AnyLinear:
    """Fuse weights with the same `in` along `out` (q/k/v, gate/up): one call for all. Blocks
    of one type are stacked; dense parts are joined; a mix stays separate parts."""
    if not parts or len({p.in_features for p in parts}) != 1:
        raise QuantError("concat_linear needs one or more weights with the same in_features")
    if len(parts) == 1:
        return parts[0]
    blocks = [p for p in parts if isinstance(p, NativeLinear)]
    if len(blocks) == len(parts) and len({p.ggml_type for p in blocks}) == 1:
        return NativeLinear.concat(blocks)
    if all(isinstance(p, LinearWeight) for p in parts):
        return LinearWeight.from_dense(torch.cat([p.dequantize() for p in parts]))
    return FusedLinear(parts)
