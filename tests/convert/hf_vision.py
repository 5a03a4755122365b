"""A tiny random-weight HF Gemma3ForConditionalGeneration saved as an HF directory (config.json,
model.safetensors, a SentencePiece tokenizer.model with the image tokens), as
../shared/reference/tiny_vision_models.py builds it, with HF's constant inits made random."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import transformers as T
from hf_dirs import _save_sentencepiece
from tinymodels import Vocab, spm_vocab

IMAGE_SIZE, PATCH, TOKENS_PER_IMAGE = 32, 8, 4


def vision_vocab() -> Vocab:
    """tinymodels' SentencePiece vocabulary with Gemma's image tokens at its end."""
    v = spm_vocab()
    extra = ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]
    return Vocab(v.model, v.pre, [*v.tokens, *extra], [*v.token_types, 3, 3, 3], [],
                 [*(v.scores or []), -1000.0, -1000.0, -1000.0], v.bos_id, v.eos_id, v.unk_id,
                 v.pad_id, v.add_bos)  # fmt: skip


def build_gemma3_vision(directory: Path, *, seed: int = 0) -> T.Gemma3ForConditionalGeneration:
    vocab = vision_vocab()
    n = len(vocab.tokens)
    text = T.Gemma3TextConfig(
        vocab_size=n, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=8,
        query_pre_attn_scalar=16, max_position_embeddings=256, bos_token_id=vocab.bos_id,
        eos_token_id=vocab.eos_id, pad_token_id=vocab.pad_id,
    )  # fmt: skip
    vision = T.SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        image_size=IMAGE_SIZE, patch_size=PATCH, vision_use_head=False,
    )  # fmt: skip
    config = T.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=TOKENS_PER_IMAGE,
        boi_token_index=n - 3, eoi_token_index=n - 2, image_token_index=n - 1,
    )  # fmt: skip
    config.text_config._attn_implementation = "eager"
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = T.Gemma3ForConditionalGeneration(config).float().eval()
    _randomize(model, seed)
    model.save_pretrained(directory)
    _save_sentencepiece(vocab, directory)
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 5]}))
    return model


@torch.no_grad()
def _randomize(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=gen)
        if name.endswith("bias") or "norm" in name or "layernorm" in name:
            base = 1.0 if "vision_tower" in name and name.endswith("weight") else 0.0
            p.copy_(base + 0.1 * noise)
        elif "embed_tokens" in name or "lm_head" in name:
            p.copy_(0.5 * noise)
        elif p.dim() >= 2:
            p.copy_(noise / p.shape[-1] ** 0.5)
        else:
            p.copy_(0.1 * noise)
