"""OLMo 2 and OLMo 3 checkpoints (Olmo2ForCausalLM, Olmo3ForCausalLM): no pre-norms,
post-attention and post-MLP norms, q/k norms over the whole projections, NeoX RoPE (rows kept as
HF has them). OLMo 3 adds sliding-window layers and YaRN on its full layers, written under
Ollama's `olmo3` keys (llama.cpp writes the same keys under `olmo2`)."""

from typing import Any

from ember.convert.decoder import _LAYER, TextDecoder
from ember.convert.llama import yarn_metadata
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
        if c.get("attention_bias", False):
            raise ConvertError(f"{self.arch}: attention_bias is not supported")
        self.check_attention()

    def check_attention(self) -> None:
        c = self.text
        if _rope_type(self.rope) != "default":
            raise ConvertError("olmo2: RoPE scaling is not supported")
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
        a = self.arch
        return super().metadata() | {
            f"{a}.context_length": self.text.int("max_position_embeddings", 4096, maximum=1 << 28),
            f"{a}.attention.key_length": self.head_dim,
            f"{a}.attention.value_length": self.head_dim,
            f"{a}.rope.freq_base": float(self.rope.get("rope_theta", 10000.0)),
        }


class Olmo3Decoder(Olmo2Decoder):
    """Layers of `layer_types` slide over `sliding_window` tokens with plain RoPE; the full
    ones take the config's RoPE scaling (YaRN or none), as HF's Olmo3RotaryEmbedding does."""

    arch = "olmo3"

    def check_attention(self) -> None:
        c = self.text
        self.rope = c.rope("full_attention")
        self.window = c.int("sliding_window", maximum=1 << 28)
        types = c.get("layer_types")
        if types is None:  # HF's default: every fourth layer full
            types = ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention"
                     for i in range(self.num_layers)]  # fmt: skip
        if not isinstance(types, list) or len(types) != self.num_layers or not set(types) <= {
            "sliding_attention", "full_attention"}:  # fmt: skip
            raise ConvertError("olmo3: layer_types must name each layer's attention")
        self.sliding = [t == "sliding_attention" for t in types]
        params = c.get("rope_parameters")
        local = params.get("sliding_attention") if isinstance(params, dict) else None
        local = local if isinstance(local, dict) else {"rope_theta": self.rope.get("rope_theta")}
        if _rope_type(local) != "default" or local.get("rope_theta") != self.rope.get("rope_theta"):
            raise ConvertError("olmo3: sliding layers must take the full layers' plain RoPE")
        if _rope_type(self.rope) not in ("default", "yarn"):
            raise ConvertError(f"olmo3: RoPE scaling {_rope_type(self.rope)!r} is not supported")

    def metadata(self) -> dict[str, Any]:
        a = self.arch
        meta = super().metadata() | {
            f"{a}.attention.sliding_window": self.window,
            f"{a}.attention.sliding_window_pattern": self.sliding,
        }
        if _rope_type(self.rope) == "yarn":
            meta |= yarn_metadata(a, self.rope, self.text)
        return meta


def _rope_type(rope: dict[str, Any]) -> str:
    return str(rope.get("rope_type", rope.get("type", "default")))
