"""A prompt's causal attention (one sequence), a layer at a time: torch's SDPA in blocks of 64
queries (ember/nn/attention.py's fallback), the two oneDNN products a block and the native
kernel (ember/nn/prompt_attention.py's paths), for the bundled models' head shapes and a 3B one.

    .venv/bin/python benchmarks/bench_prompt_attention.py --tokens 512 --earlier 0
    .venv/bin/python benchmarks/bench_prompt_attention.py --earlier 1536 --any-length
    EMBER_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 \
        .venv/bin/python benchmarks/bench_prompt_attention.py

Each figure is the median of --repeat calls, in ms a layer.
"""

import argparse
import functools
import statistics
import time

import torch
import torch.nn.functional as F

from ember.nn import prompt_attention

SHAPES = {  # query heads, KV heads, head size
    "smollm2:135m": (9, 3, 64),
    "gemma3:270m": (4, 1, 256),
    "qwen2.5-coder:0.5b": (14, 2, 64),
    "3B": (24, 8, 128),
}


def sdpa_blocks(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> torch.Tensor:
    tokens, cells = q.shape[0], keys.shape[1]
    earlier = cells - tokens
    mask = torch.full((tokens, cells), float("-inf")).triu(earlier + 1)
    q4 = q.transpose(0, 1)[None]
    out = torch.cat(
        [
            F.scaled_dot_product_attention(
                q4[:, :, s : s + 64],
                keys[None, :, : earlier + s + 64],
                values[None, :, : earlier + s + 64],
                attn_mask=mask[s : s + 64, : earlier + s + 64],
                scale=scale,
                enable_gqa=True,
            )
            for s in range(0, tokens, 64)
        ],
        dim=2,
    )
    return out[0].transpose(0, 1).flatten(1)


def median_ms(call, repeat: int) -> float:
    call()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--earlier", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument(
        "--any-length",
        action="store_true",
        help="run the native kernel past the cells it takes here (where its limit should be)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.any_length:
        on_path = prompt_attention.native_runs(1, 1)  # whether it runs on this path at all
        prompt_attention.native_runs = lambda num_cells, kv_dims: on_path
    print(f"{args.tokens} tokens after {args.earlier} cells, {args.threads} threads, ms a layer")
    for name, (heads, kv_heads, dim) in SHAPES.items():
        g = torch.Generator().manual_seed(0)
        cells = args.earlier + args.tokens
        q = torch.randn(args.tokens, heads, dim, generator=g)
        keys, values = (torch.randn(kv_heads, cells, dim, generator=g) for _ in range(2))
        inputs = (q, keys, values, dim**-0.5)
        sdpa = median_ms(functools.partial(sdpa_blocks, *inputs), args.repeat)
        onednn = median_ms(
            functools.partial(prompt_attention.matmul_attention, *inputs), args.repeat
        )
        if prompt_attention.native_attention(*inputs) is None:
            skipped = "(native: not on this path, or past its cells)"
            print(f"{name:<20} SDPA {sdpa:7.2f}  oneDNN {onednn:7.2f}  {skipped}")
            continue
        kernel = median_ms(
            functools.partial(prompt_attention.native_attention, *inputs), args.repeat
        )
        print(f"{name:<20} SDPA {sdpa:7.2f}  oneDNN {onednn:7.2f}  native {kernel:7.2f}")


if __name__ == "__main__":
    main()
