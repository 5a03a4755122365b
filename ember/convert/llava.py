"""LlavaForConditionalGeneration checkpoints (a CLIP vision tower, a two-layer GELU projector, a
llama or qwen2 text model) -> a llama or qwen2 text GGUF plus an mmproj GGUF, llama.cpp's
convention for llava (projector type `mlp`; `v.*` tower names, `mm.0`/`mm.2` for the projector).
Ollama has no single-file form for llava, so the tower always goes to the mmproj file.

As llama.cpp's llava converter, the encoder layers after the one whose output is the image
features (vision_feature_layer) are not kept, nor the unused post-layernorm: the mmproj's model
runs every block it holds and drops the class token."""

import re
from pathlib import Path
from typing import Any

import torch

from ember.convert.llama import LlamaDecoder
from ember.convert.qwen2 import Qwen2Decoder
from ember.convert.source import ConvertError, HFConfig, read_json

_TOWER = re.compile(r"(?:model\.)?vision_tower\.(?:vision_model\.)?(.+)")
_PROJECTOR = re.compile(r"(?:model\.)?multi_modal_projector\.linear_([12])\.(weight|bias)")
_LAYER = re.compile(r"encoder\.layers\.(\d+)\.(.+)\.(weight|bias)")
_LAYER_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                "self_attn.v_proj": "attn_v", "self_attn.out_proj": "attn_out",
                "layer_norm1": "ln1", "layer_norm2": "ln2", "mlp.fc1": "ffn_up",
                "mlp.fc2": "ffn_down"}  # fmt: skip
_TOWER_NAMES = {"embeddings.class_embedding": "v.class_embd",
                "embeddings.patch_embedding.weight": "v.patch_embd.weight",
                "embeddings.position_embedding.weight": "v.position_embd.weight",
                "pre_layrnorm.weight": "v.pre_ln.weight",
                "pre_layrnorm.bias": "v.pre_ln.bias"}  # fmt: skip
# OpenAI CLIP's normalisation: CLIPImageProcessor's defaults
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]
_ACTIVATIONS = {"quick_gelu": False, "gelu": True}  # hidden_act -> clip.use_gelu


class LlavaDecoder(LlamaDecoder):
    """The tower and projector; the text model is llama's (a subclass mixes in another's)."""

    separate_projector = True  # the writer puts `v.*`/`mm.*` in an mmproj file

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        v = self.vision = config.sub("vision_config")
        self.v_hidden, self.v_ffn = v.int("hidden_size", 1024), v.int("intermediate_size", 4096)
        self.v_heads = v.int("num_attention_heads", 16, maximum=4096)
        self.image_size, self.patch_size = v.int("image_size", 336), v.int("patch_size", 14)
        self.mm_hidden = self.hidden  # linear_1's output: the text width, as HF's projector
        all_layers = v.int("num_hidden_layers", 24, maximum=1024)
        feature_layer = config.get("vision_feature_layer", -2)
        if not isinstance(feature_layer, int) or isinstance(feature_layer, bool):
            raise ConvertError("vision_feature_layer: only a single layer is supported")
        # hidden_states[k] is the output of the first k layers (k = 0: the embeddings)
        self.v_layers = feature_layer + all_layers + 1 if feature_layer < 0 else feature_layer
        if not 0 <= self.v_layers <= all_layers:
            raise ConvertError(f"vision_feature_layer {feature_layer} is out of range")
        if config.get("vision_feature_select_strategy", "default") != "default":
            raise ConvertError("vision_feature_select_strategy: only 'default' is supported")
        if config.get("projector_hidden_act", "gelu") != "gelu":
            raise ConvertError("projector_hidden_act: only 'gelu' is supported")
        self.activation = v.get("hidden_act", "quick_gelu")
        if self.activation not in _ACTIVATIONS:
            raise ConvertError(f"vision hidden_act {self.activation!r} is not supported")
        if self.image_size % self.patch_size or self.v_hidden % self.v_heads:
            raise ConvertError("vision_config: image_size or heads do not divide evenly")
        self.image_mean, self.image_std = CLIP_MEAN, CLIP_STD

    def text_config(self, config: HFConfig) -> HFConfig:
        return config.sub("text_config")

    def rename(self, hf_name: str) -> str | None:
        projector = _PROJECTOR.fullmatch(hf_name)
        if projector is not None:
            return f"mm.{0 if projector.group(1) == '1' else 2}.{projector.group(2)}"
        tower = _TOWER.fullmatch(hf_name)
        if tower is None:
            return super().rename(hf_name)
        rest = tower.group(1)
        if rest in _TOWER_NAMES:
            return _TOWER_NAMES[rest]
        layer = _LAYER.fullmatch(rest)
        if layer is not None and layer.group(2) in _LAYER_NAMES:
            if int(layer.group(1)) >= self.v_layers:
                return None  # after the feature layer: never run
            return f"v.blk.{layer.group(1)}.{_LAYER_NAMES[layer.group(2)]}.{layer.group(3)}"
        if rest.startswith("post_layernorm."):
            return None
        raise ConvertError(f"unexpected tensor {hf_name!r} for llava")

    def transform(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if name.startswith(("v.", "mm.")):
            return tensor  # only the text model's Q/K rows are permuted for ggml's RoPE
        return super().transform(name, tensor)

    def shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        shapes, required = super().shapes()
        c, f, p, m = self.v_hidden, self.v_ffn, self.patch_size, self.mm_hidden
        vision: dict[str, tuple[int, ...]] = {
            "v.class_embd": (c,), "v.patch_embd.weight": (c, 3, p, p),
            "v.position_embd.weight": ((self.image_size // p) ** 2 + 1, c),
            "v.pre_ln.weight": (c,), "v.pre_ln.bias": (c,),
            "mm.0.weight": (m, c), "mm.0.bias": (m,),
            "mm.2.weight": (self.hidden, m), "mm.2.bias": (self.hidden,),
        }  # fmt: skip
        per_layer = {"ln1": (c,), "ln2": (c,), "attn_q": (c, c), "attn_k": (c, c),
                     "attn_v": (c, c), "attn_out": (c, c), "ffn_up": (f, c),
                     "ffn_down": (c, f)}  # fmt: skip
        for i in range(self.v_layers):
            for name, shape in per_layer.items():
                vision[f"v.blk.{i}.{name}.weight"] = shape
                vision[f"v.blk.{i}.{name}.bias"] = (shape[0],)
        return shapes | vision, required | set(vision)

    def directory_metadata(self, directory: Path) -> dict[str, Any]:
        processor = read_json(directory / "preprocessor_config.json", required=False) or {}
        self.image_mean = preprocessor_triple(processor.get("image_mean", CLIP_MEAN), "image_mean")
        self.image_std = preprocessor_triple(processor.get("image_std", CLIP_STD), "image_std")
        return super().directory_metadata(directory)

    def mmproj_metadata(self) -> dict[str, Any]:
        return {
            "general.type": "mmproj",
            "clip.projector_type": "mlp",
            "clip.has_vision_encoder": True,
            "clip.has_llava_projector": True,
            "clip.use_gelu": _ACTIVATIONS[self.activation],
            "clip.vision.image_size": self.image_size,
            "clip.vision.patch_size": self.patch_size,
            "clip.vision.embedding_length": self.v_hidden,
            "clip.vision.feed_forward_length": self.v_ffn,
            "clip.vision.projection_dim": self.hidden,
            "clip.vision.block_count": self.v_layers,
            "clip.vision.attention.head_count": self.v_heads,
            "clip.vision.attention.layer_norm_epsilon": self.vision.float("layer_norm_eps", 1e-5),
            "clip.vision.image_mean": self.image_mean,
            "clip.vision.image_std": self.image_std,
        }


class LlavaQwen2Decoder(LlavaDecoder, Qwen2Decoder):
    """Llava with a qwen2 text model: Qwen2Decoder's arch, biases and unpermuted Q/K rows."""


# text_config.model_type -> the converter (Mistral's text model is llama's, as in CONVERTERS)
_BY_TEXT_TYPE = {"llama": LlavaDecoder, "mistral": LlavaDecoder, "qwen2": LlavaQwen2Decoder}


def llava_decoder(config: HFConfig) -> LlavaDecoder:
    """The converter for the checkpoint's text model (llama when unnamed, as HF's LlavaConfig)."""
    text_type = config.sub("text_config").get("model_type", "llama")
    make = _BY_TEXT_TYPE.get(text_type) if isinstance(text_type, str) else None
    if make is None:
        supported = ", ".join(sorted(_BY_TEXT_TYPE))
        raise ConvertError(f"llava text model {text_type!r} is not supported ({supported} are)")
    return make(config)


def preprocessor_triple(value: object, key: str) -> list[float]:
    if not isinstance(value, list) or len(value) != 3:
        raise ConvertError(f"preprocessor_config.json: {key} must list 3 numbers")
    try:
        return [float(x) for x in value]
    except (TypeError, ValueError):
        raise ConvertError(f"preprocessor_config.json: {key} must list 3 numbers") from None
