"""A gated MLP's act(gate) * up over a 512-token prompt: torch's two ops (the arch code before
ember/backend/activation.py) against the native act_mul, at the bundled models' widths.

    .venv/bin/python benchmarks/bench_activation.py --threads 2
"""

import argparse
from functools import partial

import torch
import torch.nn.functional as F
from bench_prefill_kernels import best_seconds  # benchmarks/ is the script's own path

from ember.backend.activation import act_mul

MODELS = [
    ("smollm2:135m", 1536, "silu"),
    ("gemma3:270m", 2048, "gelu_tanh"),
    ("qwen2.5-coder:0.5b", 4864, "silu"),
]


def torch_act_mul(gate_up: torch.Tensor, ffn: int, act: str) -> torch.Tensor:
    gate, up = gate_up[:, :ffn], gate_up[:, ffn:]
    if act == "silu":  # in place on the gate half, as llama.py did
        return F.silu(gate, inplace=True) * up
    return F.gelu(gate, approximate="tanh") * up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=512)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.tokens} rows, {args.threads} threads, best of 30 (ms a layer)")
    for name, ffn, act in MODELS:
        gate_up = torch.randn(args.tokens, 2 * ffn)
        old = best_seconds(partial(torch_act_mul, gate_up, ffn, act), 30) * 1e3
        new = best_seconds(partial(act_mul, gate_up, ffn, act), 30) * 1e3
        print(f"{name:<20} {act:<10} torch {old:6.2f}  act_mul {new:6.2f}")


if __name__ == "__main__":
    main()
