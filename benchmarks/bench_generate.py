"""Prompt-processing and generation speed, and peak memory, of Ember on one model; beside
llama.cpp (llama-cpp-python) on the same GGUF file and in the same run when it is installed.

    .venv/bin/python benchmarks/bench_generate.py --model smollm2:135m --threads 2 --runs 3
    .venv/bin/python benchmarks/bench_generate.py --model /tmp/llama3b-q4_k_m.gguf --runs 1

--model is a bundled name or a GGUF path (benchmarks/make_scale_model.py writes a 3B-shaped
one). Ember's KV cache is of --kv-type (the engine's default, f16, as llama.cpp's). --isa
avx512 avx2 runs Ember once per kernel ISA named (EMBER_CPU_ISA in its worker), all in the same
interleaved runs: the figures of every path a CPU has, side by side. A worker of a lower ISA
holds torch's own kernels (ATen, oneDNN, MKL) to it too, so that its figures are those of a CPU
without the higher one.

Each engine runs in its own process (so peak RSS is its own), the engines interleaved run by
run, and the medians are printed. The prompt is exactly --prompt-tokens ids, the same for both
engines; generation is greedy for --gen-tokens steps without stopping at end tokens.
"""

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import time

from ember.envconfig import CPU_ISAS

# what holds torch's kernels to a lower ISA than the CPU's (Ember's own take EMBER_CPU_ISA)
TORCH_ISA_ENV = {
    "avxvnni": {  # oneDNN has an AVX2 + AVX-VNNI level; ATen and MKL stop at AVX2
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2_VNNI",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
    "avx2": {
        "ATEN_CPU_CAPABILITY": "avx2",
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
    "generic": {
        "ATEN_CPU_CAPABILITY": "default",
        "ONEDNN_MAX_CPU_ISA": "SSE41",
        "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    },
}

TEXT = " ".join(
    f"Entry {i}: the {c} lantern on shelf {i % 7} was lit at {i % 24} o'clock."
    for i, c in enumerate(["amber", "blue", "crimson", "golden"] * 64)
)


def prompt_ids(path: str, n: int) -> list[int]:
    from ember.gguf import GGUFFile
    from ember.tokenizer import Tokenizer

    with GGUFFile.open(path) as gguf:
        ids = Tokenizer.from_metadata(gguf.metadata).encode(TEXT)
    if len(ids) < n:
        raise SystemExit(f"the benchmark text has only {len(ids)} tokens")
    return ids[:n]


def run_ember(path: str, ids: list[int], gen: int, threads: int, kv_type: str) -> dict:
    import numpy as np
    import torch

    from ember.batch import Batch
    from ember.gguf import GGUFFile
    from ember.model import forward, load_model

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    model = load_model(GGUFFile.open(path))
    cache = model.make_cache()
    cache.init(max_sequences=1, capacity=len(ids) + gen + 8, max_batch=512, dtype=kv_type)
    load = time.perf_counter() - t0
    t0 = time.perf_counter()
    for start in range(0, len(ids), 512):
        chunk = ids[start : start + 512]
        logits = forward(model, cache, Batch.single(chunk, start))[0]
    prefill = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(gen):  # the next token picked as llama.cpp's worker picks it (torch's
        # argmax took 0.12-0.56 ms of a step over these vocabularies, numpy's 0.01-0.04)
        token = int(np.argmax(logits.numpy()))
        logits = forward(model, cache, Batch.single([token], len(ids) + i))[0]
    decode = time.perf_counter() - t0
    return {"load_s": load, "prefill_s": prefill, "decode_s": decode}


def run_llama_cpp(path: str, ids: list[int], gen: int, threads: int, kv_type: str) -> dict:
    import numpy as np
    from llama_cpp import Llama

    t0 = time.perf_counter()
    llm = Llama(
        model_path=path,
        n_ctx=len(ids) + gen + 8,
        n_batch=512,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    load = time.perf_counter() - t0
    t0 = time.perf_counter()
    llm.eval(ids)
    prefill = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(gen):
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
        llm.eval([int(np.argmax(logits))])  # greedy on the last logits, as ours
    decode = time.perf_counter() - t0
    return {"load_s": load, "prefill_s": prefill, "decode_s": decode}


def worker(args: argparse.Namespace) -> None:
    ids = json.loads(sys.stdin.read())
    run = run_ember if args.worker == "ember" else run_llama_cpp
    result = run(args.path, ids, args.gen_tokens, args.threads, args.kv_type)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def peer_failure(err: subprocess.CalledProcessError) -> str:
    """Why a llama.cpp worker gave no figures: its signal or exit status and last line."""
    code = err.returncode
    how = f"died with {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
    last = (err.stderr or "").strip().splitlines()[-1:]
    hint = ""
    if code < 0 and cpu_has_amx() and "llama-cpp-" not in os.environ.get("PYTHONPATH", ""):
        # llama.cpp's native build takes AMX here, and died at its first evaluation on every
        # AMX Xeon tried (SIGILL on 2026-11-27, SIGSEGV on 2026-11-28)
        hint = "; this CPU has AMX: `make .venv/llama-cpp-avx512` builds it without"
    return f"(its worker {how}{': ' + last[0] if last else ''}{hint})"


def cpu_has_amx() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return " amx_int8" in f.read()
    except OSError:
        return False


def cpu_line(isas: list[str] | None) -> str:
    """The CPU's model name and, unless the rows name their ISAs, the one Ember's workers run
    (EMBER_CPU_ISA, else the best this CPU has)."""
    from ember.backend import native

    if isas:
        return f"CPU {native.cpu_name()}"
    return f"CPU {native.cpu_name()}; Ember's kernels: {native.chosen_isa() or 'none (PyTorch)'}"


def has_llama_cpp() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2:135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--gen-tokens", type=int, default=128)
    parser.add_argument("--kv-type", default="f16", help="Ember's KV cache type (f16 default)")
    parser.add_argument("--isa", nargs="+", choices=CPU_ISAS, help="one Ember run per kernel ISA")
    parser.add_argument("--worker", choices=["ember", "llama.cpp"], help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    from ember.catalog import resolve_model

    path = str(resolve_model(args.model))
    ids = prompt_ids(path, args.prompt_tokens)
    if args.isa:
        from ember.backend import native

        if missing := [isa for isa in args.isa if isa not in native.runnable_isas()]:
            raise SystemExit(f"this CPU or build cannot run {', '.join(missing)}")
    embers = [f"ember/{isa}" for isa in args.isa] if args.isa else ["ember"]
    engines = embers + (["llama.cpp"] if has_llama_cpp() else [])
    results: dict[str, list[dict]] = {e: [] for e in engines}
    failed: dict[str, str] = {}
    for _ in range(args.runs):
        for label in engines:
            if label in failed:
                continue
            engine, _, isa = label.partition("/")
            env = (
                {**os.environ, "EMBER_CPU_ISA": isa, **TORCH_ISA_ENV.get(isa, {})} if isa else None
            )
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                engine,
                "--path",
                path,
                "--threads",
                str(args.threads),
                "--gen-tokens",
                str(args.gen_tokens),
                "--kv-type",
                args.kv_type,
            ]
            try:
                out = subprocess.run(
                    cmd, input=json.dumps(ids), capture_output=True, text=True, check=True, env=env
                )
            except subprocess.CalledProcessError as err:
                if engine != "llama.cpp":
                    raise
                failed[label] = peer_failure(err)  # the peer's crash leaves Ember's figures
                continue
            results[label].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(
        f"model {args.model} ({path}), {args.threads} threads, prompt {len(ids)} tokens, "
        f"{args.gen_tokens} generated, median of {args.runs} interleaved runs, "
        f"Ember KV cache {args.kv_type}"
    )
    print(cpu_line(args.isa))
    header = ("engine", "prefill tok/s", "decode tok/s", "load s", "peak RSS MB")
    print("{:<14} {:>14} {:>13} {:>7} {:>12}".format(*header))
    for engine, runs in results.items():
        if not runs:
            print(f"{engine:<14} {failed[engine]}")
            continue
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(
            f"{engine:<14} {len(ids) / med['prefill_s']:>14.1f} "
            f"{args.gen_tokens / med['decode_s']:>13.1f} {med['load_s']:>7.2f} "
            f"{med['peak_rss_mb']:>12.0f}"
        )
    if not has_llama_cpp():
        print("(llama-cpp-python is not installed: no llama.cpp figures in this run)")


if __name__ == "__main__":
    main()
