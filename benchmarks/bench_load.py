"""How long a user waits for the first token of a model not yet loaded, at the engine's defaults
(4 sequences × 4096 tokens of f16 KV cache, batches of 512): loading the file, reserving the
memory (the KV cache allocated, a batch's activations checked), and a short prompt's first
token; beside llama.cpp (llama-cpp-python) on the same file with the same 16384-cell context.

    .venv/bin/python benchmarks/bench_load.py --model /tmp/llama3b-q4_k_m.gguf --runs 3

Each run is a fresh process (the page cache stays warm after the first); medians are printed.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

PROMPT = "Why is the sky blue?"


def run_ember(path: str, threads: int) -> dict:
    from ember import LLM
    from ember.options import Options

    t0 = time.perf_counter()
    llm = LLM(path, num_threads=threads)
    t1 = time.perf_counter()
    llm.engine_for(Options.parse({}))  # the reservation, as the first request makes it
    t2 = time.perf_counter()
    llm.generate(PROMPT, raw=True, options={"num_predict": 1})  # raw: as llama.cpp's
    t3 = time.perf_counter()
    return {"load_s": t1 - t0, "reserve_s": t2 - t1, "first_token_s": t3 - t2}


def run_llama_cpp(path: str, threads: int) -> dict:
    from llama_cpp import Llama

    t0 = time.perf_counter()
    llm = Llama(
        model_path=path, n_ctx=4 * 4096, n_batch=512, n_threads=threads,
        n_threads_batch=threads, verbose=False,
    )  # fmt: skip
    t1 = time.perf_counter()
    llm.create_completion(PROMPT, max_tokens=1)
    t2 = time.perf_counter()
    return {"load_s": t1 - t0, "reserve_s": 0.0, "first_token_s": t2 - t1}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2:135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--worker", choices=["ember", "llama.cpp"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    from ember.catalog import resolve_model

    path = str(resolve_model(args.model))
    if args.worker:
        run = run_ember if args.worker == "ember" else run_llama_cpp
        print(json.dumps(run(path, args.threads)))
        return
    try:
        import llama_cpp  # noqa: F401

        engines = ["ember", "llama.cpp"]
    except ImportError:
        engines = ["ember"]
    results: dict[str, list[dict]] = {e: [] for e in engines}
    for _ in range(args.runs):
        for engine in engines:
            cmd = [sys.executable, __file__, "--worker", engine, "--model", path,
                   "--threads", str(args.threads)]  # fmt: skip
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            results[engine].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{args.model}, {args.threads} threads, medians of {args.runs} runs")
    print(f"{'engine':<10} {'load s':>7} {'reserve s':>10} {'first token s':>14} {'total s':>8}")
    for engine, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        total = statistics.median(sum(r.values()) for r in runs)
        print(
            f"{engine:<10} {med['load_s']:>7.2f} {med['reserve_s']:>10.2f} "
            f"{med['first_token_s']:>14.2f} {total:>8.2f}"
        )


if __name__ == "__main__":
    main()
