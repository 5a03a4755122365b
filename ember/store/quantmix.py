"""The type of each tensor in a model quantized to Q8_0, Q4_K_M or Q4_K_S: llama.cpp's
llama_tensor_get_type (src/llama-quant.cpp) for these file types, which Ollama ports too; or
converted to F32, F16 or BF16 (Ollama's other --quantize types), every weight matrix alike."""

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ember.gguf import BLOCK_SIZES, GGMLType, GGUFFile, TensorInfo

# llama_ftype, as in general.file_type; in the order of Ollama's message, BF16 added
FILE_TYPES = {"F32": 0, "F16": 1, "BF16": 32, "Q4_K_S": 14, "Q4_K_M": 15, "Q8_0": 7}
SOURCE_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
_DEFAULT = {
    "F32": GGMLType.F32, "F16": GGMLType.F16, "BF16": GGMLType.BF16,
    "Q8_0": GGMLType.Q8_0, "Q4_K_S": GGMLType.Q4_K, "Q4_K_M": GGMLType.Q4_K,
}  # fmt: skip
# Rows that are no whole number of 256-value K-quant blocks take a 32-value type instead.
_FALLBACK = {
    GGMLType.Q4_K: GGMLType.Q5_0,
    GGMLType.Q5_K: GGMLType.Q5_1,
    GGMLType.Q6_K: GGMLType.Q8_0,
}
# Weights llama.cpp or Ollama never quantize: norms, routers, position and type embeddings,
# conv kernels, relative position biases, and (Ollama) the vision tower and projector.
_KEEP = (
    "_norm.weight", "ffn_gate_inp", "pos_embd", "position_embd", "token_types", "ssm_conv1d",
    "shortconv.conv", "rel_pos", "attn_rel_b", "mm.",
)  # fmt: skip
_OUTPUT = "output.weight"
_TOKEN_EMBD = ("token_embd.weight", "per_layer_token_embd.weight")
_ATTN_V = ("attn_qkv.weight", "attn_kv_b.weight", "attn_v.weight")  # what llama.cpp counts so
_LAYER = re.compile(r"blk\.(\d+)\.")


@dataclass(frozen=True, slots=True)
class _Mix:
    """What the choice of a tensor's type depends on besides its name and row length."""

    file_type: str
    tied_output: bool  # no output.weight: token_embd is the output matrix too
    attn_v: dict[str, int]  # attn_v-like weight -> its index in llama.cpp's order
    ffn_down: dict[str, int]  # ffn_down weight -> its layer, as llama.cpp counts layers
    num_attn_v: int
    num_layers: int
    num_experts: int


def tensor_types(gguf: GGUFFile, file_type: str) -> dict[str, GGMLType]:
    """Each tensor's type in the file quantized to `file_type` (its own when it is kept)."""
    mix = _mix(gguf, file_type)
    return {t.name: _tensor_type(t, mix) for t in gguf.tensors.values()}


def _tensor_type(info: TensorInfo, mix: _Mix) -> GGMLType:
    if not _quantizable(info):
        return info.ggml_type
    return _fitting(_mixed_type(info.name, info.shape[-1], mix), info.shape[-1])


def _quantizable(info: TensorInfo) -> bool:
    """A float weight matrix (or stack of them) that llama.cpp and Ollama quantize."""
    name = info.name
    return (
        len(info.shape) >= 2
        and name.endswith("weight")
        and info.ggml_type in SOURCE_TYPES
        and not name.startswith("v.")
        and not any(k in name for k in _KEEP)
    )


def _mixed_type(name: str, row: int, mix: _Mix) -> GGMLType:
    """llama_tensor_get_type_impl for the three file types (Falcon's and 70B's rules left out)."""
    default = _DEFAULT[mix.file_type]
    if default in SOURCE_TYPES:  # llama.cpp mixes types only for a quantized file type
        return default
    k_mix = default != GGMLType.Q8_0
    if name == _OUTPUT or (mix.tied_output and name in _TOKEN_EMBD):
        return GGMLType.Q6_K if k_mix and row % BLOCK_SIZES[default][0] == 0 else GGMLType.Q8_0
    if name in _TOKEN_EMBD:
        return default
    if name in mix.attn_v:
        return _attn_v_type(mix.attn_v[name], mix, default)
    if "attn_k.weight" in name and mix.num_experts == 8:
        return GGMLType.Q8_0
    if name in mix.ffn_down:
        return _ffn_down_type(mix.ffn_down[name], mix, default)
    if "attn_output.weight" in name and mix.num_experts == 8 and k_mix:
        return GGMLType.Q5_K
    return default


def _attn_v_type(index: int, mix: _Mix, default: GGMLType) -> GGMLType:
    if mix.num_experts == 8:  # llama.cpp: bumping them to Q8_0 costs the 8-expert model little
        return GGMLType.Q8_0
    if mix.file_type == "Q4_K_M" and _use_more_bits(index, mix.num_attn_v):
        return GGMLType.Q6_K
    if mix.file_type == "Q4_K_S" and index < 4:
        return GGMLType.Q5_K
    return default


def _ffn_down_type(layer: int, mix: _Mix, default: GGMLType) -> GGMLType:
    if mix.file_type == "Q4_K_M" and _use_more_bits(layer, mix.num_layers):
        return GGMLType.Q6_K
    if mix.file_type == "Q4_K_S" and layer < mix.num_layers // 8:
        return GGMLType.Q5_K
    return default


def _use_more_bits(layer: int, num_layers: int) -> bool:
    """llama.cpp's pick: the first and last eighth of the layers and every third in between."""
    eighth = num_layers // 8
    return layer < eighth or layer >= 7 * num_layers // 8 or (layer - eighth) % 3 == 2


def _fitting(wanted: GGMLType, row: int) -> GGMLType:
    """`wanted`, or llama.cpp's fallback when rows are no whole number of its blocks (F16 when
    even that does not fit, as Ollama does for Q8_0 too)."""
    if row % BLOCK_SIZES[wanted][0] == 0:
        return wanted
    fallback = _FALLBACK.get(wanted, GGMLType.F16)
    return fallback if row % BLOCK_SIZES[fallback][0] == 0 else GGMLType.F16


# ---------------------------------------------------------------- counting as llama.cpp


def _mix(gguf: GGUFFile, file_type: str) -> _Mix:
    names = sorted(gguf.tensors, key=_llama_order)
    quantized = [n for n in names if _quantizable(gguf.tensors[n])]
    attn_v = [n for n in quantized if _is_attn_v(n)]
    ffn_down = [n for n in quantized if "ffn_down" in n and not _is_attn_v(n)]
    arch = gguf.metadata.get("general.architecture", "")
    num_experts = int(gguf.metadata.get(f"{arch}.expert_count", 0) or 0)
    num_layers = int(gguf.metadata.get(f"{arch}.block_count", 0) or 0) or _count_layers(names)
    # llama.cpp counts ffn_down weights in order, but reads the layer from the name with experts
    layers = {n: _layer(n) for n in ffn_down} if num_experts > 1 else _indexes(ffn_down)
    return _Mix(
        file_type=file_type,
        tied_output=_OUTPUT not in gguf.tensors,
        attn_v=_indexes(attn_v),
        ffn_down=layers,
        num_attn_v=sum(1 for n in names if _is_attn_v(n)),
        num_layers=num_layers,
        num_experts=num_experts,
    )


def _is_attn_v(name: str) -> bool:
    return name != _OUTPUT and name not in _TOKEN_EMBD and any(k in name for k in _ATTN_V)


def _llama_order(name: str) -> tuple[int, str]:
    """llama.cpp's weight order: by layer (non-layer tensors first), then by name."""
    return _layer(name), name


def _layer(name: str) -> int:
    match = _LAYER.match(name)
    return int(match.group(1)) if match else -1


def _indexes(names: list[str]) -> dict[str, int]:
    return {n: i for i, n in enumerate(names)}


def _count_layers(names: Iterable[str]) -> int:
    return len({_layer(n) for n in names} - {-1})
