"""Qwen2 checkpoints: the llama layout with q/k/v biases, NeoX RoPE (rows kept as HF has them)."""

from typing import Any

from ember.convert.llama import LlamaDecoder


class Qwen2Decoder(LlamaDecoder):
    arch = "qwen2"
    is_permuted = False
    has_bias = True

    def has_sliding_window(self) -> bool:
        return bool(self.text.get("use_sliding_window", False))

    def metadata(self) -> dict[str, Any]:
        meta = super().metadata()
        del meta[f"{self.arch}.vocab_size"], meta[f"{self.arch}.rope.dimension_count"]  # as Qwen's
        return meta
