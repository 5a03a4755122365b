"""Qwen3 (dense) checkpoints: the qwen2 layout without biases, with per-head q/k RMSNorms."""

from typing import Any

from ember.convert.llama import LlamaDecoder
from ember.convert.qwen2 import Qwen2Decoder


class Qwen3Decoder(Qwen2Decoder):
    arch = "qwen3"
    has_bias = False

    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        d = self.head_dim
        return {"attn_q_norm.weight": (d,), "attn_k_norm.weight": (d,)}

    def metadata(self) -> dict[str, Any]:
        meta = LlamaDecoder.metadata(self)
        del meta["qwen3.vocab_size"]
        return meta
