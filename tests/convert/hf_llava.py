"""A tiny random-weight HF LlavaForConditionalGeneration (CLIP tower, GELU projector, llama or
qwen2 text) saved as an HF directory with a byte-level BPE tokenizer holding `<image>`, shaped as
../shared/reference/tiny_vision_models.py's llava, HF's constant inits (zero biases) made random."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers as T
from gguf import TokenType
from hf_dirs import _save_bpe
from hf_vision import _randomize
from tinymodels import Vocab, bpe_vocab

IMAGE_SIZE, PATCH = 32, 8
PATCHES = (IMAGE_SIZE // PATCH) ** 2  # one image token per patch (the class token is dropped)


def llava_vocab() -> Vocab:
    v = bpe_vocab("llama")
    return Vocab(v.model, v.pre, [*v.tokens, "<image>"], [*v.token_types, TokenType.CONTROL],
                 v.merges, v.scores, v.bos_id, v.eos_id, v.unk_id, v.pad_id, v.add_bos)  # fmt: skip


TEXT_CONFIGS = {"llama": T.LlamaConfig, "qwen2": T.Qwen2Config}  # Qwen2: q/k/v biases, NeoX RoPE


def build_llava(
    directory: Path, *, seed: int = 0, feature_layer: int = -2, text: str = "llama"
):
    vocab = llava_vocab()
    n = len(vocab.tokens)
    vision = T.CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        image_size=IMAGE_SIZE, patch_size=PATCH, projection_dim=32,
    )  # fmt: skip
    text_config = TEXT_CONFIGS[text](
        vocab_size=n, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=vocab.bos_id, eos_token_id=vocab.eos_id, pad_token_id=vocab.pad_id,
    )  # fmt: skip
    config = T.LlavaConfig(
        vision_config=vision, text_config=text_config, image_token_index=n - 1,
        image_seq_length=PATCHES, vision_feature_layer=feature_layer,
        vision_feature_select_strategy="default",
    )  # fmt: skip
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    config.vision_config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = T.LlavaForConditionalGeneration(config).float().eval()
    _randomize(model, seed)
    model.save_pretrained(directory)
    _save_bpe("llama", vocab, directory)
    return model
