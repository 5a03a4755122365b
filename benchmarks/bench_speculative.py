"""Speculative decoding by prompt lookup: decode speed of a code-editing prompt (the answer repeats
most of the prompt) with and without `draft_ngram`, on the runner's engine.

    .venv/bin/python benchmarks/bench_speculative.py --model qwen2.5-coder:0.5b --runs 3

One engine in this process; runs alternate plain / drafted so that a noisy machine hits both
alike; each run evaluates the prompt again (no cached prefix) and generates --gen-tokens greedy
tokens. Prints the medians of decode tokens/s (eval_count / eval_duration, as Ollama reports it),
the acceptance rate, and whether the tokens of both ways were identical in every run.
"""

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from code_edit_prompt import CODE_EDIT_PROMPT

from ember import LLM
from ember.options import Options
from ember.runner.sequence import Done, Request


def generate(llm: LLM, prompt: list[int], options: dict) -> tuple[list[int], Done]:
    engine = llm.engine_for(Options.parse(options))
    engine.inputs.slots[0].inputs.clear()  # no prefix reuse: every run evaluates the prompt
    engine.cache.remove(0, 0, None)
    seq = engine.submit(Request(prompt, Options.parse(options)))
    while not isinstance(event := seq.events.get(), Done):
        pass
    return list(seq.generated), event


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder:0.5b")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--gen-tokens", type=int, default=64)
    parser.add_argument("--draft", type=int, default=8, help="draft_ngram: tokens per step")
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    llm = LLM(args.model, num_parallel=1)
    prompt = llm.prompt_ids(CODE_EDIT_PROMPT)
    base = {"temperature": 0, "num_predict": args.gen_tokens, "num_ctx": 1024}
    speeds: dict[int, list[float]] = {0: [], args.draft: []}
    proposed = accepted = 0
    identical = True
    for run in range(args.runs):
        tokens = {}
        for k in (0, args.draft):
            tokens[k], done = generate(llm, prompt, {**base, "draft_ngram": k})
            speeds[k].append(done.eval_count / done.eval_duration * 1e9)
            if k:
                proposed += done.draft_proposed or 0
                accepted += done.draft_accepted or 0
            print(f"run {run + 1} draft_ngram={k}: {speeds[k][-1]:.1f} tok/s", flush=True)
        identical &= tokens[0] == tokens[args.draft]
    plain, drafted = statistics.median(speeds[0]), statistics.median(speeds[args.draft])
    print(f"model {args.model}, prompt {len(prompt)} tokens, {args.gen_tokens} greedy tokens")
    print(f"plain decoding:          {plain:6.1f} tok/s (median of {args.runs})")
    print(f"draft_ngram={args.draft}:           {drafted:6.1f} tok/s ({drafted / plain:.2f}x)")
    print(f"acceptance: {accepted}/{proposed} drafted tokens ({accepted / max(proposed, 1):.0%})")
    print(f"tokens identical in every run: {identical}")


if __name__ == "__main__":
    main()
