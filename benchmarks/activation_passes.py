"""How far one q8_K pass over a K-type weight's input moves a real model from two passes.

    .venv/bin/python benchmarks/activation_passes.py --model /tmp/q15/model.gguf --steps 64

Ember quantizes the input of a K-type weight to int8 per 256 values (llama.cpp's q8_K). Two
passes (the input, then what the first left out) are as close as float32 activations (~1e-5);
one pass is llama.cpp's precision and ~2/3 of the work, taken by default everywhere but the
down projections (`ember/backend/weights.py`'s activation_passes). For each prompt this prints
the first step's logits with one pass against two (largest difference over the two-pass top 20,
relative to their largest magnitude, the reference tests' measure), and the greedy tokens:
the first step where they part and the two-pass top-2 gap there.
"""

import argparse
from unittest import mock

import torch

from ember import LLM
from ember.batch import Batch
from ember.model import forward

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Why is the sky blue? Explain in two sentences.",
    "Write a haiku about the sea.\n",
]


def run(llm: LLM, ids: list[int], steps: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model, cache = llm.model, llm.model.make_cache()
    cache.init(max_sequences=1, capacity=len(ids) + steps, max_batch=512, dtype="f32")
    logits = forward(model, cache, Batch.single(ids, 0))[0]
    seen = [logits.clone()]
    for step in range(steps - 1):
        token = int(logits.argmax())
        logits = forward(model, cache, Batch.single([token], len(ids) + step))[0]
        seen.append(logits.clone())
    return seen[0], seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--steps", type=int, default=64)
    args = parser.parse_args()
    one = LLM(args.model)
    with mock.patch("ember.model.weights.activation_passes", lambda name: 2):
        two = LLM(args.model)
    for prompt in PROMPTS:
        ids = one.tokenize(prompt)
        first1, seq1 = run(one, ids, args.steps)
        first2, seq2 = run(two, ids, args.steps)
        top = first2.topk(20).indices
        rel = float((first1[top] - first2[top]).abs().max() / first2[top].abs().max())
        part, gap = None, None
        for step, (a, b) in enumerate(zip(seq1, seq2, strict=True)):
            if int(a.argmax()) != int(b.argmax()):
                top2 = b.topk(2).values
                part, gap = step, float(top2[0] - top2[1])
                break
        # after a parting the sequences' inputs differ: stop comparing there
        where = f"part at step {part} (two-pass gap {gap:.3f})" if part is not None else "same"
        print(f"{prompt[:30]!r:34} top-20 max rel diff {rel:.4f}; greedy {args.steps}: {where}")


if __name__ == "__main__":
    main()
