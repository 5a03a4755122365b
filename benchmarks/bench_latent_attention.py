"""DeepSeek's latent attention in its two file layouts: a random-weight DeepSeek-V2-Lite-shaped
model (transformers' DeepseekV2ForCausalLM, cut to --layers layers and --experts experts,
float32) converted by Ember, then the same weights in llama.cpp's absorbed layout (`attn_k_b` /
`attn_v_b`, the latent cached); a prompt and decode steps timed on each.

    .venv/bin/python benchmarks/bench_latent_attention.py --layers 2 --experts 16
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

TESTS = Path(__file__).parents[1] / "tests"
sys.path[:0] = [str(TESTS / "convert"), str(TESTS)]
from gguf_copy import absorbed_layout  # noqa: E402  (the tests' GGUF copier)
from hf_dirs import _save_bpe  # noqa: E402
from tinymodels import tiny_vocab  # noqa: E402

from ember.batch import Batch  # noqa: E402
from ember.convert import convert_directory  # noqa: E402
from ember.gguf import GGUFFile  # noqa: E402
from ember.model import forward, load_model  # noqa: E402

HEADS, NOPE, VALUE, LORA, ROPE = 16, 128, 128, 512, 64  # V2-Lite's attention


def make(root: Path, layers: int, experts: int) -> Path:
    import transformers

    config = transformers.DeepseekV2Config(
        vocab_size=len(tiny_vocab("qwen2").tokens), hidden_size=2048, intermediate_size=10944,
        moe_intermediate_size=1408, num_hidden_layers=layers, num_attention_heads=HEADS,
        num_key_value_heads=HEADS, n_shared_experts=2, n_routed_experts=experts,
        num_experts_per_tok=6, first_k_dense_replace=1, kv_lora_rank=LORA, q_lora_rank=None,
        qk_rope_head_dim=ROPE, qk_nope_head_dim=NOPE, v_head_dim=VALUE, head_dim=ROPE,
        max_position_embeddings=4096,
    )  # fmt: skip
    transformers.DeepseekV2ForCausalLM(config).save_pretrained(root / "hf")
    _save_bpe("qwen2", tiny_vocab("qwen2"), root / "hf")
    convert_directory(root / "hf", root / "kv_b.gguf")
    absorbed_layout(root / "kv_b.gguf", root / "absorbed.gguf", heads=HEADS, nope=NOPE,
                    value=VALUE, lora=LORA)  # fmt: skip
    return root


def time_steps(path: Path, prompt: int, steps: int) -> tuple[float, float]:
    model = load_model(GGUFFile.open(path))
    cache = model.make_cache()
    cache.init(max_sequences=1, capacity=prompt + steps + 8, max_batch=prompt)
    start = time.perf_counter()
    forward(model, cache, Batch.single(list(range(5, 5 + prompt)), 0))
    prefill = time.perf_counter() - start
    times = []
    for i in range(steps):
        start = time.perf_counter()
        forward(model, cache, Batch.single([7], prompt + i))
        times.append(time.perf_counter() - start)
    return prefill, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--experts", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = make(Path(tmp), args.layers, args.experts)
        for layout in ("kv_b", "absorbed"):
            prefill, step = time_steps(root / f"{layout}.gguf", args.prompt, args.steps)
            print(f"{layout}: prompt of {args.prompt} {prefill * 1e3:.1f} ms, "
                  f"decode step {step * 1e3:.2f} ms (median of {args.steps})")  # fmt: skip


if __name__ == "__main__":
    main()
