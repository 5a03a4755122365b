"""A tiny random-weight HF MllamaForConditionalGeneration (Llama 3.2 Vision) saved as an HF
directory with a byte-level BPE tokenizer whose last token is `<|image|>`, shaped as
../shared/reference/tiny_vision_models.py's mllama (tiles of 28 px, 14 px patches, up to 4
tiles, one global layer, intermediate layer 0, cross-attention at layer 1), HF's constant inits
(gates, norms, biases) made random."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers as T
from gguf import TokenType
from hf_dirs import _save_bpe
from hf_vision import _randomize
from tinymodels import Vocab, bpe_vocab

TILE, PATCH, MAX_TILES = 28, 14, 4
POSITIONS = (TILE // PATCH) ** 2 + 1  # a tile's patches and its class token


def mllama_vocab() -> Vocab:
    v = bpe_vocab("llama")
    return Vocab(v.model, v.pre, [*v.tokens, "<|image|>"], [*v.token_types, TokenType.CONTROL],
                 v.merges, v.scores, v.bos_id, v.eos_id, v.unk_id, v.pad_id, v.add_bos)  # fmt: skip


def build_mllama(directory: Path, *, seed: int = 0) -> T.MllamaForConditionalGeneration:
    """The text vocabulary is the tokenizer's without `<|image|>`, which is the id after it (as
    Llama 3.2 Vision's 128256; the embeddings have 8 rows more)."""
    vocab = mllama_vocab()
    n = len(vocab.tokens) - 1
    vision = T.MllamaVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_global_layers=1,
        attention_heads=2, image_size=TILE, patch_size=PATCH, max_num_tiles=MAX_TILES,
        intermediate_layers_indices=[0], vision_output_dim=64,
        supported_aspect_ratios=[[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]],
    )  # fmt: skip
    text = T.MllamaTextConfig(
        vocab_size=n, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        cross_attention_layers=[1], bos_token_id=vocab.bos_id, eos_token_id=vocab.eos_id,
        pad_token_id=vocab.pad_id, tie_word_embeddings=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64},
    )  # fmt: skip
    config = T.MllamaConfig(vision_config=vision, text_config=text, image_token_index=n)
    config._attn_implementation = "eager"
    config.text_config._attn_implementation = "eager"
    config.vision_config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = T.MllamaForConditionalGeneration(config).float().eval()
    _randomize(model, seed)
    with torch.no_grad():  # HF's gates start at 0 or pi/4: random values, away from both
        for name, p in model.named_parameters():
            if "gate" in name and p.numel() == 1:
                p.copy_(0.3 + torch.rand(1))
    model.save_pretrained(directory)
    _save_bpe("llama", vocab, directory)
    return model
