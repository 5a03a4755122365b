"""GB/s of weight bytes read by the 32-element types' products (simple.h through kernels.c; and
the K-quant mixes' Q4_K, Q5_K, Q6_K: kquants.h, vnni.h, amx.h; --types, K of whole 256s): rows
of activations (one for a decode step, --rows more for several sequences) against a weight far
larger than the caches, so read from memory as a decode step reads it (Gemma 3's tied Q8_0 head
is 179 MB of rows of 640), for each thread count; and ns a block and row of x.

    .venv/bin/python benchmarks/bench_simple_types.py [--k 640] [--mib 100] [--types Q8_0 ...]
        [--rows 1 4 8] [--isa avx2] [--passes 1|2] [--lanes-x8 0|1]
"""

import argparse
import time

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants
from kernel_choices import add_kernel_choices, apply_kernel_choices

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
        "--passes",
        type=int,
        choices=[1, 2],
        default=2,
        help="the weight's activation passes (1: a one-pass weight, as q/k/v and gate/up: a K "
        "type's x then takes one q8_K pass)",
    )
    add_kernel_choices(parser)
    args = parser.parse_args()
    kernels = native.kernels(args.isa)
    if kernels is None:
        raise SystemExit("the native library was not built")
    apply_kernel_choices(args)
    print(f"kernels={kernels.isa}, K={args.k}, passes {args.passes}, best of {args.runs}")
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
                        int(qtype),
                        w.ctypes.data,
                        x.data_ptr(),
                        y.data_ptr(),
                        rows,
                        n,
                        args.k,
                        args.passes,
                    )
                    best = min(best, time.perf_counter() - start)
                per_block = best * 1e9 / (n * args.k // 32 * rows)
                print(
                    f"{name} {w.nbytes >> 20} MiB, {rows} rows, {threads} threads: "
                    f"{w.nbytes / best / 1e9:5.1f} GB/s, {per_block:.2f} ns a block and row"
                )


if __name__ == "__main__":
    main()
