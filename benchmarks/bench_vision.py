"""Time a vision tower of a real model's shape (random weights, a one-layer text model): the
load, and one image's encoding at the worst-case size the load reservation runs (Ollama's
2048 x 2048 bitmap) and at a photo's size.

    .venv/bin/python benchmarks/bench_vision.py --family qwen3vl-2b --runs 2
    .venv/bin/python benchmarks/bench_vision.py --family gemma4-e2b --runs 2
"""

import argparse
import io
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers as T
from PIL import Image

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests" / "convert"),
                str(Path(__file__).resolve().parents[1] / "tests")]  # fmt: skip
from hf_dirs import _save_bpe  # noqa: E402
from hf_families import randomize  # noqa: E402
from hf_gemma4v import gemma4v_vocab  # noqa: E402
from hf_qwen25vl import qwen25vl_vocab  # noqa: E402

from ember.convert import convert_directory  # noqa: E402
from ember.gguf import GGUFFile  # noqa: E402
from ember.model import load_model  # noqa: E402
from ember.runner.memory import worst_case_image  # noqa: E402


def qwen3vl_2b(directory: Path) -> None:
    vocab = qwen25vl_vocab()
    n = len(vocab.tokens)
    vision = T.Qwen3VLVisionConfig(depth=24, hidden_size=1024, intermediate_size=4096,
                                   num_heads=16, patch_size=16, out_hidden_size=2048,
                                   num_position_embeddings=2304,
                                   deepstack_visual_indexes=[5, 11, 17])  # fmt: skip
    text = T.Qwen3VLTextConfig(vocab_size=n, hidden_size=2048, intermediate_size=256,
                               num_hidden_layers=1, num_attention_heads=16, num_key_value_heads=8,
                               head_dim=128, rope_parameters={"rope_type": "default",
                               "rope_theta": 5e6, "mrope_section": [24, 20, 20],
                               "mrope_interleaved": True})  # fmt: skip
    config = T.Qwen3VLConfig(text_config=text, vision_config=vision, vision_start_token_id=n - 3,
                             vision_end_token_id=n - 2, image_token_id=n - 1,
                             video_token_id=n - 1)  # fmt: skip
    _save(T.Qwen3VLForConditionalGeneration(config), vocab, directory)


def gemma4_e2b(directory: Path) -> None:
    vocab = gemma4v_vocab()
    n = len(vocab.tokens)
    vision = T.Gemma4VisionConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=16,
                                  num_attention_heads=12, num_key_value_heads=12, head_dim=64,
                                  patch_size=16, pooling_kernel_size=3,
                                  position_embedding_size=10240)  # fmt: skip
    text = {"vocab_size": n, "hidden_size": 1536, "intermediate_size": 256,
            "num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 1,
            "head_dim": 256, "global_head_dim": 512, "layer_types": ["full_attention"],
            "hidden_size_per_layer_input": 0, "pad_token_id": vocab.pad_id}  # fmt: skip
    config = T.Gemma4Config(text_config=text, vision_config=vision, audio_config=None,
                            boi_token_id=n - 3, eoi_token_id=n - 2, image_token_id=n - 1,
                            video_token_id=n - 1)  # fmt: skip
    _save(T.Gemma4ForConditionalGeneration(config), vocab, directory)


def _save(model, vocab, directory: Path) -> None:
    randomize(model.float().eval(), 0)
    model.to(torch.bfloat16).save_pretrained(directory)  # as released: BF16
    _save_bpe("qwen2", vocab, directory)


FAMILIES = {"qwen3vl-2b": qwen3vl_2b, "gemma4-e2b": gemma4_e2b}


def photo() -> bytes:
    out = io.BytesIO()
    Image.effect_noise((1024, 768), 64).convert("RGB").save(out, format="PNG")
    return out.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=FAMILIES, required=True)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-vision-"))
    FAMILIES[args.family](root / "hf")
    convert_directory(root / "hf", root / "model.gguf")
    start = time.perf_counter()
    model = load_model(GGUFFile.open(root / "model.gguf"))
    print(f"{args.family}: load {time.perf_counter() - start:.2f} s, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    for name, data in (("worst case 2048x2048", worst_case_image()), ("photo 1024x768", photo())):
        times, rows = [], 0
        for _ in range(args.runs):
            start = time.perf_counter()
            encoded = model.encode_multimodal(data)
            times.append(time.perf_counter() - start)
            rows = len(model.image_span(encoded).tokens)
        print(f"  {name}: {min(times):.2f} s (best of {args.runs}), a span of {rows} tokens")


if __name__ == "__main__":
    main()
