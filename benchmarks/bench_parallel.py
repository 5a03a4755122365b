"""Aggregate generation speed with 1, 4 and 8 parallel sequences on one engine (continuous
batching over one KV cache).

    .venv/bin/python benchmarks/bench_parallel.py --model smollm2:135m --threads 2 --runs 3

N requests with different prompts are submitted at once to an engine with N slots; each
generates --gen-tokens tokens greedily (end tokens banned by a logit bias, so that none ends
first: the kernels' rounding on each ISA path moves where a greedy text would end). The
figure is the generated tokens of all sequences over the wall time from the last prompt's
first token to the last sequence's end (first tokens excluded): decode throughput.

When llama-cpp-python is installed, llama.cpp runs the same prompts on the same GGUF file in the
same run (`--engines ember llama.cpp`): N sequences over one context, one llama_decode of N rows
per step (its own continuous batching), the same count of tokens.
"""

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time

from bench_generate import peer_failure

_QUIET: object = None  # llama.cpp's log callback, alive as long as the process

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
    ban_ends = tuple((t, float("-inf")) for t in sorted(tokenizer.eos_ids))
    seqs = [
        engine.submit(Request(tokenizer.encode(PROMPTS[i]), opts, logit_bias=ban_ends))
        for i in range(n)
    ]
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


def run_llama_cpp(path: str, n: int, gen: int, threads: int) -> float:
    """llama.cpp's aggregate decode rate for n sequences: each step decodes one token of every
    sequence in one batch (prompts first, each as its own sequence)."""
    import llama_cpp as lc
    import numpy as np

    global _QUIET
    _QUIET = lc.llama_log_callback(lambda *_: None)  # kept alive: llama.cpp calls it later
    lc.llama_log_set(_QUIET, None)
    model = lc.llama_model_load_from_file(path.encode(), lc.llama_model_default_params())
    params = lc.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_seq_max = 256 * n, 512, n
    params.n_threads = params.n_threads_batch = threads
    ctx = lc.llama_init_from_model(model, params)
    vocab = lc.llama_model_get_vocab(model)
    n_vocab = lc.llama_vocab_n_tokens(vocab)
    batch = lc.llama_batch_init(512, 0, n)

    def decode(rows: list[tuple[int, int, int, bool]]) -> None:
        batch.n_tokens = len(rows)
        for i, (token, pos, seq, wants_logits) in enumerate(rows):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, wants_logits
        if lc.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")

    def argmax(row: int) -> int:
        logits = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, row), shape=(n_vocab,))
        return int(np.argmax(logits))

    prompts = [_llama_tokens(vocab, PROMPTS[i]) for i in range(n)]
    last, pos = [], []
    for seq, ids in enumerate(prompts):
        decode([(t, p, seq, p == len(ids) - 1) for p, t in enumerate(ids)])
        last.append(argmax(len(ids) - 1))
        pos.append(len(ids))
    start = time.perf_counter_ns()
    for _ in range(gen - 1):  # the first tokens came with the prompts, as in `run`
        decode([(last[s], pos[s], s, True) for s in range(n)])
        last = [argmax(s) for s in range(n)]
        pos = [p + 1 for p in pos]
    rate = n * (gen - 1) / ((time.perf_counter_ns() - start) / 1e9)
    lc.llama_batch_free(batch)
    lc.llama_free(ctx)
    lc.llama_model_free(model)
    return rate


def _llama_tokens(vocab, text: str) -> list[int]:
    import llama_cpp as lc

    buf = (lc.llama_token * 512)()
    count = lc.llama_tokenize(vocab, text.encode(), len(text.encode()), buf, 512, False, True)
    return list(buf[:count])


def llama_cpp_worker(args: argparse.Namespace) -> None:
    """One llama.cpp measurement in its own process (its threads never meet torch's)."""
    rate = run_llama_cpp(args.path, args.parallel[0], args.gen_tokens, args.threads)
    print(json.dumps({"rate": rate}))


def llama_cpp_rate(path: str, n: int, args: argparse.Namespace) -> float:
    cmd = [sys.executable, __file__, "--worker", "--path", path, "--parallel", str(n)]
    cmd += ["--threads", str(args.threads), "--gen-tokens", str(args.gen_tokens)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout.strip().splitlines()[-1])["rate"])


def has_llama_cpp() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2:135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gen-tokens", type=int, default=96)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--parallel", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return llama_cpp_worker(args)

    import torch

    from ember.backend.threads import in_fresh_thread
    from ember.catalog import resolve_model
    from ember.gguf import GGUFFile
    from ember.model import load_model
    from ember.runner.engine import Engine
    from ember.tokenizer import Tokenizer

    torch.set_num_threads(args.threads)
    path = str(resolve_model(args.model))
    gguf = GGUFFile.open(path)
    tokenizer = Tokenizer.from_metadata(gguf.metadata)
    model = in_fresh_thread(lambda: load_model(gguf))  # the engine's thread computes alone
    engine = Engine(
        model, tokenizer, num_parallel=max(args.parallel), num_ctx=256, num_batch=512
    )
    run(engine, tokenizer, 1, 8)  # warm-up
    peers = has_llama_cpp()
    rates: dict[int, list[float]] = {n: [] for n in args.parallel}
    theirs: dict[int, list[float]] = {n: [] for n in args.parallel}
    why = ""  # why llama.cpp gave no figures, once its worker failed
    for _ in range(args.runs):
        for n in args.parallel:  # interleaved, so machine noise spreads over every n
            rate, tokens = run(engine, tokenizer, n, args.gen_tokens)
            assert tokens == n * args.gen_tokens, "a sequence ended early"
            rates[n].append(rate)
            if peers and not why:
                try:
                    theirs[n].append(llama_cpp_rate(path, n, args))
                except subprocess.CalledProcessError as err:
                    why = peer_failure(err)  # the peer's crash leaves Ember's figures
    engine.close()
    single = statistics.median(rates[args.parallel[0]])
    print(f"model {args.model}, {args.threads} threads, {args.gen_tokens} tokens per sequence")
    header = ("sequences", "Ember tok/s", "vs first", "llama.cpp tok/s", "ratio")
    print("{:>9} {:>12} {:>9} {:>16} {:>6}".format(*header))
    for n in args.parallel:
        median = statistics.median(rates[n])
        peer = statistics.median(theirs[n]) if theirs[n] else float("nan")
        ratio = median / peer
        print(f"{n:>9} {median:>12.1f} {median / single:>8.2f}x {peer:>16.1f} {ratio:>5.2f}x")
    if not peers:
        print("(llama-cpp-python is not installed: no llama.cpp figures in this run)")
    elif why:
        print(f"llama.cpp: no figures after its failure {why}")


if __name__ == "__main__":
    main()
