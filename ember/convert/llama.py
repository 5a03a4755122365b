"""Llama (and Mistral, SmolLM) checkpoints: Q/K rows permuted for ggml's adjacent-pair RoPE,
linear RoPE scaling and YaRN as keys, llama 3's frequency scaling as a `rope_freqs` tensor."""

import math
from typing import Any

import torch

from ember.convert.decoder import TextDecoder
from ember.convert.source import ConvertError, HFConfig


def permute_qk(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """HF's rotate-half rows -> ggml's adjacent pairs (llama.cpp's LlamaModel.permute)."""
    rows = w.shape[0]
    return w.reshape(num_heads, 2, rows // num_heads // 2, *w.shape[1:]).swapaxes(1, 2) \
        .reshape(w.shape)  # fmt: skip


class LlamaDecoder(TextDecoder):
    arch = "llama"
    is_permuted = True

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        self.rope = self.text.rope()
        self.rope_type = self.rope.get("rope_type", self.rope.get("type", "default"))
        if self.rope_type not in ("default", "linear", "llama3", "yarn"):
            raise ConvertError(f"RoPE scaling {self.rope_type!r} is not supported")
        if self.text.get("attention_bias", False) and not self.has_bias:
            raise ConvertError("attention_bias is not supported for llama")
        if self.text.get("mlp_bias", False):
            raise ConvertError("mlp_bias is not supported")
        if self.has_sliding_window():
            raise ConvertError("sliding-window attention is not supported for this architecture")

    def has_sliding_window(self) -> bool:
        return self.text.get("sliding_window") is not None

    has_bias = False

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        if not self.has_bias:
            return {}
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return {"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)}

    def transform(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if self.is_permuted and name.endswith("attn_q.weight"):
            return permute_qk(tensor, self.num_heads)
        if self.is_permuted and name.endswith("attn_k.weight"):
            return permute_qk(tensor, self.num_kv_heads)
        return tensor

    def metadata(self) -> dict[str, Any]:
        a = self.arch
        meta = super().metadata() | {
            f"{a}.rope.freq_base": float(self.rope.get("rope_theta", 10000.0)),
            f"{a}.rope.dimension_count": self.head_dim,
            f"{a}.attention.key_length": self.head_dim,
            f"{a}.attention.value_length": self.head_dim,
            f"{a}.vocab_size": self.vocab_size,
        }
        if self.rope_type == "linear":
            meta[f"{a}.rope.scaling.type"] = "linear"
            meta[f"{a}.rope.scaling.factor"] = HFConfig(self.rope, "rope").float("factor")
        if self.rope_type == "yarn":
            meta |= yarn_metadata(a, self.rope, self.text)
        return meta

    def extra_tensors(self) -> dict[str, torch.Tensor]:
        if self.rope_type != "llama3":
            return {}
        return {
            "rope_freqs.weight": llama3_rope_factors(HFConfig(self.rope, "rope"), self.head_dim)
        }


def yarn_metadata(arch: str, rope: dict[str, Any], text: HFConfig) -> dict[str, Any]:
    """YaRN's keys, its settings read as HF's _compute_yarn_parameters reads them: the pretrained
    context (the config's original_max_position_embeddings, else the RoPE's, else
    max_position_embeddings), the factor (else their ratio) and the factor on cosines and sines
    (attention_factor, else from mscale over mscale_all_dim, else 0.1 ln factor + 1)."""
    r, most = HFConfig(rope, "rope"), 1 << 28
    if r.float("beta_fast", 32.0) != 32.0 or r.float("beta_slow", 1.0) != 1.0:
        raise ConvertError(f"{arch}: YaRN with beta_fast 32 and beta_slow 1 only")
    if not r.bool("truncate", True):
        raise ConvertError(f"{arch}: YaRN without truncation is not supported")
    longest = text.int("max_position_embeddings", 2048, maximum=most)
    original = r.int("original_max_position_embeddings", longest, maximum=most)
    original = text.int("original_max_position_embeddings", original, maximum=most)
    factor = r.float("factor", longest / original)

    def magnitude(m: float) -> float:
        return 0.1 * m * math.log(factor) + 1.0 if factor > 1.0 else 1.0

    mscale, mscale_all = r.float("mscale", 0.0), r.float("mscale_all_dim", 0.0)
    default = magnitude(mscale) / magnitude(mscale_all) if mscale and mscale_all else magnitude(1)
    return {
        f"{arch}.rope.scaling.type": "yarn",
        f"{arch}.rope.scaling.factor": factor,
        f"{arch}.rope.scaling.original_context_length": original,
        f"{arch}.rope.scaling.attn_factor": r.float("attention_factor", default),
    }


def llama3_rope_factors(rope: HFConfig, dim: int) -> torch.Tensor:
    """The per-frequency divisors of llama 3's RoPE scaling, as llama.cpp's converter."""
    base, factor = rope.float("rope_theta", 10000.0), rope.float("factor", 8.0)
    low, high = rope.float("low_freq_factor", 1.0), rope.float("high_freq_factor", 4.0)
    old_context = rope.float("original_max_position_embeddings", 8192)
    if high < low:  # equal in Llama 4: no band between the kept and the scaled frequencies
        raise ConvertError("rope: high_freq_factor must not be below low_freq_factor")
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    out = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < old_context / high:
            out.append(1.0)
        elif wavelen > old_context / low or high == low:
            out.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32)
