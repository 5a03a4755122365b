"""Prefill's int8 product (gemm8: x rounded to int8 per 32 values, native/gemm8.h), or its int16
one (--kernel gemm16: x in int16 per 32 values, native/gemm16.h), against the float32 path (the
weight expanded in chunks, then oneDNN or torch.mm), GFLOPS, on the MLP gate/up shapes of the
bundled models and the 3B file, random weights of their types, 512 rows of x.

    .venv/bin/python benchmarks/bench_gemm8.py [--isa avx512] [--threads 2] [--rows 512]
    .venv/bin/python benchmarks/bench_gemm8.py --kernel gemm16

For the avx2 path, hold torch's own code to AVX2 as bench_generate.py does:
    EMBER_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 \\
        .venv/bin/python benchmarks/bench_gemm8.py --isa avx2
"""

import argparse
import sys
import time
from pathlib import Path

import torch
from gguf import GGMLQuantizationType as QT

from ember.backend import native
from ember.backend.precision import gemm8_prefill, gemm16_prefill
from ember.backend.weights import NativeLinear

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "backend"))
from quant_data import quantized, random_blocks

# (type, out, in): SmolLM2's Q4_1 gate/up, Gemma 3's and Qwen 0.5B's Q5_0, the 3B file's Q4_K,
# and Q6_K (a down projection's type, for its 16-value units) at the 3B file's width and at an
# 8B model's down projection's (a gemm16 panel of 32 rows then 0.9 MB)
SHAPES = [
    (QT.Q4_1, 3072, 576),
    (QT.Q5_0, 4096, 640),
    (QT.Q5_0, 9728, 896),
    (QT.Q4_K, 16384, 3072),
    (QT.Q6_K, 3072, 3072),
    (QT.Q6_K, 1024, 14336),
    (QT.Q8_0, 4096, 640),
]


def best_gflops(lin: NativeLinear, x: torch.Tensor, kernel: str, reps: int) -> float:
    """The best of `reps` products of x and the whole weight by one path (gemm8, gemm16 or
    float32), x's quantization included, in GFLOPS."""
    kern = native.kernels(lin.isa)
    assert kern is not None
    rows, k, n = x.shape[0], lin.in_features, lin.out_features
    y = torch.empty(rows, n)
    size, quantize, gemm = (
        (native.q8_row_bytes, kern.q8_rows, kern.gemm8)
        if kernel == "gemm8"
        else (native.q16_row_bytes, kern.q16_rows, kern.gemm16)
    )
    xq = torch.empty(rows, size(k), dtype=torch.uint8)
    times = []
    for _ in range(reps + 1):
        start = time.perf_counter()
        if kernel == "float32":
            lin.dense_into(x, 0, n, y)
        else:
            assert quantize(x.data_ptr(), rows, k, xq.data_ptr()) == 0
            rc = gemm(lin.ggml_type, lin.raw.data_ptr(), xq.data_ptr(), rows, n, k, y.data_ptr(), n)
            assert rc == 0, rc
        times.append(time.perf_counter() - start)
    return 2 * x.numel() * n / min(times[1:]) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--isa", default=None, help="kernel path (default: the chosen one)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--kernel", choices=["gemm8", "gemm16"], default="gemm8")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    native.set_threads(args.threads)
    kern = native.kernels(args.isa)
    assert kern is not None, "the native kernels were not built"
    print(f"{native.cpu_name()}, kernels {kern.isa}, {args.threads} threads, {args.rows} rows")
    print(f"{'type':6} {'out':>6} {'in':>5} {args.kernel:>7} {'float32':>8}  GFLOPS")
    for qtype, out, k in SHAPES:
        make = random_blocks if qtype in (QT.Q4_K, QT.Q6_K) else quantized
        raw = torch.from_numpy(make(qtype, (out, k)).copy())
        lin = NativeLinear(raw, qtype, out, k, kernels=kern, prefill_int8=True)
        x = torch.randn(args.rows, k)
        quantized_x = best_gflops(lin, x, args.kernel, args.reps)
        dense = best_gflops(lin, x, "float32", args.reps)
        takes = gemm8_prefill if args.kernel == "gemm8" else gemm16_prefill
        taken = "" if takes(kern.isa, qtype) else "  (prefill keeps float32)"
        print(f"{qtype.name:6} {out:6} {k:5} {quantized_x:7.0f} {dense:8.0f}{taken}")


if __name__ == "__main__":
    main()
