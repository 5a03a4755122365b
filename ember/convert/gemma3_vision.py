"""Gemma3ForConditionalGeneration checkpoints -> one GGUF with the text model and, as Ollama
writes it, the SigLIP tower under `v.*` and the projector under `mm.*` (gemma3.vision.* keys).
SigLIP's pooling head is not used by Gemma 3 and is not kept."""

import re
from typing import Any

from ember.convert.gemma3 import Gemma3Decoder
from ember.convert.source import ConvertError, HFConfig

_TOWER = re.compile(r"(?:model\.)?vision_tower\.(?:vision_model\.)?(.+)")
_PROJECTOR = re.compile(r"(?:model\.)?multi_modal_projector\.(.+)")
_LAYER = re.compile(r"encoder\.layers\.(\d+)\.(.+)")
_LAYER_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                "self_attn.v_proj": "attn_v", "self_attn.out_proj": "attn_output"}  # fmt: skip


class Gemma3VisionDecoder(Gemma3Decoder):
    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        v = self.vision = config.sub("vision_config")
        self.v_hidden, self.v_ffn = v.int("hidden_size", 1152), v.int("intermediate_size", 4304)
        self.v_layers = v.int("num_hidden_layers", 27, maximum=1024)
        self.v_heads = v.int("num_attention_heads", 16, maximum=4096)
        self.image_size, self.patch_size = v.int("image_size", 896), v.int("patch_size", 14)
        self.tokens_per_image = config.int("mm_tokens_per_image", 256)
        side, per_side = self.image_size // self.patch_size, round(self.tokens_per_image**0.5)
        if (
            per_side * per_side != self.tokens_per_image
            or side % per_side
            or self.v_hidden % self.v_heads
        ):
            raise ConvertError("vision_config: patches do not pool to mm_tokens_per_image")

    def rename(self, hf_name: str) -> str | None:
        tower, projector = _TOWER.fullmatch(hf_name), _PROJECTOR.fullmatch(hf_name)
        if projector is not None:
            return {"mm_input_projection_weight": "mm.mm_input_projection.weight",
                    "mm_soft_emb_norm.weight": "mm.mm_soft_emb_norm.weight"}.get(
                projector.group(1)) or self._unexpected(hf_name)  # fmt: skip
        if tower is None:
            return super().rename(hf_name)
        rest = tower.group(1)
        if rest.startswith("head."):
            return None
        rest = rest.removeprefix("embeddings.")
        layer = _LAYER.fullmatch(rest)
        if layer is not None:
            module, _, kind = layer.group(2).rpartition(".")
            return f"v.blk.{layer.group(1)}.{_LAYER_NAMES.get(module, module)}.{kind}"
        return f"v.{rest}"

    def _unexpected(self, hf_name: str) -> str:
        raise ConvertError(f"unexpected tensor {hf_name!r} for gemma3")

    def shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        shapes, required = super().shapes()
        c, f, p = self.v_hidden, self.v_ffn, self.patch_size
        vision = {
            "v.patch_embedding.weight": (c, 3, p, p), "v.patch_embedding.bias": (c,),
            "v.position_embedding.weight": ((self.image_size // p) ** 2, c),
            "v.post_layernorm.weight": (c,), "v.post_layernorm.bias": (c,),
            "mm.mm_input_projection.weight": (c, self.hidden), "mm.mm_soft_emb_norm.weight": (c,),
        }  # fmt: skip
        per_layer = {
            "layer_norm1": (c,),
            "layer_norm2": (c,),
            "attn_q": (c, c),
            "attn_k": (c, c),
            "attn_v": (c, c),
            "attn_output": (c, c),
            "mlp.fc1": (f, c),
            "mlp.fc2": (c, f),
        }
        for i in range(self.v_layers):
            for name, shape in per_layer.items():
                vision[f"v.blk.{i}.{name}.weight"] = shape
                vision[f"v.blk.{i}.{name}.bias"] = (shape[0],)
        return shapes | vision, required | set(vision)

    def metadata(self) -> dict[str, Any]:
        v = self.vision
        return super().metadata() | {
            "gemma3.vision.block_count": self.v_layers,
            "gemma3.vision.embedding_length": self.v_hidden,
            "gemma3.vision.feed_forward_length": self.v_ffn,
            "gemma3.vision.image_size": self.image_size,
            "gemma3.vision.patch_size": self.patch_size,
            "gemma3.vision.num_channels": v.int("num_channels", 3, maximum=3),
            "gemma3.vision.attention.head_count": self.v_heads,
            "gemma3.vision.attention.layer_norm_epsilon": v.float("layer_norm_eps", 1e-6),
            "gemma3.mm.tokens_per_image": self.tokens_per_image,
        }
