"""Prefill-sized products (many rows of x) of one layer's weights: torch's float32 matmul on
the dequantized weight against the native int8 kernel with one and two q8_K passes.

    .venv/bin/python benchmarks/bench_prefill_kernels.py --model /tmp/llama3b-q4_k_m.gguf
    .venv/bin/python benchmarks/bench_prefill_kernels.py --model qwen2.5-coder:0.5b --rows 512

This is what weights.py's choice for more than NATIVE_ROWS rows rests on: the native kernel runs
a one-pass K type at any row count because it beats the float32 path there. Each figure is the
best of --repeat calls, in GFLOPS (2 * rows * out * in / seconds); "error" is the result's
distance from the float32 path's, relative to its norm, for random x.
"""

import argparse
import functools
import time
from collections.abc import Callable

import torch

from ember.backend.weights import NativeLinear
from ember.gguf import GGUFFile

WEIGHTS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def best_seconds(call: Callable[[], torch.Tensor], repeat: int) -> float:
    call()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder:0.5b")
    parser.add_argument("--layer", type=int, default=0)
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from ember.catalog import resolve_model

    torch.set_num_threads(args.threads)
    gguf = GGUFFile.open(resolve_model(args.model))
    print(f"{args.model}, layer {args.layer}, {args.rows} rows, {args.threads} threads")
    print(f"{'weight':<12} {'type':<6} {'shape':>11}  path        GFLOPS  error")
    for stem in WEIGHTS:
        name = f"blk.{args.layer}.{stem}.weight"
        if name not in gguf.tensors:
            continue
        info = gguf.tensors[name]
        out, inn = info.shape
        x = torch.randn(args.rows, inn)
        flops = 2 * args.rows * out * inn
        reference = None
        for passes in (0, 1, 2):  # 0: the float32 path
            raw = gguf.raw(name)
            weight = NativeLinear(raw, info.ggml_type, out, inn, activation_passes=passes or 1)
            call = functools.partial(path_of, weight, passes, x)
            seconds = best_seconds(call, args.repeat)
            y = call()
            reference = y if reference is None else reference
            error = float((y - reference).norm() / reference.norm())
            path = "float32" if passes == 0 else f"int8 x{passes}"
            gflops = flops / seconds / 1e9
            kind, shape = info.ggml_type.name, f"{out}x{inn}"
            print(f"{stem:<12} {kind:<6} {shape:>11}  {path:<10} {gflops:7.1f}  {error:.1e}")


def path_of(weight: NativeLinear, passes: int, x: torch.Tensor) -> torch.Tensor:
    """One of the two paths NativeLinear chooses between, called directly."""
    if passes:
        return weight._native(x)
    y = x.new_empty(x.shape[0], weight.out_features)
    weight.dense_into(x, 0, weight.out_features, y)
    return y

if __name__ == "__main__":
    main()
