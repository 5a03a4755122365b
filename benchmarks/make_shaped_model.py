"""Writes a random-weight model of a bundled model's shape and weight types, for benchmarks on a
machine where the model packages cannot go (a lent machine takes 64 MiB a call; SmolLM2 is 98 MB).

    .venv/bin/python benchmarks/make_shaped_model.py smollm2 /tmp/smol.gguf
    .venv/bin/python benchmarks/bench_generate.py --model /tmp/smol.gguf --runs 3

Shapes: `smollm2` (SmolLM2-135M: 30 layers, hidden 576, 9/3 heads of 64, FFN 1536, vocabulary
49,152; Q4_1 with a tied Q8_0 head, the types of the bundled file) and `llama3b` (make_scale_model's
Llama-3.2-3B shape, Q4_K_M, --layers of its 28), `llama8b` (Llama-3.1-8B's: hidden 4096, 32 layers,
32/8 heads of 128, FFN 14,336, an untied head, rope scaling factor 8; Q4_K_M, ~4.9 GB); --type
Q5_K_M (or another of LLAMA_FTYPE) writes the shape in another llama.cpp file type. The F16 file
comes from make_scale_model's writer (random N(0, 0.02) weights, its rope factors and SmolLM2's
tokenizer: --tokenizer, a GGUF to copy it from, else the bundled smollm2); the quantization is
llama.cpp's (`llama_model_quantize` from llama-cpp-python, which `make bench` installs), multi-
threaded: Ember's own quantizer has no Q4_1 and takes minutes per GB on one thread. Speed does not
depend on the weights' values, so the figures of such a file are those of its shape and types.
"""

import argparse
import ctypes
from pathlib import Path

import make_scale_model as scale

LLAMA_FTYPE = {"Q4_1": 3, "Q4_K_M": 15, "Q5_K_M": 17}  # llama.cpp's LLAMA_FTYPE_MOSTLY_*
GGML_Q8_0 = 8
SMOLLM2 = scale.Shape(
    hidden=576, layers=30, heads=9, kv_heads=3, head_dim=64, ffn=1536, vocab=49152
)
# shape, file type, the embedding/head type where it differs from the file type's choice
SHAPES = {
    "smollm2": (SMOLLM2, "Q4_1", GGML_Q8_0),
    "llama3b": (scale.LLAMA_3B, "Q4_K_M", None),
    "llama8b": (scale.LLAMA_8B, "Q4_K_M", None),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("out", type=Path, help="the quantized file to write")
    parser.add_argument("--layers", type=int, help="fewer layers than the shape's")
    parser.add_argument("--tokenizer", type=Path, help="a GGUF to copy the tokenizer from")
    parser.add_argument("--threads", type=int, default=0, help="llama.cpp's (0: all cores)")
    parser.add_argument("--type", choices=sorted(LLAMA_FTYPE), help="a file type, not the shape's")
    args = parser.parse_args()
    try:
        import llama_cpp
    except ImportError:
        raise SystemExit(
            "make_shaped_model needs llama-cpp-python (`make bench` installs it)"
        ) from None

    shape, file_type, head = SHAPES[args.shape]
    file_type = args.type or file_type
    f16 = args.out.with_suffix(".f16.gguf")
    scale.write_f16(f16, args.layers or shape.layers, 0, args.tokenizer, shape)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = LLAMA_FTYPE[file_type], args.threads
    if head is not None:
        params.output_tensor_type = params.token_embedding_type = head
    try:
        failed = llama_cpp.llama_model_quantize(
            str(f16).encode(), str(args.out).encode(), ctypes.byref(params)
        )
    finally:
        f16.unlink()
    if failed:
        raise SystemExit(f"llama.cpp's quantizer failed ({failed})")
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.0f} MB, {args.shape}, {file_type})")


if __name__ == "__main__":
    main()
