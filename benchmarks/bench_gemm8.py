"""Prefill's int8 product (gemm8: x rounded to int8 per 32 values, native/gemm8.h) against the
float32 path (the weight expanded in chunks, then oneDNN or torch.mm), GFLOPS, on the MLP gate/up
shapes of the bundled models and the 3B file, random weights of their types, 512 rows of x.

    .venv/bin/python benchmarks/bench_gemm8.py [--isa avx512] [--threads 2] [--rows 512]

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
from ember.backend.precision import gemm8_prefill
from ember.backend.weights import NativeLinear

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "backend"))
from quant_data import quantized, random_blocks

# (type, out, in): SmolLM2's Q4_1 gate/up, Gemma 3's and Qwen 0.5B's Q5_0, the 3B file's Q4_K,
# and Q6_K (a down projection's type, for its 16-value units) at the 3B file's width
SHAPES = [
    (QT.Q4_1, 3072, 576),
    (QT.Q5_0, 4096, 640),
    (QT.Q5_0, 9728, 896),
    (QT.Q4_K, 16384, 3072),
    (QT.Q6_K, 3072, 3072),
    (QT.Q8_0, 4096, 640),
]


def best_gflops(lin: NativeLinear, x: torch.Tensor, int8: bool, reps: int) -> float:
    """The best of `reps` products of x and the whole weight by one path, in GFLOPS."""
    y = torch.empty(x.shape[0], lin.out_features)
    times = []
    for _ in range(reps + 1):
        start = time.perf_counter()
        if int8:
            lin.int8_into(lin.quantize_rows(x), 0, lin.out_features, y)
        else:
            lin.dense_into(x, 0, lin.out_features, y)
        times.append(time.perf_counter() - start)
    return 2 * x.numel() * lin.out_features / min(times[1:]) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--isa", default=None, help="kernel path (default: the chosen one)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    native.set_threads(args.threads)
    kern = native.kernels(args.isa)
    assert kern is not None, "the native kernels were not built"
    print(f"{native.cpu_name()}, kernels {kern.isa}, {args.threads} threads, {args.rows} rows")
    print(f"{'type':6} {'out':>6} {'in':>5} {'gemm8':>7} {'float32':>8}  GFLOPS")
    for qtype, out, k in SHAPES:
        make = random_blocks if qtype in (QT.Q4_K, QT.Q6_K) else quantized
        raw = torch.from_numpy(make(qtype, (out, k)).copy())
        lin = NativeLinear(raw, qtype, out, k, kernels=kern, prefill_int8=True)
        x = torch.randn(args.rows, k)
        int8 = best_gflops(lin, x, True, args.reps)
        dense = best_gflops(lin, x, False, args.reps)
        taken = "" if gemm8_prefill(kern.isa, qtype) else "  (prefill keeps float32)"
        print(f"{qtype.name:6} {out:6} {k:5} {int8:7.0f} {dense:8.0f}{taken}")


if __name__ == "__main__":
    main()
