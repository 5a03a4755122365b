"""Qwen3-VL's vision tower (also Qwen3.5's) as Ollama's converters write it: HF's
`model.visual.*` under `v.*` (convert_qwen3vl.go's names: the fused qkv of each block split into
q/k/v, the Conv3d kernel kept whole as (out·in, T, P, P)) and its `{arch}.vision.*` keys, with
`preprocessor_config.json`'s pixel bounds, mean and std."""

from pathlib import Path
from typing import Any

from ember.convert.source import ConvertError, HFConfig, read_json

_TOWER = ("model.visual.", "visual.")
# HF's tower names -> Ollama's
_NAMES = (
    ("patch_embed.proj", "patch_embed"),
    ("blocks.", "blk."),
    ("attn.proj", "attn_out"),
    ("deepstack_merger_list", "deepstack_merger"),
)
_MODULES = ("patch_embed", "pos_embed", "blk", "merger", "deepstack_merger")


class Qwen3VLTower:
    def __init__(self, v: HFConfig, text_hidden: int) -> None:
        self.v_layers = v.int("depth", 27, maximum=1024)
        self.v_hidden = v.int("hidden_size", 1152)
        self.v_ffn = v.int("intermediate_size", 4304)
        self.v_heads = v.int("num_heads", 16, maximum=4096)
        self.patch_size = v.int("patch_size", 16, maximum=1024)
        self.merge_size = v.int("spatial_merge_size", 2, maximum=64)
        self.temporal = v.int("temporal_patch_size", 2, maximum=16)
        self.positions = v.int("num_position_embeddings", 2304, maximum=1 << 20)
        self.deepstack = v.get("deepstack_visual_indexes", [])
        self.text_hidden = text_hidden
        self.sizes = {"shortest_edge": 65536, "longest_edge": 16777216}
        self.mean_std = [0.5] * 3, [0.5] * 3
        if v.int("in_channels", 3, maximum=3) != 3:
            raise ConvertError("vision_config: only 3 input channels are supported")
        if v.int("out_hidden_size", text_hidden) != text_hidden or self.v_hidden % self.v_heads:
            raise ConvertError("vision_config: out_hidden_size or num_heads do not fit")
        if v.get("hidden_act", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
            raise ConvertError("vision_config: only the gelu_pytorch_tanh activation is supported")
        if not isinstance(self.deepstack, list) or not all(
            isinstance(i, int) and 0 <= i < self.v_layers for i in self.deepstack
        ):
            raise ConvertError("vision_config: deepstack_visual_indexes must list block numbers")

    def rename(self, hf_name: str) -> str | None:
        """The tower tensor's GGUF name; None for a tensor outside the tower."""
        rest = next((hf_name.removeprefix(p) for p in _TOWER if hf_name.startswith(p)), None)
        if rest is None:
            return None
        for hf, ours in _NAMES:
            rest = rest.replace(hf, ours)
        if rest.split(".")[0] not in _MODULES:
            raise ConvertError(f"unexpected vision tensor {hf_name!r}")
        return "v." + rest

    def split(self, hf_name: str) -> dict[str, Any]:
        """The GGUF tensors of a tower tensor that is cut or reshaped; {} for any other."""
        if hf_name.endswith("patch_embed.proj.weight") and hf_name.startswith(_TOWER):
            return {"v.patch_embed.weight": lambda w: w.flatten(0, 1)}
        if ".attn.qkv." in hf_name and hf_name.startswith(_TOWER):
            block, kind = hf_name.split(".blocks.")[1].split(".")[0], hf_name.rsplit(".", 1)[1]
            return {f"v.blk.{block}.attn_{n}.{kind}": _third(i) for i, n in enumerate("qkv")}
        name = self.rename(hf_name)
        return {} if name is None else {name: lambda w: w}

    def shapes(self) -> dict[str, tuple[int, ...]]:
        c, f, p, u = self.v_hidden, self.v_ffn, self.patch_size, self.v_hidden * self.merge_size**2
        vision: dict[str, tuple[int, ...]] = {
            "v.patch_embed.weight": (c * 3, self.temporal, p, p), "v.patch_embed.bias": (c,),
            "v.pos_embed.weight": (self.positions, c),
        }  # fmt: skip
        mergers = {"v.merger.": c}
        mergers |= {f"v.deepstack_merger.{i}.": u for i in range(len(self.deepstack))}
        for prefix, norm in mergers.items():
            vision |= {prefix + "norm.weight": (norm,), prefix + "norm.bias": (norm,),
                       prefix + "linear_fc1.weight": (u, u), prefix + "linear_fc1.bias": (u,),
                       prefix + "linear_fc2.weight": (self.text_hidden, u),
                       prefix + "linear_fc2.bias": (self.text_hidden,)}  # fmt: skip
        per_layer = {"norm1": (c,), "norm2": (c,), "attn_q": (c, c), "attn_k": (c, c),
                     "attn_v": (c, c), "attn_out": (c, c), "mlp.linear_fc1": (f, c),
                     "mlp.linear_fc2": (c, f)}  # fmt: skip
        for i in range(self.v_layers):
            for name, shape in per_layer.items():
                vision[f"v.blk.{i}.{name}.weight"] = shape
                vision[f"v.blk.{i}.{name}.bias"] = (shape[0],)
        return vision

    def read_processor(self, directory: Path) -> None:
        processor = read_json(directory / "preprocessor_config.json", required=False) or {}
        size = processor.get("size")
        size = size if isinstance(size, dict) else {}
        for key in self.sizes:
            self.sizes[key] = _positive(size.get(key, self.sizes[key]), f"size.{key}")
        self.mean_std = _triple(processor, "image_mean"), _triple(processor, "image_std")

    def metadata(self, a: str) -> dict[str, Any]:
        return {
            f"{a}.vision.block_count": self.v_layers,
            f"{a}.vision.embedding_length": self.v_hidden,
            f"{a}.vision.attention.head_count": self.v_heads,
            f"{a}.vision.num_channels": 3,
            f"{a}.vision.patch_size": self.patch_size,
            f"{a}.vision.spatial_merge_size": self.merge_size,
            f"{a}.vision.attention.layer_norm_epsilon": 1e-6,
            f"{a}.vision.rope.freq_base": 10000.0,
            f"{a}.vision.temporal_patch_size": self.temporal,
            f"{a}.vision.deepstack_visual_indexes": self.deepstack,
            f"{a}.vision.shortest_edge": self.sizes["shortest_edge"],
            f"{a}.vision.longest_edge": self.sizes["longest_edge"],
            f"{a}.vision.image_mean": self.mean_std[0],
            f"{a}.vision.image_std": self.mean_std[1],
        }


def _positive(value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConvertError(f"preprocessor_config.json: {key} must be a positive integer")
    return value


def _triple(processor: dict[str, Any], key: str) -> list[float]:
    values = processor.get(key, [0.5] * 3)
    if not isinstance(values, list) or len(values) != 3 or not all(
        isinstance(x, int | float) and not isinstance(x, bool) for x in values
    ):
        raise ConvertError(f"preprocessor_config.json: {key} must list 3 numbers")
    return [float(x) for x in values]


def _third(i: int) -> Any:
    return lambda w: w.chunk(3, 0)[i]
