"""What the Gemma 3n and Gemma 4 converters share: the text model of a multimodal checkpoint
(its towers left out), the top tensors' names with the per-layer embeddings', each layer's
tensors by its full HF suffix, the sliding/full layer types and the shared-KV layers."""

import re
from typing import ClassVar

from ember.convert.decoder import TextDecoder
from ember.convert.source import ConvertError, HFConfig

TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "model.embed_tokens_per_layer.weight": "per_layer_token_embd.weight",
    "model.per_layer_model_projection.weight": "per_layer_model_proj.weight",
    "model.per_layer_projection_norm.weight": "per_layer_proj_norm.weight",
}
_LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.(.+)")
_TEXT = ("model.language_model.", "language_model.model.")
_OTHER_TOWERS = ("model.vision_tower.", "model.embed_vision.", "model.audio_tower.",
                 "model.embed_audio.")  # fmt: skip
KINDS = ("sliding_attention", "full_attention")


def text_name(hf_name: str) -> str:
    """An HF name with a multimodal checkpoint's text-model prefix made the text model's own."""
    for old in _TEXT:
        if hf_name.startswith(old):
            return "model." + hf_name.removeprefix(old)
    return hf_name


class GemmaTextDecoder(TextDecoder):
    layer_tensors: ClassVar[dict[str, str]]  # HF suffix after `model.layers.N.` -> GGUF's
    global_every: ClassVar[int]  # without layer_types: every this-many-th layer is full

    def text_config(self, config: HFConfig) -> HFConfig:
        return config.sub("text_config") if "text_config" in config.values else config

    def read_layout(self) -> None:
        """self.types (each layer's attention), self.sliding, self.shared (the shared-KV
        layers at the end), checked."""
        c, n = self.text, self.num_layers
        every = self.global_every
        self.types: list[str] = c.get("layer_types") or [
            "full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(n)
        ]
        if len(self.types) != n or not set(self.types) <= set(KINDS):
            raise ConvertError(f"{self.arch}: layer_types must name each layer's attention")
        self.sliding = [t == "sliding_attention" for t in self.types]
        self.shared: int = c.get("num_kv_shared_layers", 0)
        if not isinstance(self.shared, int) or not 0 <= self.shared < n:
            raise ConvertError(f"{self.arch}: num_kv_shared_layers must be below the layers")
        first = n - self.shared
        if self.shared and {*self.sliding[first:]} - {*self.sliding[:first]}:
            raise ConvertError(f"{self.arch}: a shared layer's type has no earlier layer to read")

    def rename(self, hf_name: str) -> str | None:
        hf_name = text_name(hf_name)
        if hf_name.startswith(_OTHER_TOWERS) or hf_name.endswith("rotary_emb.inv_freq"):
            return None
        if hf_name == "lm_head.weight" and self.is_tied:
            return None
        if hf_name in TOP:
            return TOP[hf_name]
        match = _LAYER_NAME.fullmatch(hf_name)
        if match is None or match.group(2) not in self.layer_tensors:
            raise ConvertError(f"unexpected tensor {hf_name!r} for {self.arch}")
        return f"blk.{match.group(1)}.{self.layer_tensors[match.group(2)]}"
