"""Llama (and Mistral, SmolLM) checkpoints: Q/K rows permuted for ggml's adjacent-pair RoPE,
linear RoPE scaling as keys, llama 3's frequency scaling as a `rope_freqs` tensor."""

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
        if self.rope_type not in ("default", "linear", "llama3"):
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
        return meta

    def extra_tensors(self) -> dict[str, torch.Tensor]:
        if self.rope_type != "llama3":
            return {}
        return {
            "rope_freqs.weight": llama3_rope_factors(HFConfig(self.rope, "rope"), self.head_dim)
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
