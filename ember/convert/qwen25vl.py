"""Qwen2_5_VLForConditionalGeneration checkpoints -> Ollama's one GGUF (`qwen25vl`: the qwen2
text model, M-RoPE sections, the ViT under `v.*` with qwen25vl.vision.* keys), or llama.cpp's
pair: a `qwen2vl` text GGUF and an mmproj (`clip`, projector type `qwen2.5vl_merger`).

As both converters: the fused qkv of each vision block is split into q/k/v, and the Conv3d
patch kernel into one 2-D kernel per temporal frame."""

import itertools
from pathlib import Path
from typing import Any

from ember.convert.qwen2 import Qwen2Decoder
from ember.convert.source import ConvertError, HFConfig, read_json

_TOWER_PREFIXES = ("model.visual.", "visual.")
_BLOCK_NAMES = {"norm1": "ln1", "norm2": "ln2", "attn.proj": "attn_out",
                "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                "mlp.down_proj": "ffn_down"}  # fmt: skip
# Ollama's names -> llama.cpp's mmproj names
_MMPROJ = {"v.patch_embd_0.weight": "v.patch_embd.weight",
           "v.patch_embd_1.weight": "v.patch_embd.weight.1",
           "v.merger.ln_q.weight": "v.post_ln.weight"}  # fmt: skip
MAX_PIXELS = 2 << 20  # Ollama's bound: a folder may lower it, never raise it (CPU reservation)
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


class Qwen25VLDecoder(Qwen2Decoder):
    arch = "qwen25vl"
    text_arch = "qwen2vl"  # llama.cpp's text architecture beside an mmproj

    def __init__(self, config: HFConfig) -> None:
        super().__init__(config)
        v = self.vision = config.sub("vision_config")
        self.v_layers = v.int("depth", 32, maximum=1024)
        self.v_hidden = v.int("hidden_size", 1280)
        self.v_ffn = v.int("intermediate_size", 3420)
        self.v_heads = v.int("num_heads", 16, maximum=4096)
        self.patch_size = v.int("patch_size", 14, maximum=1024)
        self.merge_size = v.int("spatial_merge_size", 2, maximum=64)
        self.out_hidden = v.int("out_hidden_size", self.hidden)
        self.full_attention = v.get("fullatt_block_indexes", [7, 15, 23, 31])
        self.max_pixels = MAX_PIXELS
        if v.int("temporal_patch_size", 2, maximum=16) != 2:
            raise ConvertError("vision_config: only temporal_patch_size 2 is supported")
        if v.int("in_channels", v.int("in_chans", 3, maximum=3), maximum=3) != 3:
            raise ConvertError("vision_config: only 3 input channels are supported")
        if self.out_hidden != self.hidden or self.v_hidden % self.v_heads:
            raise ConvertError("vision_config: out_hidden_size or num_heads do not fit")
        if not isinstance(self.full_attention, list) or not all(
            isinstance(i, int) for i in self.full_attention
        ):
            raise ConvertError("vision_config: fullatt_block_indexes must list block numbers")

    def text_config(self, config: HFConfig) -> HFConfig:
        """The text keys (nested, or at the top level as older configs have them), with the
        M-RoPE sections taken out of the RoPE settings."""
        text = config.sub("text_config") if config.get("text_config") else config
        rope = text.rope()
        self.sections = rope.get("mrope_section", [16, 24, 24])
        if not isinstance(self.sections, list) or len(self.sections) != 3:
            raise ConvertError("rope: mrope_section must list 3 numbers")
        plain = {"rope_type": "default", "rope_theta": rope.get("rope_theta", 1000000.0)}
        values = {**text.values, "rope_parameters": plain, "rope_scaling": None}
        return HFConfig(values, text.label)

    def rename(self, hf_name: str) -> str | None:
        rest = next(
            (hf_name.removeprefix(p) for p in _TOWER_PREFIXES if hf_name.startswith(p)), None
        )
        if rest is None:
            return super().rename(hf_name)
        if rest.startswith("merger."):
            return "v." + rest
        parts = rest.split(".")
        if parts[0] == "blocks" and len(parts) >= 4:
            module = ".".join(parts[2:-1])
            if module in _BLOCK_NAMES:
                return f"v.blk.{parts[1]}.{_BLOCK_NAMES[module]}.{parts[-1]}"
        raise ConvertError(f"unexpected tensor {hf_name!r} for qwen2.5-vl")

    def split(self, hf_name: str) -> dict[str, Any]:
        if hf_name.endswith("patch_embed.proj.weight"):
            return {f"v.patch_embd_{t}.weight": _frame(t) for t in range(2)}
        if ".attn.qkv." in hf_name:
            block, kind = hf_name.split(".blocks.")[1].split(".")[0], hf_name.rsplit(".", 1)[1]
            return {f"v.blk.{block}.attn_{n}.{kind}": _third(i) for i, n in enumerate("qkv")}
        return super().split(hf_name)

    def shapes(self) -> tuple[dict[str, tuple[int, ...]], set[str]]:
        shapes, required = super().shapes()
        c, f, p, u = self.v_hidden, self.v_ffn, self.patch_size, self.v_hidden * self.merge_size**2
        vision: dict[str, tuple[int, ...]] = {
            "v.patch_embd_0.weight": (c, 3, p, p), "v.patch_embd_1.weight": (c, 3, p, p),
            "v.merger.ln_q.weight": (c,), "v.merger.mlp.0.weight": (u, u),
            "v.merger.mlp.0.bias": (u,), "v.merger.mlp.2.weight": (self.hidden, u),
            "v.merger.mlp.2.bias": (self.hidden,),
        }  # fmt: skip
        per_layer = {"ln1": (c,), "ln2": (c,), "attn_q": (c, c), "attn_k": (c, c),
                     "attn_v": (c, c), "attn_out": (c, c), "ffn_gate": (f, c), "ffn_up": (f, c),
                     "ffn_down": (c, f)}  # fmt: skip
        for i in range(self.v_layers):
            for name, shape in per_layer.items():
                vision[f"v.blk.{i}.{name}.weight"] = shape
                if name not in ("ln1", "ln2"):
                    vision[f"v.blk.{i}.{name}.bias"] = (shape[0],)
        return shapes | vision, required | set(vision)

    def directory_metadata(self, directory: Path) -> dict[str, Any]:
        processor = read_json(directory / "preprocessor_config.json", required=False) or {}
        size = processor.get("size")
        size = size if isinstance(size, dict) else {}
        most = processor.get("max_pixels", size.get("longest_edge", MAX_PIXELS))
        if isinstance(most, bool) or not isinstance(most, int) or most < 56 * 56:
            raise ConvertError("preprocessor_config.json: max_pixels must be an integer >= 3136")
        self.max_pixels = min(most, MAX_PIXELS)
        return super().directory_metadata(directory)

    def metadata(self) -> dict[str, Any]:
        a = self.arch
        return super().metadata() | {
            f"{a}.rope.mrope_section": self.sections,
            f"{a}.vision.block_count": self.v_layers,
            f"{a}.vision.embedding_length": self.v_hidden,
            f"{a}.vision.feed_forward_length": self.v_ffn,
            f"{a}.vision.attention.head_count": self.v_heads,
            f"{a}.vision.num_channels": 3,
            f"{a}.vision.patch_size": self.patch_size,
            f"{a}.vision.spatial_merge_size": self.merge_size,
            f"{a}.vision.spatial_patch_size": self.patch_size,
            f"{a}.vision.window_size": self.vision.int("window_size", 112, maximum=1 << 16),
            f"{a}.vision.attention.layer_norm_epsilon": 1e-6,
            f"{a}.vision.rope.freq_base": 10000.0,
            f"{a}.vision.fullatt_block_indexes": self.full_attention,
            f"{a}.vision.temporal_patch_size": 2,
            f"{a}.vision.max_pixels": self.max_pixels,
        }

    # ------------------------------------------------------------ llama.cpp's pair

    def text_only(self, meta: dict[str, Any]) -> dict[str, Any]:
        """The text GGUF's keys beside an mmproj: llama.cpp's qwen2vl names."""
        out = {}
        for key, value in meta.items():
            if key.startswith(("qwen25vl.vision.", "qwen25vl.rope.mrope_section")):
                continue
            out[key.replace("qwen25vl.", "qwen2vl.", 1)] = value
        return out | {"qwen2vl.rope.dimension_sections": [*self.sections, 0]}

    @staticmethod
    def mmproj_name(name: str) -> str:
        if name.startswith("v.merger.mlp."):
            return "mm." + name.removeprefix("v.merger.mlp.")
        return _MMPROJ.get(name, name)

    def mmproj_metadata(self) -> dict[str, Any]:
        full = sorted(self.full_attention)
        pattern = full[0] + 1 if full else self.v_layers + 1
        if any(b - a != pattern for a, b in itertools.pairwise(full)):
            raise ConvertError(f"fullatt_block_indexes {full} are not evenly spaced")
        return {
            "general.type": "mmproj",
            "clip.projector_type": "qwen2.5vl_merger",
            "clip.has_vision_encoder": True,
            "clip.use_silu": True,
            "clip.vision.image_size": 560,
            "clip.vision.patch_size": self.patch_size,
            "clip.vision.embedding_length": self.v_hidden,
            "clip.vision.feed_forward_length": self.v_ffn,
            "clip.vision.projection_dim": self.hidden,
            "clip.vision.block_count": self.v_layers,
            "clip.vision.attention.head_count": self.v_heads,
            "clip.vision.attention.layer_norm_epsilon": 1e-6,
            "clip.vision.n_wa_pattern": pattern,
            "clip.vision.window_size": self.vision.int("window_size", 112, maximum=1 << 16),
            "clip.vision.spatial_merge_size": self.merge_size,
            "clip.vision.max_pixels": self.max_pixels,
            "clip.vision.image_mean": CLIP_MEAN,
            "clip.vision.image_std": CLIP_STD,
        }


def _frame(t: int) -> Any:
    return lambda w: w[:, :, t]


def _third(i: int) -> Any:
    return lambda w: w.chunk(3, 0)[i]
