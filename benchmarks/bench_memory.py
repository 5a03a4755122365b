"""Peak memory of `ember.LLM(model)` at its defaults, beside llama.cpp at the same context.

    .venv/bin/python benchmarks/bench_memory.py --model smollm2:135m gemma3:270m qwen2.5-coder:0.5b

Ember: `LLM(path)` (num_parallel 4, num_ctx 4096: 16,384 cells of f16 KV cache, reserved at
load, the tokenizer built) and one generation of --gen-tokens tokens from a prompt of ~300
tokens. llama.cpp (llama-cpp-python, when installed): `Llama(path, n_ctx=16384, n_batch=512)`,
its f16 KV cache of the same cells (as Ollama sizes it: num_ctx × parallel), the same prompt's
tokens evaluated and --gen-tokens greedy steps. Each run is its own process; the figure is its
peak RSS (ru_maxrss), the median over --runs.
"""

import argparse
import json
import resource
import statistics
import subprocess
import sys

PROMPT = "Write a story about a lantern that is lit every evening at the harbour. " * 20
CELLS = 4 * 4096  # LLM's defaults: num_parallel 4 × num_ctx 4096


def run_ember(path: str, gen: int) -> None:
    from ember import LLM

    llm = LLM(path)
    llm.generate(PROMPT, options={"num_predict": gen, "temperature": 0})


def run_llama_cpp(path: str, gen: int) -> None:
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=CELLS, n_batch=512, n_threads=2, verbose=False)
    llm.eval(llm.tokenize(PROMPT.encode()))
    for _ in range(gen):
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
        llm.eval([int(np.argmax(logits))])


def peak_mb(engine: str, path: str, gen: int) -> float:
    cmd = [sys.executable, __file__, "--worker", engine, "--path", path, "--gen-tokens", str(gen)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_mb"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="+", default=["smollm2:135m"])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--gen-tokens", type=int, default=16)
    parser.add_argument("--worker", choices=["ember", "llama.cpp"], help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        (run_ember if args.worker == "ember" else run_llama_cpp)(args.path, args.gen_tokens)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps({"peak_rss_mb": peak}))
        return

    import importlib.util

    from ember.catalog import resolve_model

    engines = ["ember"] + (["llama.cpp"] if importlib.util.find_spec("llama_cpp") else [])
    print(f"peak RSS MB, median of {args.runs}; {CELLS} cells of f16 KV cache in both engines")
    print(f"{'model':<22} " + " ".join(f"{e:>10}" for e in engines) + "  ratio")
    for name in args.model:
        path = str(resolve_model(name))
        peaks = {e: [] for e in engines}
        for _ in range(args.runs):
            for engine in engines:  # interleaved
                peaks[engine].append(peak_mb(engine, path, args.gen_tokens))
        med = {e: statistics.median(p) for e, p in peaks.items()}
        ratio = f"  {med['ember'] / med['llama.cpp']:.2f}x" if "llama.cpp" in med else ""
        print(f"{name:<22} " + " ".join(f"{med[e]:>10.0f}" for e in engines) + ratio)


if __name__ == "__main__":
    main()
