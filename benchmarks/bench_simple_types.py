"""GB/s of weight bytes read by the 32-element types' products (simple.h through kernels.c; and
the K-quant mixes' Q4_K, Q5_K, Q6_K: kquants.h, vnni.h, amx.h; --types, K of whole 256s): rows
of activations (one for a decode step, --rows more for several sequences) against a weight far
larger than the caches, so read from memory as a decode step reads it (Gemma 3's tied Q8_0 head
is 179 MB of rows of 640), for each thread count; and ns a block and row of x.

    .venv/bin/python benchmarks/bench_simple_types.py [--k 640] [--mib 100] [--types Q8_0 ...]
        [--rows 1 4 8] [--isa avx2] [--slow-gathers 0|1]
"""

import argparse
import time

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants

from ember.backend import native
from ember.store.kquants import quantize_q4_k, quantize_q5_k, quantize_q6_k

TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
# gguf-py does not quantize these: Ember's own encoders (byte for byte llama.cpp's)
K_QUANTIZERS = {"Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--k", type=int, default=640, help="row length (Gemma 3's hidden size)")
    parser.add_argument("--mib", type=int, default=100, help="weight size")
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--types", nargs="+", default=TYPES, choices=[*TYPES, *K_QUANTIZERS])
    parser.add_argument("--rows", type=int, nargs="+", default=[1], help="rows of x")
    parser.add_argument("--isa", help="a lower ISA path than this CPU's best (EMBER_CPU_ISA)")
    parser.add_argument(
        "--slow-gathers",
        type=int,
        choices=[0, 1],
        help="vnni.h's rows as chosen where gathers are slow (1: AMD's) or not (0: Intel's); "
        "default: this CPU's",
    )
    args = parser.parse_args()
    kernels = native.kernels(args.isa)
    if kernels is None:
        raise SystemExit("the native library was not built")
    if args.slow_gathers is not None:
        native.set_slow_gathers(bool(args.slow_gathers))
    print(f"kernels={kernels.isa}, K={args.k}, best of {args.runs}")
    rng = np.random.default_rng(0)
    for name in args.types:
        qtype = GGMLQuantizationType[name]
        values = rng.standard_normal((4096, args.k), dtype=np.float32)
        if name in K_QUANTIZERS:
            block = K_QUANTIZERS[name](values)
        else:
            block = quants.quantize(values, qtype)
        w = np.ascontiguousarray(np.concatenate([block] * max(1, (args.mib << 20) // block.nbytes)))
        n = w.shape[0]
        for rows in args.rows:
            x, y = torch.randn(rows, args.k), torch.empty(rows, n)
            for threads in args.threads:
                native.set_threads(threads)
                best = float("inf")
                for _ in range(args.runs):
                    start = time.perf_counter()
                    kernels.matmul(
                        int(qtype), w.ctypes.data, x.data_ptr(), y.data_ptr(), rows, n, args.k, 2
                    )
                    best = min(best, time.perf_counter() - start)
                per_block = best * 1e9 / (n * args.k // 32 * rows)
                print(
                    f"{name} {w.nbytes >> 20} MiB, {rows} rows, {threads} threads: "
                    f"{w.nbytes / best / 1e9:5.1f} GB/s, {per_block:.2f} ns a block and row"
                )


if __name__ == "__main__":
    main()
