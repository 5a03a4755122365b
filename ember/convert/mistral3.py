"""Mistral3ForConditionalGeneration checkpoints (Mistral Small 3.1: a Pixtral tower, the patch
merger and GELU projector, a mistral text model) -> Ollama's single `mistral3` GGUF (`v.*`, `mm.*`
beside the text, `mistral3.vision.*` keys), or llama.cpp's pair: a `llama` text GGUF plus a
`clip` mmproj of projector type `pixtral`.

The text Q/K rows are permuted for ggml's adjacent-pair RoPE in both forms; the tower's only in
the mmproj (llama.cpp's converter permutes them, Ollama's keeps HF's rotate-half order). The
mmproj also holds the text embedding of [IMG_BREAK] (`v.token_embd.img_break`), as llama.cpp's."""

import re
from pathlib import Path
from typing import Any

import torch

from ember.convert.llama import LlamaDecoder, permute_qk
from ember.convert.llava import CLIP_MEAN, CLIP_STD, preprocessor_triple
from ember.convert.source import ConvertError, HFConfig, read_json

_TOWER = re.compile(r"(?:model\.)?vision_tower\.(.+)")
_PROJECTOR = re.compile(r"(?:model\.)?multi_modal_projector\.(.+)")
_LAYER = re.compile(r"transformer\.layers\.(\d+)\.(.+)\.weight")
# HF -> Ollama's names (its converter's replacements)
_LAYER_NAMES = {"attention.q_proj": "attn_q", "attention.k_proj": "attn_k",
                "attention.v_proj": "attn_v", "attention.o_proj": "attn_output",
                "attention_norm": "attn_norm", "ffn_norm": "ffn_norm",
                "feed_forward.gate_proj": "ffn_gate", "feed_forward.up_proj": "ffn_up",
                "feed_forward.down_proj": "ffn_down"}  # fmt: skip
_TOWER_NAMES = {
    "patch_conv.weight": "v.patch_conv.weight",
    "ln_pre.weight": "v.encoder_norm.weight",
}
_PROJECTOR_NAMES = {"norm.weight": "mm.norm.weight",
                    "patch_merger.merging_layer.weight": "mm.patch_merger.merging_layer.weight",
                    "linear_1.weight": "mm.linear_1.weight", "linear_1.bias": "mm.linear_1.bias",
                    "linear_2.weight": "mm.linear_2.weight",
                    "linear_2.bias": "mm.linear_2.bias"}  # fmt: skip
# Ollama's names -> llama.cpp's mmproj names
_MMPROJ_NAMES = (
    (r"^v\.patch_conv\.", "v.patch_embd."),
    (r"^v\.encoder_norm\.", "v.pre_ln."),
    (r"\.attn_norm\.", ".ln1."),
    (r"\.ffn_norm\.", ".ln2."),
    (r"\.attn_output\.", ".attn_out."),
    (r"^mm\.norm\.", "mm.input_norm."),
    (r"^mm\.patch_merger\.merging_layer\.", "mm.patch_merger."),
    (r"^mm\.linear_([12])\.", r"mm.\1."),
)
IMG_BREAK = "[IMG_BREAK]"


class Mistral3Decoder(LlamaDecoder):
    arch = "mistral3"
    split_text_arch = "llama"  # llama.cpp writes Mistral Small 3.1's text model as llama

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        v = self.vision = config.sub("vision_config")
        self.v_hidden, self.v_ffn = v.int("hidden_size", 1024), v.int("intermediate_size", 4096)
        self.v_heads = v.int("num_attention_heads", 16, maximum=4096)
        self.image_size, self.patch_size = v.int("image_size", 1540), v.int("patch_size", 14)
        self.merge = config.int("spatial_merge_size", 2, maximum=64)
        self.v_theta = HFConfig(v.rope(), "vision_config rope").float("rope_theta", 10000.0)
        all_layers = v.int("num_hidden_layers", 24, maximum=1024)
        feature_layer = config.get("vision_feature_layer", -1)
        if not isinstance(feature_layer, int) or isinstance(feature_layer, bool):
            raise ConvertError("vision_feature_layer: only a single layer is supported")
        # hidden_states[k] is the output of the first k layers (k = 0: the embeddings)
        self.v_layers = feature_layer + all_layers + 1 if feature_layer < 0 else feature_layer
        if not 0 <= self.v_layers <= all_layers:
            raise ConvertError(f"vision_feature_layer {feature_layer} is out of range")
        if v.get("hidden_act", "gelu") != "silu":
            raise ConvertError("vision hidden_act: only 'silu' is supported (Mistral Small 3.1's)")
        if config.get("projector_hidden_act", "gelu") != "gelu":
            raise ConvertError("projector_hidden_act: only 'gelu' is supported")
        if self.v_hidden % self.v_heads or (self.v_hidden // self.v_heads) % 4:
            raise ConvertError("vision_config: the head size must be a multiple of 4 (2-D RoPE)")
        self.has_mm_bias = config.bool("multimodal_projector_bias", False)
        # tie_word_embeddings is read from the top level or from text_config depending on the
        # transformers version: the checkpoint decides (a saved lm_head is the head, else tied)
        self.is_tied = False
        self.longest_edge = self.image_size
        self.image_mean, self.image_std = CLIP_MEAN, CLIP_STD
        self.img_break_id: int | None = None

    def text_config(self, config: HFConfig) -> HFConfig:
        return config.sub("text_config")

    def rename(self, hf_name: str) -> str | None:
        projector = _PROJECTOR.fullmatch(hf_name)
        if projector is not None:
            if projector.group(1) not in _PROJECTOR_NAMES:
                raise ConvertError(f"unexpected tensor {hf_name!r} for mistral3")
            return _PROJECTOR_NAMES[projector.group(1)]
        tower = _TOWER.fullmatch(hf_name)
        if tower is None:
            return super().rename(hf_name)
        rest = tower.group(1)
        if rest in _TOWER_NAMES:
            return _TOWER_NAMES[rest]
        layer = _LAYER.fullmatch(rest)
        if layer is None or layer.group(2) not in _LAYER_NAMES:
            raise ConvertError(f"unexpected tensor {hf_name!r} for mistral3")
        if int(layer.group(1)) >= self.v_layers:
            return None  # after the feature layer: never run
        return f"v.blk.{layer.group(1)}.{_LAYER_NAMES[layer.group(2)]}.weight"

    def transform(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if name.startswith(("v.", "mm.")):
            return tensor  # Ollama keeps the tower's Q/K rows in HF's order
        return super().transform(name, tensor)

    def shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        shapes, required = super().shapes()
        c, f, p, h, m = self.v_hidden, self.v_ffn, self.patch_size, self.hidden, self.merge
        vision: dict[str, tuple[int, ...]] = {
            "v.patch_conv.weight": (c, 3, p, p), "v.encoder_norm.weight": (c,),
            "mm.norm.weight": (c,), "mm.patch_merger.merging_layer.weight": (c, c * m * m),
            "mm.linear_1.weight": (h, c), "mm.linear_2.weight": (h, h),
        }  # fmt: skip
        if self.has_mm_bias:
            vision |= {"mm.linear_1.bias": (h,), "mm.linear_2.bias": (h,)}
        per_layer = {"attn_norm": (c,), "ffn_norm": (c,), "attn_q": (c, c), "attn_k": (c, c),
                     "attn_v": (c, c), "attn_output": (c, c), "ffn_gate": (f, c),
                     "ffn_up": (f, c), "ffn_down": (c, f)}  # fmt: skip
        for i in range(self.v_layers):
            for name, shape in per_layer.items():
                vision[f"v.blk.{i}.{name}.weight"] = shape
        return shapes | vision, (required - {"output.weight"}) | set(vision)

    def directory_metadata(self, directory: Path) -> dict[str, Any]:
        processor = read_json(directory / "preprocessor_config.json", required=False) or {}
        settings = HFConfig(processor, "preprocessor_config.json")
        self.longest_edge = settings.sub("size").int(
            "longest_edge", self.image_size, maximum=1 << 15
        )
        self.image_mean = preprocessor_triple(processor.get("image_mean", CLIP_MEAN), "image_mean")
        self.image_std = preprocessor_triple(processor.get("image_std", CLIP_STD), "image_std")
        meta = super().directory_metadata(directory)
        tokens = meta["tokenizer.ggml.tokens"]
        self.img_break_id = tokens.index(IMG_BREAK) if IMG_BREAK in tokens else None
        return meta

    def metadata(self) -> dict[str, Any]:
        v = self.vision
        return super().metadata() | {
            "mistral3.vision.block_count": self.v_layers,
            "mistral3.vision.embedding_length": self.v_hidden,
            "mistral3.vision.feed_forward_length": self.v_ffn,
            "mistral3.vision.attention.head_count": self.v_heads,
            "mistral3.vision.attention.key_length": self.v_hidden // self.v_heads,
            "mistral3.vision.image_size": self.image_size,
            "mistral3.vision.longest_edge": self.longest_edge,
            "mistral3.vision.patch_size": self.patch_size,
            "mistral3.vision.num_channels": v.int("num_channels", 3, maximum=3),
            "mistral3.vision.rope.freq_base": self.v_theta,
            "mistral3.image_token_index": self.config.int("image_token_index", 10, maximum=1 << 22),
            "mistral3.spatial_merge_size": self.merge,
            "mistral3.mm.projector_bias": self.has_mm_bias,
        }

    # ------------------------------------------------------------ llama.cpp's mmproj

    def is_text_key(self, key: str) -> bool:
        return not key.startswith(("mistral3.vision.", "mistral3.mm.")) and key not in (
            "mistral3.image_token_index",
            "mistral3.spatial_merge_size",
        )

    def mmproj_name(self, name: str) -> str:
        for pattern, replacement in _MMPROJ_NAMES:
            name = re.sub(pattern, replacement, name)
        return name

    def mmproj_transform(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """llama.cpp's converter permutes the tower's Q/K rows for its RoPE, as the text's."""
        if name.endswith((".attn_q.weight", ".attn_k.weight")):
            return permute_qk(tensor, self.v_heads)
        return tensor

    def img_break_source(self) -> tuple[str, int]:
        """The text embedding row llama.cpp copies into the mmproj as v.token_embd.img_break."""
        if self.img_break_id is None:
            raise ConvertError(f"the tokenizer has no {IMG_BREAK} token")
        return "token_embd.weight", self.img_break_id

    def mmproj_metadata(self) -> dict[str, Any]:
        return {
            "general.type": "mmproj",
            "clip.projector_type": "pixtral",
            "clip.has_vision_encoder": True,
            "clip.use_silu": True,
            "clip.vision.image_size": self.longest_edge,
            "clip.vision.patch_size": self.patch_size,
            "clip.vision.embedding_length": self.v_hidden,
            "clip.vision.feed_forward_length": self.v_ffn,
            "clip.vision.projection_dim": self.hidden,
            "clip.vision.block_count": self.v_layers,
            "clip.vision.attention.head_count": self.v_heads,
            "clip.vision.attention.layer_norm_epsilon": 1e-5,  # hard-coded in HF's Pixtral
            "clip.vision.image_mean": self.image_mean,
            "clip.vision.image_std": self.image_std,
            "clip.vision.spatial_merge_size": self.merge,
        }
