"""Prefill's float32 matmul, out = x @ w.T, through oneDNN where torch has it.

torch.mm takes MKL's sgemm, and MKL runs its AVX2 code on AMD CPUs; torch's oneDNN linear runs
AVX-512 there, in strict float32 (no bf16 shortcut: the results differ from MKL's by
accumulation order only). On a 2-core Zen 5 EPYC, 2 threads, 512 rows of x times the bundled
models' weight chunks: MKL 190-205 GFLOPS, oneDNN 390-450 (and 222-239 with oneDNN held to
AVX2 by ONEDNN_MAX_CPU_ISA): `.venv/bin/python benchmarks/bench_gemm.py`.

oneDNN keeps the code it generates for each shape it meets (~0.4 MB a shape, never freed, with
or without its primitive cache), so a prompt of every length would grow the process by hundreds
of MB: it only ever sees blocks of BLOCK_ROWS rows of x, and the rows left over (fewer than the
smallest block) take torch.mm.
"""

import platform
from collections.abc import Callable

import torch

# A full batch (512 rows) takes one call: oneDNN packs a weight chunk once for it where two
# 256-row calls packed it twice (512-token prefill 3% faster on SmolLM2 and Gemma 3, 4% on Qwen
# 0.5B, five in-process alternations, Zen 5 EPYC, 2026-11-27); 64 rows still run at ~300 GFLOPS.
BLOCK_ROWS = (512, 256, 64)


def _onednn_linear() -> Callable[..., torch.Tensor] | None:
    # measured on x86-64 only (on AArch64 torch's oneDNN goes through ACL: not measured)
    if (
        platform.machine().lower() not in ("x86_64", "amd64")
        or not torch.backends.mkldnn.is_available()
    ):
        return None
    try:
        return torch.ops.mkldnn._linear_pointwise.default
    except (AttributeError, RuntimeError):  # a torch built without it
        return None


_LINEAR = _onednn_linear()


def available() -> bool:
    """Whether prefill's matmuls take oneDNN (else torch.mm alone)."""
    return _LINEAR is not None


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w.T through oneDNN (available() only), for float32 x (m, k) and contiguous w (n, k)
    of shapes from a small set: each new shape keeps its code for good."""
    assert _LINEAR is not None
    return _LINEAR(x, w, None, "none", [], "")


def matmul_into(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = x @ w.T for float32 x (m, k) and w (n, k), both contiguous; out (m, n) may be a
    column slice of a wider tensor."""
    start, rows = 0, x.shape[0]
    if _LINEAR is not None:
        for block in BLOCK_ROWS:
            while rows - start >= block:
                part = linear(x[start : start + block], w)
                out[start : start + block].copy_(part)
                start += block
    if start < rows:
        torch.mm(x[start:], w.t(), out=out[start:])
    return out
