"""Microseconds a layer of one decode token's attention (attend.h through attend_one), over an
f16 cache of S cells, for the bundled models' and the 3B file's head shapes: warm (the same
layer's cache again and again, in the CPU's caches) and cold (28 layers' caches in turn, after
64 MB of other writes, as in a decode step, where each layer's weights pass in between).

    .venv/bin/python benchmarks/bench_attention.py [--cells 576] [--threads 2] [--runs 3]
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ember.backend import native
from ember.backend.attend import attend_one

# name: (query heads, KV heads, head dim)
SHAPES = {
    "smollm2:135m": (9, 3, 64),
    "gemma3:270m": (4, 1, 256),
    "qwen2.5-coder:0.5b": (14, 2, 64),
    "llama-3.2-3b": (24, 8, 128),
}
LAYERS = 28


def time_layers(q: torch.Tensor, caches: list, cells: int) -> float:
    start = time.perf_counter()
    for keys, values in caches:
        attend_one(q, keys[:, :cells], values[:, :cells], None, 0.125)
    return (time.perf_counter() - start) / len(caches) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=576)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"CPU {native.cpu_name()}; kernels {native.chosen_isa()}; {args.threads} threads")
    flush = torch.zeros(16 << 20)  # 64 MB
    for name, (heads, kv_heads, dim) in SHAPES.items():
        q = torch.randn(heads, dim)
        caches = [
            tuple(torch.randn(kv_heads, args.cells, dim).half() for _ in range(2))
            for _ in range(LAYERS)
        ]
        warm, cold = [], []
        for _ in range(args.runs):
            warm.append(min(time_layers(q, [caches[0]] * LAYERS, args.cells) for _ in range(5)))
            for _ in range(5):
                flush.add_(1.0)
                cold.append(time_layers(q, caches, args.cells))
        kv_mb = 2 * kv_heads * args.cells * dim * 2 / 1e6
        print(
            f"{name:20s} {heads:2d}/{kv_heads} heads of {dim:3d}, {kv_mb:.2f} MB a layer: "
            f"warm {min(warm):6.1f} us, cold {min(cold):6.1f} us"
        )


if __name__ == "__main__":
    main()
