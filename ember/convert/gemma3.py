"""Gemma 3 text checkpoints (Gemma3ForCausalLM, and the text half of
Gemma3ForConditionalGeneration): norm weights stored with Gemma's +1, post-norms, q/k norms,
local and global RoPE bases. Ember's gemma3 attends globally on every sixth layer with
1/sqrt(head_dim) query scaling: a checkpoint that differs is refused, not silently misread."""

from typing import Any

import torch

from ember.convert.decoder import _LAYER, TextDecoder
from ember.convert.source import ConvertError, HFConfig

GLOBAL_EVERY = 6
LARGE_LAYERS = 62  # Gemma 3 27B scales queries by hidden/heads


class Gemma3Decoder(TextDecoder):
    arch = "gemma3"
    is_embedding = False  # EmbeddingGemma (gemma3_embed.py): bidirectional attention
    layer_names = _LAYER | {"post_attention_layernorm": "post_attention_norm"}

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        c = self.text
        self._check_layer_types()
        query_dim = (
            self.hidden // self.num_heads if self.num_layers == LARGE_LAYERS else self.head_dim
        )
        if c.float("query_pre_attn_scalar", self.head_dim) != query_dim:
            raise ConvertError(f"query_pre_attn_scalar must be {query_dim} for Ember's gemma3")
        for key in ("final_logit_softcapping", "attn_logit_softcapping"):
            if c.get(key) is not None:
                raise ConvertError(f"{key} is not supported for gemma3")
        if c.get("use_bidirectional_attention", False) != self.is_embedding:
            raise ConvertError(
                "a gemma3 with bidirectional attention converts only as an embedding model "
                "(Gemma3TextModel), and only such a model converts from Gemma3TextModel"
            )
        self.global_rope = c.rope("full_attention")
        self.local_rope = c.rope("sliding_attention")
        kind = self.global_rope.get("rope_type", self.global_rope.get("type", "default"))
        if kind not in ("default", "linear"):
            raise ConvertError(f"gemma3 RoPE scaling {kind!r} is not supported")

    def text_config(self, config: HFConfig) -> HFConfig:
        return config.sub("text_config") if "text_config" in config.values else config

    def _check_layer_types(self) -> None:
        types = self.text.get("layer_types")
        pattern = self.text.get("sliding_window_pattern", self.text.get("_sliding_window_pattern"))
        expected = ["full_attention" if (i + 1) % GLOBAL_EVERY == 0 else "sliding_attention"
                    for i in range(self.num_layers)]  # fmt: skip
        if types is None and pattern is not None:
            types = ["full_attention" if (i + 1) % int(pattern) == 0 else "sliding_attention"
                     for i in range(self.num_layers)]  # fmt: skip
        if types is not None and types != expected:
            raise ConvertError("gemma3: only a global layer every sixth layer is supported")

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        c, d = self.hidden, self.head_dim
        return {"attn_q_norm.weight": (d,), "attn_k_norm.weight": (d,),
                "post_attention_norm.weight": (c,), "post_ffw_norm.weight": (c,)}  # fmt: skip

    def transform(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if name.endswith("norm.weight") and not name.startswith("v."):  # mm soft-emb norm too
            return tensor.float() + 1.0
        return tensor

    def metadata(self) -> dict[str, Any]:
        c = self.text
        scaling = HFConfig(self.global_rope, "rope")
        meta = super().metadata() | {
            "gemma3.context_length": c.int("max_position_embeddings", 131072, maximum=1 << 28),
            "gemma3.attention.key_length": self.head_dim,
            "gemma3.attention.value_length": self.head_dim,
            "gemma3.attention.sliding_window": c.int("sliding_window", 4096, maximum=1 << 28),
            "gemma3.rope.freq_base": scaling.float("rope_theta", 1_000_000.0),
            "gemma3.rope.local.freq_base": HFConfig(self.local_rope).float("rope_theta", 10_000.0),
        }
        if self.global_rope.get("rope_type", self.global_rope.get("type")) == "linear":
            meta["gemma3.rope.scaling.type"] = "linear"
            meta["gemma3.rope.scaling.factor"] = scaling.float("factor")
        return meta
