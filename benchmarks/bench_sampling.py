"""Time of one sampling step over a Gemma 3-sized vocabulary (262,144 tokens), 1 and 8 rows.

    .venv/bin/python benchmarks/bench_sampling.py --threads 2 --steps 300

Logits are normal * 3 (a few tokens far above the rest, as a model's), a fresh batch each step
from a small pool. Columns: sample_rows (the batched step), the same rows one by one through
Sampler.sample, and torch.topk(k + 1) alone on the batch (what the block search replaces).
Medians over --steps steps. Targets: under 1 ms per row with top_k 40, and under 2 ms (5% of a
~40 ms Gemma 3 decode step on the project machine) for the step.
"""

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from ember.sample import SamplingParams
from ember.sample.batched import sample_rows
from ember.sample.sampler import Sampler

VOCAB_SIZE = 262_144
CASES = {
    "top_k 40": SamplingParams(temperature=0.8, top_k=40, top_p=1.0),
    "defaults": SamplingParams(),  # Ollama's: temperature 0.8, top_k 40, top_p 0.9
    "greedy": SamplingParams(temperature=0),
    # bench_parallel.py's rows: end tokens banned, a bias the batch applies in place
    "ban ends": SamplingParams(temperature=0, logit_bias=((1, -100.0), (106, -100.0))),
}


def median_ms(step: Callable[[int], object], steps: int) -> float:
    step(0)  # warm-up
    times = []
    for i in range(steps):
        start = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure(params: SamplingParams, num_rows: int, steps: int) -> tuple[float, float, float]:
    gen = torch.Generator().manual_seed(0)
    pool = [torch.randn(num_rows, VOCAB_SIZE, generator=gen) * 3 for _ in range(4)]
    samplers = [Sampler(SamplingParams(**{**_fields(params), "seed": r})) for r in range(num_rows)]
    batched = median_ms(lambda i: sample_rows(samplers, pool[i % 4]), steps)
    alone = median_ms(
        lambda i: [s.sample(row) for s, row in zip(samplers, pool[i % 4], strict=True)], steps
    )
    topk = median_ms(lambda i: pool[i % 4].topk(params.top_k + 1), steps)
    return batched, alone, topk


def _fields(params: SamplingParams) -> dict[str, object]:
    return {name: getattr(params, name) for name in params.__slots__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"vocabulary {VOCAB_SIZE}, {args.threads} threads, median ms per step over "
        f"{args.steps} steps"
    )
    header = ("options", "rows", "sample_rows", "per row", "Sampler.sample xR", "torch.topk")
    print("{:<10} {:>4} {:>12} {:>8} {:>18} {:>11}".format(*header))
    for name, params in CASES.items():
        for num_rows in (1, 8):
            batched, alone, topk = measure(params, num_rows, args.steps)
            print(
                f"{name:<10} {num_rows:>4} {batched:>12.3f} {batched / num_rows:>8.3f} "
                f"{alone:>18.3f} {topk:>11.3f}"
            )


if __name__ == "__main__":
    main()
