"""Prefill's float32 matmul: torch.mm (MKL) against ember.backend.gemm (oneDNN in blocks of rows)
on the bundled models' weight-chunk shapes, GFLOPS, and the process's RSS after prompts of every
length from 17 to 512 rows, each way (oneDNN keeps code for every shape it meets).

    .venv/bin/python benchmarks/bench_gemm.py [--threads 2]
"""

import argparse
import time

import torch

from ember.backend import gemm, native

# (in, weight rows of one chunk): SmolLM2 576, Gemma 3 640 and 2048, Qwen 0.5B 896 and 4864
SHAPES = [(576, 512), (640, 512), (2048, 320), (896, 512), (4864, 448)]


def gflops(fn, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, reps: int = 20) -> float:
    fn(x, w, out)
    start = time.perf_counter()
    for _ in range(reps):
        fn(x, w, out)
    return 2 * x.shape[0] * x.shape[1] * w.shape[0] * reps / (time.perf_counter() - start) / 1e9


def torch_mm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return torch.mm(x, w.t(), out=out)


def rss_mb() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 >> 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"CPU {native.cpu_name()}, {args.threads} threads, oneDNN {gemm.available()}")
    print(f"{'rows':>5} {'in':>5} {'out':>5} {'torch.mm':>9} {'gemm':>7}")
    for rows in (512, 300, 128):
        for k, n in SHAPES:
            x, w, out = torch.randn(rows, k), torch.randn(n, k), torch.empty(rows, n)
            mm, ours = (gflops(fn, x, w, out) for fn in (torch_mm, gemm.matmul_into))
            print(f"{rows:>5} {k:>5} {n:>5} {mm:>9.0f} {ours:>7.0f}")
    for name, fn in [("torch.mm", torch_mm), ("gemm", gemm.matmul_into)]:
        before = rss_mb()
        for rows in range(17, 513):
            for k, n in SHAPES[:3]:
                fn(torch.randn(rows, k), torch.randn(n, k), torch.empty(rows, n))
        print(f"RSS after rows 17..512 x {len(SHAPES[:3])} shapes, {name}: +{rss_mb() - before} MB")


if __name__ == "__main__":
    main()
