"""A tiny random-weight HF Gemma4ForConditionalGeneration with its vision tower (2 blocks of
width 32, 4-pixel patches pooled 3 × 3, clipped linears, standardized outputs) and no audio,
saved as an HF directory with the tiny byte-level vocabulary plus Gemma 4's image tokens."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers as T
from gguf import TokenType
from hf_dirs import _save_bpe
from hf_families import FAMILIES, randomize
from tinymodels import Vocab, bpe_vocab

SPECIALS = ["<|image>", "<image|>", "<|image|>"]
PATCH, KERNEL = 4, 3


def gemma4v_vocab() -> Vocab:
    v = bpe_vocab("qwen2")
    return Vocab(v.model, v.pre, [*v.tokens, *SPECIALS], [*v.token_types, *[TokenType.CONTROL] * 3],
                 v.merges, v.scores, v.bos_id, v.eos_id, v.unk_id, v.pad_id, v.add_bos)  # fmt: skip


def build_gemma4v(directory: Path, *, both_ways: bool = False, seed: int = 0):
    """both_ways: the larger models' `use_bidirectional_attention` "vision"."""
    vocab = gemma4v_vocab()
    n = len(vocab.tokens)
    text = {
        "vocab_size": n, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "bos_token_id": vocab.bos_id,
        "eos_token_id": vocab.eos_id, "pad_token_id": vocab.pad_id,
        "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": n,
        "use_bidirectional_attention": "vision" if both_ways else None,
    } | {k: v for k, v in FAMILIES["gemma4"][2].items() if k != "tie_word_embeddings"}
    vision = T.Gemma4VisionConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2, head_dim=16, patch_size=PATCH, pooling_kernel_size=KERNEL,
        position_embedding_size=1024, use_clipped_linears=True, standardize=True,
    )  # fmt: skip
    config = T.Gemma4Config(
        text_config=text, vision_config=vision, audio_config=None, boi_token_id=n - 3,
        eoi_token_id=n - 2, image_token_id=n - 1, video_token_id=n - 1, tie_word_embeddings=True,
    )  # fmt: skip
    for c in (config, config.text_config, config.vision_config):
        c._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = T.Gemma4ForConditionalGeneration(config).float().eval()
    randomize(model, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith(("input_min", "output_min")):  # bounds that bite now and then
                buffer.fill_(-2.0 - torch.rand((), generator=gen).item())
            elif name.endswith(("input_max", "output_max")):
                buffer.fill_(2.0 + torch.rand((), generator=gen).item())
            elif name.endswith("std_bias"):
                buffer.copy_(0.1 * torch.randn(buffer.shape, generator=gen))
            elif name.endswith("std_scale"):
                buffer.copy_(1.0 + 0.1 * torch.randn(buffer.shape, generator=gen))
    model.save_pretrained(directory)
    _save_bpe("qwen2", vocab, directory)
    return model


def hf_processor():
    return T.Gemma4ImageProcessorPil(patch_size=PATCH, pooling_kernel_size=KERNEL)
