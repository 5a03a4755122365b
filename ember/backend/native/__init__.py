"""Native quantized matmul kernels (kernels.c), compiled with the system C compiler on first use
and cached; `available()` is False where no compiler works, and callers fall back to torch."""

import ctypes
import hashlib
import os
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

from ember import envconfig

SOURCE = Path(__file__).with_name("kernels.c")
TYPES = frozenset({2, 3, 6, 8})  # ggml Q4_0, Q4_1, Q5_0, Q8_0
FLAGS = [
    "-O3",
    "-march=native",
    "-fno-math-errno",
    "-fassociative-math",
    "-fno-signed-zeros",
    "-fno-trapping-math",
    "-fopenmp",
    "-shared",
    "-fPIC",
]
_i64, _ptr = ctypes.c_int64, ctypes.c_void_p


@cache
def _library() -> ctypes.CDLL | None:
    source = SOURCE.read_bytes()
    # -march=native: the library is only good for this kind of CPU, so its name says which
    tag = hashlib.sha256(source + " ".join(FLAGS).encode() + _cpu_flags()).hexdigest()[:16]
    path = envconfig.cache_dir() / f"ember-kernels-{tag}.so"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
        os.close(fd)
        cc = os.environ.get("CC", "cc")
        try:
            subprocess.run([cc, *FLAGS, str(SOURCE), "-o", tmp], check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError):
            os.unlink(tmp)
            return None
        os.replace(tmp, path)  # atomic: a concurrent process sees the whole library or none
    lib = ctypes.CDLL(str(path))
    lib.ember_qmatmul.argtypes = [ctypes.c_int, _ptr, _ptr, _ptr, _ptr, _i64, _i64, _i64]
    lib.ember_dequant.argtypes = [ctypes.c_int, _ptr, _ptr, _i64, _i64]
    return lib


def _cpu_flags() -> bytes:
    try:
        lines = Path("/proc/cpuinfo").read_bytes().splitlines()
    except OSError:
        return b""
    return next((line for line in lines if line.startswith(b"flags")), b"")


def available() -> bool:
    return _library() is not None


def qmatmul(
    ggml_type: int, weight: torch.Tensor, x: torch.Tensor, out_features: int
) -> torch.Tensor:
    """x (M, K) float32 contiguous @ W.T for W (out_features, K) as raw GGUF blocks (uint8)."""
    m, k = x.shape
    if m == 0:  # a prefill chunk with no output rows: legal, nothing to compute
        return torch.empty(0, out_features)
    lib = _library()
    assert lib is not None
    y = torch.empty(m, out_features)
    sums = torch.empty(m, k // 32)
    rc = lib.ember_qmatmul(
        ggml_type,
        weight.data_ptr(),
        x.data_ptr(),
        y.data_ptr(),
        sums.data_ptr(),
        m,
        out_features,
        k,
    )
    if rc != 0:
        raise ValueError(
            f"the native kernel rejected ggml type {ggml_type} with {m} rows of {k} inputs"
        )
    return y


def dequant(
    ggml_type: int, weight: torch.Tensor, out_features: int, in_features: int
) -> torch.Tensor:
    """The raw GGUF blocks of W expanded to float32 (out_features, in_features)."""
    lib = _library()
    assert lib is not None
    out = torch.empty(out_features, in_features)
    rc = lib.ember_dequant(ggml_type, weight.data_ptr(), out.data_ptr(), out_features, in_features)
    if rc != 0:
        raise ValueError(f"the native kernels do not read ggml type {ggml_type}")
    return out


class NativeLinear:
    """A linear weight kept as its GGUF blocks (Q4_0, Q4_1, Q5_0, Q8_0): exact float32 results.

    Few rows (decode) run the native kernel over the blocks; many rows (prefill) expand the
    weight for the call and use torch's dense matmul, which is faster there.
    """

    __slots__ = ("ggml_type", "in_features", "kind", "out_features", "raw")
    MAX_NATIVE_ROWS = 8

    def __init__(self, raw: torch.Tensor, ggml_type: int, out_features: int, in_features: int):
        self.raw, self.ggml_type = raw, int(ggml_type)
        self.out_features, self.in_features, self.kind = out_features, in_features, "native"

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x (T, in) float32 -> (T, out) float32."""
        if x.shape[0] <= self.MAX_NATIVE_ROWS:
            return qmatmul(self.ggml_type, self.raw, x.contiguous(), self.out_features)
        return x @ self.dequantize().t()

    def dequantize(self) -> torch.Tensor:
        return dequant(self.ggml_type, self.raw, self.out_features, self.in_features)

    @property
    def nbytes(self) -> int:
        return self.raw.nbytes

    @classmethod
    def concat(cls, parts: list["NativeLinear"]) -> "NativeLinear":
        """Weights of one type and input size stacked along out (their blocks simply follow)."""
        if len({(p.ggml_type, p.in_features) for p in parts}) != 1:
            raise ValueError("only weights of one type and input size can be stacked")
        raw = torch.cat([p.raw for p in parts])
        return cls(
            raw, parts[0].ggml_type, sum(p.out_features for p in parts), parts[0].in_features
        )
