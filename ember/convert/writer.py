"""An HF model directory -> one GGUF file, as `ollama create` does with `FROM <dir>`: checked
whole (architecture, tensor names and shapes, tokenizer) before a byte is written, then streamed
one tensor at a time. 2-D tensors keep their F32/F16/BF16 type (lossless); 1-D ones are F32."""

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from ember.convert.bert import BertCrossEncoder, BertEncoder
from ember.convert.decoder import TextDecoder
from ember.convert.gemma2 import Gemma2Decoder
from ember.convert.gemma3 import Gemma3Decoder
from ember.convert.gemma3_vision import Gemma3VisionDecoder
from ember.convert.granite import GraniteDecoder
from ember.convert.llama import LlamaDecoder
from ember.convert.llava import LlavaDecoder
from ember.convert.mmproj import is_vision_tensor, mmproj_metadata, mmproj_name
from ember.convert.olmo2 import Olmo2Decoder
from ember.convert.phi3 import Phi3Decoder
from ember.convert.qwen2 import Qwen2Decoder
from ember.convert.qwen3 import Qwen3Decoder
from ember.convert.source import ConvertError, HFConfig, Tensors, read_json

CONVERTERS: dict[str, Callable[[HFConfig], TextDecoder]] = {
    "BertModel": BertEncoder,
    "BertForSequenceClassification": BertCrossEncoder,
    "GraniteForCausalLM": GraniteDecoder,
    "LlamaForCausalLM": LlamaDecoder,
    "MistralForCausalLM": LlamaDecoder,
    "Olmo2ForCausalLM": Olmo2Decoder,
    "Phi3ForCausalLM": Phi3Decoder,
    "Qwen2ForCausalLM": Qwen2Decoder,
    "Qwen3ForCausalLM": Qwen3Decoder,
    "Gemma2ForCausalLM": Gemma2Decoder,
    "Gemma3ForCausalLM": Gemma3Decoder,
    "Gemma3ForConditionalGeneration": Gemma3VisionDecoder,
    "LlavaForConditionalGeneration": LlavaDecoder,
}
_FILE_TYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 32}  # llama_ftype


@dataclass(frozen=True, slots=True)
class Planned:
    """One tensor of the output: its GGUF name, where its data comes from, its stored type."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    load: Callable[[], torch.Tensor]


def converter_for(config: HFConfig) -> TextDecoder:
    names = config.get("architectures")
    if not isinstance(names, list) or not names or not isinstance(names[0], str):
        raise ConvertError("config.json names no architectures")
    make = CONVERTERS.get(names[0])
    if make is None:
        supported = ", ".join(sorted(CONVERTERS))
        raise ConvertError(f"unsupported architecture {names[0]!r} (supported: {supported})")
    return make(config)


def needs_projector_file(directory: Path) -> bool:
    """Whether the HF model in `directory` converts to a text GGUF plus an mmproj file only
    (llava: Ollama has no single-file form for it)."""
    config = HFConfig(read_json(directory / "config.json") or {})
    return isinstance(converter_for(config), LlavaDecoder)


def convert_directory(
    directory: Path, out: Path, *, name: str | None = None, mmproj: Path | None = None
) -> None:
    """Writes the GGUF of the HF model in `directory` to `out`; with `mmproj`, a vision model's
    tower goes there instead (llama.cpp's convention). Raises ConvertError."""
    config = HFConfig(read_json(directory / "config.json") or {})
    decoder = converter_for(config)
    tensors = Tensors(directory)
    plan = _plan(decoder, tensors)
    files = decoder.directory_metadata(directory)
    meta = _general(decoder, plan, name) | decoder.metadata() | files
    if isinstance(decoder, LlavaDecoder) and mmproj is None:
        raise ConvertError("a llava model converts to a text GGUF plus an mmproj file")
    if mmproj is not None:
        if isinstance(decoder, LlavaDecoder):
            clip_meta = decoder.mmproj_metadata()
        elif isinstance(decoder, Gemma3VisionDecoder):
            clip_meta = mmproj_metadata(decoder)
        else:
            raise ConvertError("only a vision model has an mmproj file")
        vision = [replace(p, name=mmproj_name(p.name)) for p in plan if is_vision_tensor(p.name)]
        file_type = _FILE_TYPES[next(p.dtype for p in vision if len(p.shape) == 2)]
        _write(mmproj, "clip", clip_meta | {"general.file_type": file_type}, vision)
        plan = [p for p in plan if not is_vision_tensor(p.name)]
        meta = {k: v for k, v in meta.items() if not k.startswith(("gemma3.vision.", "gemma3.mm."))}
    _write(out, decoder.arch, meta, plan)


def _plan(decoder: TextDecoder, tensors: Tensors) -> list[Planned]:
    shapes, required = decoder.shapes()
    plan: dict[str, Planned] = {}
    for hf_name in tensors:
        name = decoder.rename(hf_name)
        if name is None:
            continue
        if name in plan:
            raise ConvertError(f"two tensors map to {name!r}")
        shape = tensors.shape(hf_name)
        if shapes.get(name) != shape:
            raise ConvertError(
                f"tensor {hf_name!r} has shape {list(shape)}, the config implies "
                f"{list(shapes.get(name, ()))}"
            )
        dtype = tensors.dtype(hf_name) if len(shape) > 1 else torch.float32
        plan[name] = Planned(name, shape, dtype, _loader(decoder, tensors, hf_name, name))
    for name, value in decoder.extra_tensors().items():
        plan[name] = Planned(name, tuple(value.shape), torch.float32, _constant(value))
    missing = sorted(required - set(plan))
    if missing:
        raise ConvertError(
            f"the safetensors files lack {len(missing)} tensors, e.g. {missing[0]!r}"
        )
    return list(plan.values())


def _loader(
    decoder: TextDecoder, tensors: Tensors, hf_name: str, name: str
) -> Callable[[], torch.Tensor]:
    return lambda: decoder.transform(name, tensors.load(hf_name))


def _constant(value: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: value


def _general(decoder: TextDecoder, plan: list[Planned], name: str | None) -> dict[str, Any]:
    embedding = next(p for p in plan if p.name == "token_embd.weight")
    meta: dict[str, Any] = {"general.type": "model"} | ({"general.name": name} if name else {})
    return meta | {
        "general.file_type": _FILE_TYPES[embedding.dtype],
        "general.quantization_version": gguf.GGML_QUANT_VERSION,
    }


def _write(out: Path, arch: str, meta: dict[str, Any], plan: list[Planned]) -> None:
    writer = gguf.GGUFWriter(str(out), arch)
    for key, value in meta.items():
        _add(writer, key, value)
    for p in plan:
        kind = _numpy_dtype(p.dtype)
        nbytes = int(np.prod(p.shape)) * kind.itemsize
        raw = gguf.GGMLQuantizationType.BF16 if p.dtype == torch.bfloat16 else None
        writer.add_tensor_info(p.name, p.shape, kind, nbytes, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for p in plan:
        writer.write_tensor_data(_as_numpy(p.load(), p.dtype))
    writer.close()


def _add(writer: gguf.GGUFWriter, key: str, value: Any) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    else:
        writer.add_array(key, list(value))


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    return np.dtype({torch.float32: np.float32, torch.float16: np.float16}.get(dtype, np.int16))


def _as_numpy(tensor: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    t = tensor.to(dtype).contiguous()
    return t.view(torch.int16).numpy() if dtype == torch.bfloat16 else t.numpy()
