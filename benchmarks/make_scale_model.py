"""Writes a Llama-3.2-3B-shaped model with random weights, quantized to Q4_K_M by Ember itself
(or to another type `ember create --quantize` makes: --type Q8_0, Q4_K_S).

    .venv/bin/python benchmarks/make_scale_model.py /tmp/llama3b-q4_k_m.gguf
    .venv/bin/python benchmarks/make_scale_model.py /tmp/llama3b-q8_0.gguf --type Q8_0
    .venv/bin/python benchmarks/bench_generate.py --model /tmp/llama3b-q4_k_m.gguf --runs 3

The shape is meta-llama/Llama-3.2-3B's config.json: hidden 3072, 28 layers, 24 heads and 8 KV
heads of 128, FFN 8192, vocabulary 128256, tied embeddings, rope_theta 500000 with llama3 rope
scaling (factor 32, low/high frequency factors 1 and 4, original context 8192; written as the
`rope_freqs.weight` tensor, as llama.cpp's converter does), RMS eps 1e-5, context 131072.

Steps: (1) an F16 GGUF (norms and rope_freqs F32) written tensor by tensor with gguf-py's
writer, random N(0, 0.02) weights drawn a slice at a time (`--f16 PATH`, default OUT.f16.gguf,
about 6.4 GB, deleted at the end unless --keep-f16); (2) `ember.store.quantize.quantize(...,
"q4_K_M")`, the function behind `ember create --quantize q4_K_M`, streaming into OUT (~1.9 GB).
Memory stays under ~1 GB: no tensor is ever whole in memory in float32.

Tokenizer: SmolLM2's (the bundled smollm2:135m: GPT-2-style byte-level BPE, 49,152 tokens and
its merges, chat template, BOS/EOS) padded to 128,256 entries with `<|reserved_N|>` tokens of
type UNUSED, which no text ever produces: Ember and llama.cpp load it, and prompts tokenize as
SmolLM2's do. (A real Llama 3 vocabulary is not bundled; Qwen's is larger than 128,256 and
cutting it would leave merges whose results are missing.)
"""

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np


@dataclass(frozen=True)
class Shape:
    """A Llama model's sizes; make_shaped_model.py writes others than the 3B one."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool = True  # the head is the token embeddings (else its own output.weight)
    rope_factor: float = 32.0  # llama3 rope scaling's factor
    name: str = "Llama-3.2-3B"


LLAMA_3B = Shape(hidden=3072, layers=28, heads=24, kv_heads=8, head_dim=128, ffn=8192, vocab=128256)
# meta-llama/Llama-3.1-8B's config.json: an untied head, rope scaling factor 8
LLAMA_8B = Shape(
    hidden=4096,
    layers=32,
    heads=32,
    kv_heads=8,
    head_dim=128,
    ffn=14336,
    vocab=128256,
    tied=False,
    rope_factor=8.0,
    name="Llama-3.1-8B",
)
ROPE_THETA, CONTEXT, EPS = 500000.0, 131072, 1e-5
ROPE_SCALING = {"low": 1.0, "high": 4.0, "original": 8192}  # the factor is the shape's
SLICE_ELEMENTS = 1 << 24  # random values drawn 16M at a time


def rope_factors(head_dim: int, factor: float) -> np.ndarray:
    """llama3 rope scaling as per-frequency divisors (llama.cpp's `rope_freqs.weight`)."""
    s = ROPE_SCALING
    freqs = 1.0 / ROPE_THETA ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    low_wavelen, high_wavelen = s["original"] / s["low"], s["original"] / s["high"]
    factors = []
    for f in freqs:
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (s["original"] / wavelen - s["low"]) / (s["high"] - s["low"])
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def tensors(shape: Shape, layers: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape as rows × columns, kind) in llama.cpp's order; kind: weight, norm, rope."""
    hidden, ffn = shape.hidden, shape.ffn
    out: list[tuple[str, tuple[int, ...], str]] = [
        ("token_embd.weight", (shape.vocab, hidden), "weight")
    ]
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    for i in range(layers):
        p = f"blk.{i}."
        out += [
            (p + "attn_norm.weight", (hidden,), "norm"),
            (p + "attn_q.weight", (q, hidden), "weight"),
            (p + "attn_k.weight", (kv, hidden), "weight"),
            (p + "attn_v.weight", (kv, hidden), "weight"),
            (p + "attn_output.weight", (hidden, q), "weight"),
            (p + "ffn_norm.weight", (hidden,), "norm"),
            (p + "ffn_gate.weight", (ffn, hidden), "weight"),
            (p + "ffn_up.weight", (ffn, hidden), "weight"),
            (p + "ffn_down.weight", (hidden, ffn), "weight"),
        ]
    out += [
        ("output_norm.weight", (hidden,), "norm"),
        ("rope_freqs.weight", (shape.head_dim // 2,), "rope"),
    ]
    if not shape.tied:
        out.append(("output.weight", (shape.vocab, hidden), "weight"))
    return out


def add_tokenizer(writer: gguf.GGUFWriter, source: Path | None, vocab: int) -> None:
    from ember.catalog import resolve_model
    from ember.gguf import GGUFFile

    with GGUFFile.open(source or resolve_model("smollm2:135m")) as src:
        md = src.metadata
        tokens = list(md["tokenizer.ggml.tokens"])
        types = list(md["tokenizer.ggml.token_type"])
        merges = list(md["tokenizer.ggml.merges"])
        template = md.get("tokenizer.chat_template")
        pad = vocab - len(tokens)
        tokens += [f"<|reserved_{i}|>" for i in range(pad)]
        types += [int(gguf.TokenType.UNUSED)] * pad
        writer.add_tokenizer_model(str(md["tokenizer.ggml.model"]))
        writer.add_tokenizer_pre(str(md["tokenizer.ggml.pre"]))
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(merges)
        writer.add_bos_token_id(int(md["tokenizer.ggml.bos_token_id"]))
        writer.add_eos_token_id(int(md["tokenizer.ggml.eos_token_id"]))
        writer.add_unk_token_id(int(md["tokenizer.ggml.unknown_token_id"]))
        writer.add_pad_token_id(int(md["tokenizer.ggml.padding_token_id"]))
        writer.add_add_bos_token(bool(md.get("tokenizer.ggml.add_bos_token", False)))
        if isinstance(template, str):
            writer.add_chat_template(template)


def write_f16(
    path: Path, layers: int, seed: int, tokenizer: Path | None, shape: Shape = LLAMA_3B
) -> None:
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"{shape.name}-shaped (random weights)")
    writer.add_block_count(layers)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_vocab_size(shape.vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    add_tokenizer(writer, tokenizer, shape.vocab)
    plan = tensors(shape, layers)
    for name, dims, kind in plan:
        dtype = np.float16 if kind == "weight" else np.float32
        nbytes = math.prod(dims) * np.dtype(dtype).itemsize
        writer.add_tensor_info(name, dims, np.dtype(dtype), nbytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    assert writer.fout is not None
    out = writer.fout[0]
    for _, dims, kind in plan:
        writer.write_padding(out, out.tell())
        if kind == "rope":
            rope_factors(shape.head_dim, shape.rope_factor).tofile(out)
        elif kind == "norm":
            (1.0 + 0.1 * rng.standard_normal(dims, dtype=np.float32)).tofile(out)
        else:
            total, done = math.prod(dims), 0
            while done < total:
                n = min(SLICE_ELEMENTS, total - done)
                (0.02 * rng.standard_normal(n, dtype=np.float32)).astype(np.float16).tofile(out)
                done += n
    writer.write_padding(out, out.tell())
    writer.close()


class FileSink:
    """What quantize writes into: a plain file (BlobWriter's write, without the blob store)."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("wb")

    def write(self, data: bytes) -> None:
        self.file.write(data)

    def close(self) -> None:
        self.file.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the file to write (keep it out of the repo)")
    parser.add_argument("--type", default="Q4_K_M", choices=["Q4_K_M", "Q4_K_S", "Q8_0"])
    parser.add_argument("--f16", type=Path, help="the intermediate F16 file (OUT.f16.gguf)")
    parser.add_argument("--keep-f16", action="store_true")
    parser.add_argument("--layers", type=int, default=LLAMA_3B.layers, help="fewer: a quick check")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--tokenizer",
        type=Path,
        help="a GGUF to copy the tokenizer from (default: the bundled smollm2)",
    )
    args = parser.parse_args()
    from typing import Any, cast

    from ember.store.quantize import quantize

    f16 = args.f16 or args.out.with_suffix(".f16.gguf")
    t0 = time.perf_counter()
    if not f16.exists():
        write_f16(f16, args.layers, args.seed, args.tokenizer)
        print(
            f"wrote {f16} ({f16.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t0:.0f} s"
        )
    t0 = time.perf_counter()
    sink = FileSink(args.out)
    try:
        last = 0.0
        for done, total in quantize(f16, cast(Any, sink), args.type):
            if time.perf_counter() - last > 30 or done == total:
                last = time.perf_counter()
                print(f"quantizing: {done / total:.0%} after {last - t0:.0f} s", flush=True)
    finally:
        sink.close()
    size = args.out.stat().st_size
    print(
        f"wrote {args.out} ({size / 1e9:.2f} GB, {args.type}) in {time.perf_counter() - t0:.0f} s"
    )
    if not args.keep_f16:
        f16.unlink()


if __name__ == "__main__":
    main()
