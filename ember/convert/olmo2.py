"""OLMo 2 checkpoints (Olmo2ForCausalLM): no pre-norms, post-attention and post-MLP norms, q/k
norms over the whole projections, NeoX RoPE (rows kept as HF has them)."""

from typing import Any

from ember.convert.decoder import _LAYER, TextDecoder
from ember.convert.source import ConvertError, HFConfig

_PRE_NORMS = ("attn_norm.weight", "ffn_norm.weight")


class Olmo2Decoder(TextDecoder):
    arch = "olmo2"
    layer_names = {k: v for k, v in _LAYER.items() if k != "input_layernorm"} | {
        "post_attention_layernorm": "post_attention_norm"
    }

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.text
        self.rope = c.rope()
        if self.rope.get("rope_type", self.rope.get("type", "default")) != "default":
            raise ConvertError("olmo2: RoPE scaling is not supported")
        if c.get("attention_bias", False):
            raise ConvertError("olmo2: attention_bias is not supported")
        if c.get("sliding_window") is not None or c.get("layer_types") is not None:
            raise ConvertError("olmo2: sliding-window attention is not supported")

    def shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        shapes, required = super().shapes()
        keep = {n: s for n, s in shapes.items() if not n.endswith(_PRE_NORMS)}
        return keep, {n for n in required if not n.endswith(_PRE_NORMS)}

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        c, q, kv = self.hidden, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return {"attn_q_norm.weight": (q,), "attn_k_norm.weight": (kv,),
                "post_attention_norm.weight": (c,), "post_ffw_norm.weight": (c,)}  # fmt: skip

    def metadata(self) -> dict[str, Any]:
        return super().metadata() | {
            "olmo2.context_length": self.text.int("max_position_embeddings", 4096, maximum=1 << 28),
            "olmo2.attention.key_length": self.head_dim,
            "olmo2.attention.value_length": self.head_dim,
            "olmo2.rope.freq_base": float(self.rope.get("rope_theta", 10000.0)),
        }
