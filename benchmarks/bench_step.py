"""Decode speed of the model's forward alone (no engine, no sampler but argmax): one sequence
stepping after a prompt, and --sequences sequences stepping together, one row each a step.
For A/B runs of two builds of the native library, alternated by the caller.

    .venv/bin/python benchmarks/bench_step.py --model smollm2:135m --sequences 1 8
    .venv/bin/python benchmarks/bench_step.py --sequences 8 --caches 6

--caches N runs each count of sequences over N fresh caches, one after the other, in the same
process: a speed that changes from one cache to the next tells of memory placement (the native
layer's scratch, before it was aligned to cache lines, made SmolLM2's eight sequences run at
~510 or ~650 tok/s by where the heap put it).
"""

import argparse
import time

import torch
from kernel_choices import add_kernel_choices, apply_kernel_choices

from ember.batch import Batch
from ember.catalog import resolve_model
from ember.gguf import GGUFFile
from ember.model import Model, forward, load_model


def steps_per_second(model: Model, sequences: int, prompt: int, steps: int) -> float:
    cache = model.make_cache()
    cache.init(
        max_sequences=sequences,
        capacity=sequences * (prompt + steps + 8),
        max_batch=512,
        dtype="f16",
    )
    tokens = []
    for s in range(sequences):  # a different prompt each, so their rows differ
        ids = list(range(100 + s, 100 + s + prompt))
        logits = forward(model, cache, Batch.single(ids, 0, seq=s))
        tokens.append(int(logits[-1].argmax()))
    start = time.perf_counter()
    for i in range(steps):
        batch = Batch(
            tokens=tuple(tokens),
            positions=(prompt + i,) * sequences,
            sequences=tuple(range(sequences)),
            outputs=tuple(range(sequences)),
        )
        tokens = [int(t) for t in forward(model, cache, batch).argmax(-1)]
    return steps * sequences / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2:135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sequences", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--caches", type=int, default=1, help="fresh caches a count runs on")
    add_kernel_choices(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    apply_kernel_choices(args)
    model = load_model(GGUFFile.open(resolve_model(args.model)))
    for n in args.sequences:
        rates = [
            steps_per_second(model, n, args.prompt_tokens, args.steps) for _ in range(args.caches)
        ]
        print(f"{args.model}: {n} sequences, " + ", ".join(f"{r:.1f}" for r in rates) + " tok/s")


if __name__ == "__main__":
    main()
