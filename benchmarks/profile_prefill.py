"""Where one prompt's time goes: each block weight by role and GGUF type (gemm8, the native
kernel or the float32 path, as the weight chooses for that many rows), attention, the output
head, and the rest (norms, RoPE, the cache, Python).

    .venv/bin/python benchmarks/profile_prefill.py --model qwen2.5-coder:0.5b
    EMBER_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \\
        .venv/bin/python benchmarks/profile_prefill.py --model gemma3:270m

Each pass evaluates the same prompt of --tokens tokens from an empty cache (one batch, as the
runner takes a prompt up to num_batch); the first warms up, the best of --passes is printed.
Timers wrap Python calls (~1 µs each), so "other" includes their cost.
"""

import argparse
import sys
import time
from typing import Any

import torch
from profile_decode import TIMED_WEIGHTS, Timers, _Proxy

from ember.batch import Batch
from ember.catalog import resolve_model
from ember.gguf import GGUFFile
from ember.model import load_model


def instrument(model: Any, timers: Timers) -> None:
    """Timers around every block weight (named by role and type), attention and the head."""
    for block in model.blocks:
        for name in TIMED_WEIGHTS:
            w = getattr(block, name)
            label = f"{name} {getattr(w, 'kind', type(w).__name__)}"
            setattr(block, name, _Proxy(w, timers.wrap(label, w)))
    for mod in list(sys.modules.values()):  # every arch module's own name for attention
        if getattr(mod, "__name__", "").startswith("ember.model.archs.") and hasattr(
            mod, "attention"
        ):
            mod.attention = timers.wrap("attention", mod.attention)
    model.output = _Proxy(model.output, timers.wrap("output head", model.output))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2:135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    model: Any = load_model(GGUFFile.open(str(resolve_model(args.model))))
    ids = [(i * 7919) % 1000 + 10 for i in range(args.tokens)]

    def prompt() -> float:
        cache: Any = model.make_cache()
        cache.init(max_sequences=1, capacity=args.tokens + 8, max_batch=args.tokens)
        batch = Batch.single(ids, 0)
        start = time.perf_counter()
        cache.start_forward(batch)
        with torch.inference_mode():
            model.forward(batch, cache)
        return time.perf_counter() - start

    prompt()  # warm up: oneDNN's code for each shape, the pages of the weights
    timers = Timers()
    instrument(model, timers)
    best, parts = float("inf"), {}
    for _ in range(args.passes):
        timers.total.clear()
        timers.on = True
        took = prompt()
        timers.on = False
        if took < best:
            best, parts = took, dict(timers.total)

    print(
        f"model {args.model}, {args.threads} threads, a {args.tokens}-token prompt: "
        f"{best * 1e3:.0f} ms = {args.tokens / best:.1f} tok/s (best of {args.passes})"
    )
    print(f"{'part':<36} {'ms':>8} {'share':>6}")
    for name, total in sorted(parts.items(), key=lambda kv: -kv[1]):
        print(f"{name:<36} {total * 1e3:>8.1f} {total / best:>6.1%}")
    other = best - sum(parts.values())
    print(f"{'other (norms, rope, cache, python)':<36} {other * 1e3:>8.1f} {other / best:>6.1%}")


if __name__ == "__main__":
    main()
