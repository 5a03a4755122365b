"""The gated delta rule (ember/nn/delta_rule.py) at a Qwen3.5 DeltaNet layer's shape (16 value
heads of 128 x 128 by default): one decode token (`step`) and a prompt in blocks (`chunked`),
milliseconds a layer, medians.

    .venv/bin/python benchmarks/bench_delta_rule.py --heads 16 --dim 128 --prompt 512
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from ember.nn import delta_rule


def timed(fn, runs: int) -> float:  # type: ignore[no-untyped-def]
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    h, d, n = args.heads, args.dim, args.prompt
    gen = torch.Generator().manual_seed(0)
    q = F.normalize(torch.randn(n, h, d, generator=gen), dim=-1) * d**-0.5
    k = F.normalize(torch.randn(n, h, d, generator=gen), dim=-1)
    v, g = torch.randn(n, h, d, generator=gen), -torch.rand(n, h, generator=gen)
    beta, state = torch.rand(n, h, generator=gen), torch.zeros(h, d, d)
    step = timed(lambda: delta_rule.step(state, q[0], k[0], v[0], g[0], beta[0]), args.runs * 10)
    prompt = timed(lambda: delta_rule.chunked(state, q, k, v, g, beta), args.runs)
    print(f"{h} heads of {d} x {d}, {torch.get_num_threads()} threads")
    print(f"decode token: {step:.3f} ms a layer")
    print(f"prompt of {n}: {prompt:.1f} ms a layer ({prompt / n * 1000:.0f} us a token)")


if __name__ == "__main__":
    main()
