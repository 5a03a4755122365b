"""Phi-3 checkpoints (Phi3ForCausalLM): fused `qkv_proj` and `gate_up_proj` kept fused (as
llama.cpp's `attn_qkv` and `ffn_up`), NeoX RoPE over a `partial_rotary_factor` of each head,
LongRoPE as `rope_factors_short` / `rope_factors_long` tensors and its attention factor."""

import math
from typing import Any

import torch

from ember.convert.decoder import _LAYER, TextDecoder
from ember.convert.source import ConvertError, HFConfig


class Phi3Decoder(TextDecoder):
    arch = "phi3"
    layer_names = _LAYER | {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.text
        self.rope = c.rope()
        self.rope_type = self.rope.get("rope_type", self.rope.get("type", "default"))
        if self.rope_type in ("su", "yarn"):
            self.rope_type = "longrope"  # as transformers reads these older names
        if self.rope_type not in ("default", "longrope"):
            raise ConvertError(f"phi3: RoPE scaling {self.rope_type!r} is not supported")
        partial = float(self.rope.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0)))
        self.rope_dim = int(self.head_dim * partial)
        if not 0 < self.rope_dim <= self.head_dim or self.rope_dim % 2:
            raise ConvertError("phi3: partial_rotary_factor gives no even rotary size")
        if c.get("attention_bias", False) or c.get("mlp_bias", False):
            raise ConvertError("phi3: biases are not supported")

    def shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        c, f = self.hidden, self.ffn
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        shapes, required = self.top_shapes()
        per_layer = {
            "attn_norm.weight": (c,), "attn_qkv.weight": (q + 2 * kv, c),
            "attn_output.weight": (c, q), "ffn_norm.weight": (c,), "ffn_up.weight": (2 * f, c),
            "ffn_down.weight": (c, f),
        }  # fmt: skip
        for i in range(self.num_layers):
            for name, shape in per_layer.items():
                shapes[f"blk.{i}.{name}"] = shape
                required.add(f"blk.{i}.{name}")
        return shapes, required

    def _original_context(self) -> int:
        value = self.rope.get("original_max_position_embeddings")
        if value is None:
            return self.text.int("original_max_position_embeddings", 4096, maximum=1 << 28)
        return HFConfig(self.rope, "rope").int("original_max_position_embeddings", maximum=1 << 28)

    def _attn_factor(self) -> float:
        rope = HFConfig(self.rope, "rope")
        if self.rope.get("attention_factor") is not None:
            return rope.float("attention_factor")
        context = self.text.int("max_position_embeddings", 4096, maximum=1 << 28)
        factor = rope.float("factor", context / self._original_context())
        if factor <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(factor) / math.log(self._original_context()))

    def extra_tensors(self) -> dict[str, torch.Tensor]:
        if self.rope_type != "longrope":
            return {}
        out = {}
        for kind in ("short", "long"):
            values = self.rope.get(f"{kind}_factor")
            if not isinstance(values, list) or len(values) != self.rope_dim // 2:
                raise ConvertError(
                    f"phi3: rope {kind}_factor must list {self.rope_dim // 2} numbers"
                )
            if not all(isinstance(x, int | float) and math.isfinite(x) and x > 0 for x in values):
                raise ConvertError(f"phi3: rope {kind}_factor must hold positive numbers")
            out[f"rope_factors_{kind}.weight"] = torch.tensor(values, dtype=torch.float32)
        return out

    def metadata(self) -> dict[str, Any]:
        c = self.text
        meta = super().metadata() | {
            "phi3.context_length": c.int("max_position_embeddings", 4096, maximum=1 << 28),
            "phi3.rope.dimension_count": self.rope_dim,
            "phi3.rope.freq_base": float(self.rope.get("rope_theta", 10000.0)),
            "phi3.attention.key_length": self.head_dim,
            "phi3.attention.value_length": self.head_dim,
        }
        if self.rope_type == "longrope":
            meta["phi3.rope.scaling.attn_factor"] = self._attn_factor()
            meta["phi3.rope.scaling.original_context_length"] = self._original_context()
        if c.get("sliding_window") is not None:
            meta["phi3.attention.sliding_window"] = c.int("sliding_window", maximum=1 << 28)
        return meta
