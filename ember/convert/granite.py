"""Granite (3.x dense) checkpoints: the llama layout (Q/K rows permuted) with four multipliers
written as llama.cpp's keys."""

from typing import Any

from ember.convert.llama import LlamaDecoder


class GraniteDecoder(LlamaDecoder):
    arch = "granite"

    def metadata(self) -> dict[str, Any]:
        c = self.text
        return super().metadata() | {
            "granite.embedding_scale": c.float("embedding_multiplier", 1.0),
            "granite.residual_scale": c.float("residual_multiplier", 1.0),
            "granite.attention.scale": c.float("attention_multiplier", self.head_dim**-0.5),
            "granite.logit_scale": c.float("logits_scaling", 1.0),
        }
