"""One mixture-of-experts layer (ember/nn/moe.py) on Q8_0 expert stacks kept as their blocks:
a decode step (one token, k experts) against running every expert, and a prefill batch grouped
by expert against one call per token.

    .venv/bin/python benchmarks/bench_moe.py --threads 2
"""

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants

from ember.backend.weights import expert_linears
from ember.nn.moe import Routing, SwiGLUExperts, mixture, softmax_top_k


def stack(rng: np.random.Generator, shape: tuple[int, int, int]) -> list:
    data = (rng.standard_normal(shape) / shape[-1] ** 0.5).astype(np.float32)
    raw = quants.quantize(data, GGMLQuantizationType.Q8_0).view(np.uint8).reshape(-1)
    return expert_linears(raw, GGMLQuantizationType.Q8_0, shape)


def median_ms(fn: Callable[[], object], runs: int) -> float:
    fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--expert-ffn", type=int, default=512)
    parser.add_argument("--used", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    e, f, c = args.experts, args.expert_ffn, args.hidden
    experts = SwiGLUExperts(stack(rng, (e, f, c)), stack(rng, (e, f, c)), stack(rng, (e, c, f)))
    x = torch.randn(args.tokens, c)
    routing = softmax_top_k(torch.randn(args.tokens, e), args.used, is_normalized=True)
    one = Routing(routing.experts[:1], routing.weights[:1])
    every = Routing(torch.arange(e)[None], torch.full((1, e), 1.0 / e))
    with torch.inference_mode():
        decode = median_ms(lambda: mixture(x[:1], one, experts), args.runs)
        dense = median_ms(lambda: mixture(x[:1], every, experts), args.runs)
        grouped = median_ms(lambda: mixture(x, routing, experts), args.runs)
        per_token = median_ms(
            lambda: [mixture(x[t : t + 1], Routing(routing.experts[t : t + 1],
                     routing.weights[t : t + 1]), experts) for t in range(args.tokens)],
            args.runs,
        )  # fmt: skip
    print(f"{e} experts of {f}x{c} (Q8_0), top-{args.used}, {args.threads} threads")
    print(f"decode, 1 token: {decode:.2f} ms (all {e} experts: {dense:.2f} ms)")
    print(f"prefill, {args.tokens} tokens grouped by expert: {grouped:.1f} ms "
          f"(one token at a time: {per_token:.1f} ms)")  # fmt: skip


if __name__ == "__main__":
    main()
