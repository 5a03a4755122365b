"""How close Ember's logits and greedy runs are to the transformers references.

    .venv/bin/python benchmarks/closeness.py

Per model and prompt: the largest difference over the reference's top-20 first-step logits
(absolute, and relative to max |logit|), and how many of the 32 greedy tokens agree in a row,
beside the first step whose reference gap to the runner-up is below 0.2 and below 0.05.
"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from conftest import REFERENCE_DIRS, REFERENCE_KEYS
from model.test_reference import PROMPTS, run_prompt

from ember import LLM


def first_below(gaps: list[float], limit: float) -> int | str:
    return next((i for i, g in enumerate(gaps) if g < limit), "none")


def main() -> None:
    print(
        f"{'model':<20} {'prompt':<24} {'top20 abs':>9} {'rel':>8} {'greedy':>6} "
        f"{'gap<0.2@':>8} {'gap<0.05@':>9}"
    )
    for name, prompts in PROMPTS.items():
        llm = LLM(name)
        key = REFERENCE_KEYS[name]
        path = next(
            d / f"{key}.reference.json"
            for d in REFERENCE_DIRS
            if (d / f"{key}.reference.json").exists()
        )
        ref = json.loads(path.read_text())["prompts"]
        for prompt in prompts:
            r = ref[prompt]
            first, ids, _ = run_prompt(llm, r["prompt_ids"], r["greedy"]["n_steps"])
            top, expected = r["first_step"]["top_ids"], torch.tensor(r["first_step"]["top_logits"])
            diff = float((first[top] - expected).abs().max())
            agree = next(
                (i for i, (a, b) in enumerate(zip(ids, r["greedy"]["ids"], strict=True)) if a != b),
                len(ids),
            )
            gaps = r["greedy"]["gap_to_second"]
            print(
                f"{name:<20} {prompt:<24} {diff:>9.5f} {diff / float(expected.abs().max()):>8.1e} "
                f"{agree:>3}/32 {first_below(gaps, 0.2)!s:>8} {first_below(gaps, 0.05)!s:>9}"
            )


if __name__ == "__main__":
    main()
