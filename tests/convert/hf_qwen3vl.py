"""A tiny random-weight HF Qwen3VLForConditionalGeneration (a 3-block ViT with a learned 4 × 4
position grid and two deepstack mergers, Qwen3 text with interleaved M-RoPE), or its MoE
sibling (Qwen3VLMoe: 4 experts, top-2), saved as an HF directory with a byte-level BPE tokenizer
holding the vision tokens."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers as T
from hf_dirs import _save_bpe
from hf_qwen25vl import qwen25vl_vocab
from hf_vision import _randomize

PATCH, MERGE = 16, 2
MIN_PIXELS, MAX_PIXELS = 64 * 64, 192 * 192  # small: the load-time worst-case image stays cheap
MEAN, STD = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]


# Qwen3.5's hybrid text: DeltaNet layers, the fourth full attention with RoPE over half a head
ROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
        "mrope_interleaved": True}  # fmt: skip
QWEN35 = {"num_hidden_layers": 4, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
          "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
          "head_dim": 32, "rope_parameters": ROPE | {"partial_rotary_factor": 0.5}}  # fmt: skip


def build_qwen3vl(
    directory: Path, *, layers: int = 3, moe: bool = False, family: str = "", seed: int = 0
):
    """family: Qwen3VL (default), Qwen3VLMoe (moe), or Qwen3_5 (no deepstack)."""
    vocab = qwen25vl_vocab()
    n = len(vocab.tokens)
    family = family or ("Qwen3VLMoe" if moe else "Qwen3VL")
    experts = {"moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2}
    deepstack = {} if family == "Qwen3_5" else {"deepstack_visual_indexes": [0, 2]}
    vision = getattr(T, f"{family}VisionConfig")(
        depth=3, hidden_size=32, intermediate_size=48, num_heads=2, patch_size=PATCH,
        spatial_merge_size=MERGE, temporal_patch_size=2, out_hidden_size=64,
        num_position_embeddings=16, **deepstack,
    )  # fmt: skip
    fields = {"num_hidden_layers": layers, "head_dim": 16, "rope_parameters": ROPE}
    fields |= (experts if moe else {}) | (QWEN35 if family == "Qwen3_5" else {})
    text = getattr(T, f"{family}TextConfig")(
        vocab_size=n, hidden_size=64, intermediate_size=128, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, bos_token_id=vocab.bos_id,
        eos_token_id=vocab.eos_id, pad_token_id=vocab.pad_id, tie_word_embeddings=False, **fields,
    )  # fmt: skip
    config = getattr(T, f"{family}Config")(
        text_config=text, vision_config=vision, vision_start_token_id=n - 3,
        vision_end_token_id=n - 2, image_token_id=n - 1, video_token_id=n - 1,
        tie_word_embeddings=False,
    )  # fmt: skip
    for c in (config, config.text_config, config.vision_config):
        c._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(T, f"{family}ForConditionalGeneration")(config).float().eval()
    _randomize(model, seed)
    model.save_pretrained(directory)
    _save_bpe("qwen2", vocab, directory)
    processor = {"size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
                 "patch_size": PATCH, "merge_size": MERGE, "temporal_patch_size": 2,
                 "image_mean": MEAN, "image_std": STD,
                 "image_processor_type": "Qwen2VLImageProcessor"}  # fmt: skip
    (directory / "preprocessor_config.json").write_text(json.dumps(processor))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": vocab.eos_id}))
    return model


def hf_processor(max_pixels: int = MAX_PIXELS, min_pixels: int = MIN_PIXELS, **kw):
    return T.Qwen2VLImageProcessorPil(
        size={"shortest_edge": min_pixels, "longest_edge": max_pixels}, patch_size=PATCH,
        merge_size=MERGE, image_mean=MEAN, image_std=STD, **kw,
    )  # fmt: skip
