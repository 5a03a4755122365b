"""Gemma 2 checkpoints (Gemma2ForCausalLM): norm weights stored with Gemma's +1, post-norms,
attention and final logit softcapping, sliding window on even layers. Ember's gemma2 scales
queries by 1/sqrt(head_dim) (by hidden/heads for the 46-layer 27B) and alternates sliding and
global layers: a checkpoint that differs is refused, not silently misread."""

from typing import Any

import torch

from ember.convert.decoder import _LAYER, TextDecoder
from ember.convert.source import ConvertError, HFConfig

LARGE_LAYERS = 46


class Gemma2Decoder(TextDecoder):
    arch = "gemma2"
    layer_names = _LAYER | {"post_attention_layernorm": "post_attention_norm"}

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.text
        query_dim = (
            self.hidden // self.num_heads if self.num_layers == LARGE_LAYERS else self.head_dim
        )
        if c.float("query_pre_attn_scalar", self.head_dim) != query_dim:
            raise ConvertError(f"query_pre_attn_scalar must be {query_dim} for Ember's gemma2")
        expected = ["sliding_attention" if i % 2 == 0 else "full_attention"
                    for i in range(self.num_layers)]  # fmt: skip
        if c.get("layer_types", expected) != expected:
            raise ConvertError("gemma2: only alternating sliding and global layers are supported")
        self.rope = c.rope()
        if self.rope.get("rope_type", self.rope.get("type", "default")) != "default":
            raise ConvertError("gemma2: RoPE scaling is not supported")
        if c.get("use_bidirectional_attention", False):
            raise ConvertError("gemma2 with bidirectional attention does not convert")
        if c.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
            raise ConvertError("gemma2: only the gelu_pytorch_tanh activation is supported")

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        c = self.hidden
        return {"post_attention_norm.weight": (c,), "post_ffw_norm.weight": (c,)}

    def transform(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.float() + 1.0 if name.endswith("norm.weight") else tensor

    def metadata(self) -> dict[str, Any]:
        c = self.text
        meta = super().metadata() | {
            "gemma2.context_length": c.int("max_position_embeddings", 8192, maximum=1 << 28),
            "gemma2.attention.key_length": self.head_dim,
            "gemma2.attention.value_length": self.head_dim,
            "gemma2.attention.sliding_window": c.int("sliding_window", 4096, maximum=1 << 28),
            "gemma2.rope.freq_base": float(self.rope.get("rope_theta", 10000.0)),
        }
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            if c.get(key) is not None:
                meta[f"gemma2.{key}"] = c.float(key)
        return meta
