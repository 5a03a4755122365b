"""Decode time per generated token on SmolLM2 with and without a format (structured outputs).

    .venv/bin/python benchmarks/bench_constrained.py --model smollm2:135m --threads 2 --runs 5

Each run generates from the same prompt and seed three ways, interleaved: free text, format
"json", and a JSON schema whose long string field lets the output reach --gen-tokens. The figure
is eval_duration / eval_count of the GenerateResult (the prompt excluded), median over the runs.
Target: a format adds under 20% to the decode step (the mask is computed beside the forward pass).
"""

import argparse
import statistics

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 40},
        "mood": {"enum": ["happy", "sad", "tense"]},
        "story": {"type": "string"},
    },
    "required": ["title", "mood", "story"],
    "additionalProperties": False,
}
PROMPT = "Write a long story about a dragon and a lighthouse keeper, as JSON."
FORMATS: dict[str, str | dict | None] = {"none": None, "json": "json", "schema": SCHEMA}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2:135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--gen-tokens", type=int, default=128)
    args = parser.parse_args()

    from ember import LLM

    llm = LLM(args.model, num_threads=args.threads)
    options = {"temperature": 0.8, "seed": 7, "num_predict": args.gen_tokens}
    per_token: dict[str, list[float]] = {name: [] for name in FORMATS}
    counts: dict[str, list[int]] = {name: [] for name in FORMATS}
    llm.generate(PROMPT, options={**options, "num_predict": 8})  # warm-up
    for _ in range(args.runs):
        for name, fmt in FORMATS.items():
            result = llm.generate(PROMPT, options=options, format=fmt)
            per_token[name].append(result.eval_duration / max(result.eval_count, 1) / 1e6)
            counts[name].append(result.eval_count)
    llm.close()
    print(
        f"model {args.model}, {args.threads} threads, up to {args.gen_tokens} tokens, "
        f"median of {args.runs} interleaved runs"
    )
    print("{:<8} {:>12} {:>10} {:>14}".format("format", "ms / token", "tokens", "vs none"))
    base = statistics.median(per_token["none"])
    for name in FORMATS:
        ms = statistics.median(per_token[name])
        tokens = statistics.median(counts[name])
        print(f"{name:<8} {ms:>12.2f} {tokens:>10.0f} {100 * (ms / base - 1):>+13.1f}%")


if __name__ == "__main__":
    main()
