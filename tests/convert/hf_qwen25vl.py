"""A tiny random-weight HF Qwen2_5_VLForConditionalGeneration (windowed ViT with one full-attention
block, patch merger, qwen2 text with M-RoPE) saved as an HF directory with a byte-level BPE
tokenizer holding the vision tokens, shaped as ../shared/reference/tiny_vision_models.py's
qwen2_5_vl, HF's constant inits made random."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers as T
from gguf import TokenType
from hf_dirs import _save_bpe
from hf_vision import _randomize
from tinymodels import Vocab, bpe_vocab

SPECIALS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]
PATCH, MERGE, WINDOW = 14, 2, 56  # windows of 2 x 2 merged tokens
MAX_PIXELS = 168 * 168  # small, so the load-time worst-case image stays cheap


def qwen25vl_vocab() -> Vocab:
    v = bpe_vocab("qwen2")
    return Vocab(v.model, v.pre, [*v.tokens, *SPECIALS], [*v.token_types, *[TokenType.CONTROL] * 3],
                 v.merges, v.scores, v.bos_id, v.eos_id, v.unk_id, v.pad_id, v.add_bos)  # fmt: skip


def build_qwen25vl(directory: Path, *, seed: int = 0) -> T.Qwen2_5_VLForConditionalGeneration:
    vocab = qwen25vl_vocab()
    n = len(vocab.tokens)
    vision = T.Qwen2_5_VLVisionConfig(
        depth=3, hidden_size=32, intermediate_size=48, num_heads=2, patch_size=PATCH,
        spatial_merge_size=MERGE, temporal_patch_size=2, window_size=WINDOW,
        out_hidden_size=64, fullatt_block_indexes=[1],
    )  # fmt: skip
    text = T.Qwen2_5_VLTextConfig(
        vocab_size=n, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=vocab.bos_id, eos_token_id=vocab.eos_id, pad_token_id=vocab.pad_id,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        tie_word_embeddings=False,
    )  # fmt: skip
    config = T.Qwen2_5_VLConfig(
        text_config=text, vision_config=vision, vision_start_token_id=n - 3,
        vision_end_token_id=n - 2, image_token_id=n - 1, video_token_id=n - 1,
        tie_word_embeddings=False,
    )  # fmt: skip
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    config.vision_config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = T.Qwen2_5_VLForConditionalGeneration(config).float().eval()
    _randomize(model, seed)
    model.save_pretrained(directory)
    _save_bpe("qwen2", vocab, directory)
    processor = {"min_pixels": 56 * 56, "max_pixels": MAX_PIXELS, "patch_size": PATCH,
                 "merge_size": MERGE, "temporal_patch_size": 2,
                 "image_processor_type": "Qwen2VLImageProcessor"}  # fmt: skip
    (directory / "preprocessor_config.json").write_text(json.dumps(processor))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": vocab.eos_id}))
    return model
