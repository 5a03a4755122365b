"""Aggregate generation speed with 1, 4 and 8 parallel sequences on one engine (continuous
batching over one KV cache).

    .venv/bin/python benchmarks/bench_parallel.py --model smollm2:135m --threads 2 --runs 3

N requests with different prompts are submitted at once to an engine with N slots; each
generates --gen-tokens tokens greedily (prompts chosen so that no end token comes first). The
figure is the generated tokens of all sequences over the wall time from the last prompt's
first token to the last sequence's end (first tokens excluded): decode throughput.
"""

import argparse
import statistics
import time

PROMPTS = [
    "Once upon a time, in a village by the sea,",
    "The history of the printing press begins",
    "Here is a long list of fruits: apple, banana,",
    "Chapter 1. The train left the station at dawn and",
    "In the beginning of the twentieth century, physics",
    "Dear diary, today I walked to the old mill and",
    "The list of prime numbers goes 2, 3, 5, 7, 11,",
    "A detailed guide to the rivers of Europe: the Danube",
]


def run(engine, tokenizer, n: int, gen: int) -> tuple[float, int]:
    from ember.options import Options
    from ember.runner.sequence import Done, Piece, Request

    opts = Options(temperature=0, num_predict=gen)
    seqs = [engine.submit(Request(tokenizer.encode(PROMPTS[i]), opts)) for i in range(n)]
    first: list[int] = []
    tokens = 0
    for seq in seqs:
        while not isinstance(event := seq.events.get(), Done):
            assert isinstance(event, Piece)
        first.append(seq.first_token)
        tokens += event.eval_count
    end = time.perf_counter_ns()
    # every first token comes with its prompt's batch: count the tokens decoded after them
    return (tokens - n) / ((end - max(first)) / 1e9), tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2:135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gen-tokens", type=int, default=96)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--parallel", type=int, nargs="+", default=[1, 4, 8])
    args = parser.parse_args()

    import torch

    from ember.backend.threads import in_fresh_thread
    from ember.catalog import resolve_model
    from ember.gguf import GGUFFile
    from ember.model import load_model
    from ember.runner.engine import Engine
    from ember.tokenizer import Tokenizer

    torch.set_num_threads(args.threads)
    gguf = GGUFFile.open(resolve_model(args.model))
    tokenizer = Tokenizer.from_metadata(gguf.metadata)
    model = in_fresh_thread(lambda: load_model(gguf))  # the engine's thread computes alone
    engine = Engine(
        model, tokenizer, num_parallel=max(args.parallel), num_ctx=256, num_batch=512
    )
    run(engine, tokenizer, 1, 8)  # warm-up
    rates: dict[int, list[float]] = {n: [] for n in args.parallel}
    for _ in range(args.runs):
        for n in args.parallel:  # interleaved, so machine noise spreads over every n
            rate, tokens = run(engine, tokenizer, n, args.gen_tokens)
            assert tokens == n * args.gen_tokens, "a sequence ended early: pick other prompts"
            rates[n].append(rate)
    engine.close()
    single = statistics.median(rates[args.parallel[0]])
    print(f"model {args.model}, {args.threads} threads, {args.gen_tokens} tokens per sequence")
    print(f"{'sequences':>9} {'tok/s (aggregate)':>18} {'vs first':>9}")
    for n in args.parallel:
        median = statistics.median(rates[n])
        print(f"{n:>9} {median:>18.1f} {median / single:>8.2f}x")


if __name__ == "__main__":
    main()
