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
from ember.convert.decoder import Combined, TextDecoder
from ember.convert.deepseek2 import DeepSeek2Decoder, Glm4MoeLiteDecoder
from ember.convert.gemma2 import Gemma2Decoder
from ember.convert.gemma3 import Gemma3Decoder
from ember.convert.gemma3_embed import Gemma3EmbeddingDecoder
from ember.convert.gemma3_vision import Gemma3VisionDecoder
from ember.convert.gemma3n import Gemma3nDecoder
from ember.convert.gemma4 import Gemma4Decoder
from ember.convert.gptoss import GptOssDecoder
from ember.convert.granite import GraniteDecoder
from ember.convert.laguna import LagunaDecoder
from ember.convert.lfm2 import Lfm2Decoder, Lfm2MoeDecoder
from ember.convert.llama import LlamaDecoder
from ember.convert.llama4 import Llama4Decoder
from ember.convert.llava import LlavaDecoder, llava_decoder
from ember.convert.mistral3 import Mistral3Decoder
from ember.convert.mllama import MllamaDecoder
from ember.convert.mmproj import is_vision_tensor, mmproj_metadata, mmproj_name
from ember.convert.nemotronh import NemotronHDecoder
from ember.convert.nomic_bert import NomicBertEncoder
from ember.convert.olmo2 import Olmo2Decoder, Olmo3Decoder
from ember.convert.phi3 import Phi3Decoder
from ember.convert.qwen2 import Qwen2Decoder
from ember.convert.qwen3 import Qwen3Decoder, Qwen3VLDecoder
from ember.convert.qwen3moe import Qwen3MoeDecoder, Qwen3VLMoeDecoder
from ember.convert.qwen25vl import Qwen25VLDecoder
from ember.convert.qwen35 import Qwen3NextDecoder, Qwen35Decoder, Qwen35MoeDecoder
from ember.convert.source import ConvertError, HFConfig, Tensors, read_json

CONVERTERS: dict[str, Callable[[HFConfig], TextDecoder]] = {
    "BertModel": BertEncoder,
    "BertForSequenceClassification": BertCrossEncoder,
    "DeepseekV2ForCausalLM": DeepSeek2Decoder,
    "DeepseekV3ForCausalLM": DeepSeek2Decoder,
    "Glm4MoeLiteForCausalLM": Glm4MoeLiteDecoder,
    "GptOssForCausalLM": GptOssDecoder,
    "GraniteForCausalLM": GraniteDecoder,
    "LagunaForCausalLM": LagunaDecoder,
    "Lfm2ForCausalLM": Lfm2Decoder,
    "Lfm2MoeForCausalLM": Lfm2MoeDecoder,
    "LlamaForCausalLM": LlamaDecoder,
    "Llama4ForCausalLM": Llama4Decoder,
    "Llama4ForConditionalGeneration": Llama4Decoder,
    "MistralForCausalLM": LlamaDecoder,
    "NemotronHForCausalLM": NemotronHDecoder,
    "NomicBertModel": NomicBertEncoder,
    "Olmo2ForCausalLM": Olmo2Decoder,
    "Olmo3ForCausalLM": Olmo3Decoder,
    "Phi3ForCausalLM": Phi3Decoder,
    "Qwen2ForCausalLM": Qwen2Decoder,
    "Qwen3ForCausalLM": Qwen3Decoder,
    "Qwen3MoeForCausalLM": Qwen3MoeDecoder,
    "Qwen3VLForConditionalGeneration": Qwen3VLDecoder,
    "Qwen3VLMoeForConditionalGeneration": Qwen3VLMoeDecoder,
    "Qwen3NextForCausalLM": Qwen3NextDecoder,
    "Qwen3_5ForCausalLM": Qwen35Decoder,
    "Qwen3_5ForConditionalGeneration": Qwen35Decoder,
    "Qwen3_5MoeForCausalLM": Qwen35MoeDecoder,
    "Qwen3_5MoeForConditionalGeneration": Qwen35MoeDecoder,
    "Gemma2ForCausalLM": Gemma2Decoder,
    "Gemma3ForCausalLM": Gemma3Decoder,
    "Gemma3nForCausalLM": Gemma3nDecoder,
    "Gemma3nForConditionalGeneration": Gemma3nDecoder,
    "Gemma4ForCausalLM": Gemma4Decoder,
    "Gemma4ForConditionalGeneration": Gemma4Decoder,
    "Gemma3TextModel": Gemma3EmbeddingDecoder,
    "Gemma3ForConditionalGeneration": Gemma3VisionDecoder,
    "LlavaForConditionalGeneration": llava_decoder,
    "Qwen2_5_VLForConditionalGeneration": Qwen25VLDecoder,
    "MllamaForConditionalGeneration": MllamaDecoder,
    "Mistral3ForConditionalGeneration": Mistral3Decoder,
}
_FILE_TYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 32}  # llama_ftype


@dataclass(frozen=True, slots=True)
class Planned:
    """One tensor of the output: its GGUF name, where its data comes from, its stored type."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    load: Callable[[], torch.Tensor]
    ggml_type: int | None = None  # a block type whose bytes load returns (MXFP4)


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
    decoder.settle_head(tensors)
    files = decoder.directory_metadata(directory)  # first: it may name tensors of other files
    plan = _plan(decoder, tensors)
    meta = _general(decoder, plan, name) | decoder.metadata() | files
    if isinstance(decoder, LlavaDecoder) and mmproj is None:
        raise ConvertError("a llava model converts to a text GGUF plus an mmproj file")
    arch = decoder.arch
    if mmproj is not None:
        arch, meta, clip_meta, vision = _split_projector(decoder, plan, meta)
        file_type = _FILE_TYPES[next(p.dtype for p in vision if len(p.shape) == 2)]
        _write(mmproj, "clip", clip_meta | {"general.file_type": file_type}, vision)
        plan = [p for p in plan if not is_vision_tensor(p.name)]
    _write(out, arch, meta, plan)


def _split_projector(
    decoder: TextDecoder, plan: list[Planned], meta: dict[str, Any]
) -> tuple[str, dict[str, Any], dict[str, Any], list[Planned]]:
    """llama.cpp's pair: (the text file's architecture, its keys, the mmproj's keys, the
    mmproj's tensors)."""
    if isinstance(decoder, Mistral3Decoder):
        text_arch = decoder.split_text_arch
        text_meta = {_rekey(k, decoder.arch, text_arch): v for k, v in meta.items()
                     if decoder.is_text_key(k)}  # fmt: skip
        return text_arch, text_meta, decoder.mmproj_metadata(), _mistral3_mmproj(decoder, plan)
    if isinstance(decoder, Qwen25VLDecoder):
        vision = [
            replace(p, name=decoder.mmproj_name(p.name)) for p in plan if is_vision_tensor(p.name)
        ]
        return decoder.text_arch, decoder.text_only(meta), decoder.mmproj_metadata(), vision
    if isinstance(decoder, LlavaDecoder):
        clip_meta = decoder.mmproj_metadata()
    elif isinstance(decoder, Gemma3VisionDecoder):
        clip_meta = mmproj_metadata(decoder)
    else:
        raise ConvertError("only a vision model has an mmproj file")
    vision = [replace(p, name=mmproj_name(p.name)) for p in plan if is_vision_tensor(p.name)]
    text_meta = {
        k: v for k, v in meta.items() if not k.startswith(("gemma3.vision.", "gemma3.mm."))
    }
    return decoder.arch, text_meta, clip_meta, vision


def _rekey(key: str, arch: str, new_arch: str) -> str:
    return new_arch + key.removeprefix(arch) if key.startswith(f"{arch}.") else key


def _mistral3_mmproj(decoder: Mistral3Decoder, plan: list[Planned]) -> list[Planned]:
    """The tower and projector under llama.cpp's names (Q/K rows permuted as its converter
    does), and the [IMG_BREAK] embedding row it copies from the text model."""
    vision = [
        replace(
            p,
            name=decoder.mmproj_name(p.name),
            load=_then(p.load, decoder.mmproj_transform, p.name),
        )
        for p in plan
        if is_vision_tensor(p.name)
    ]
    source, row = decoder.img_break_source()
    embedding = next(p for p in plan if p.name == source)
    vision.append(Planned("v.token_embd.img_break", (embedding.shape[1],), torch.float32,
                          lambda: embedding.load()[row].float()))  # fmt: skip
    return vision


def _then(
    load: Callable[[], torch.Tensor],
    transform: Callable[[str, torch.Tensor], torch.Tensor],
    name: str,
) -> Callable[[], torch.Tensor]:
    return lambda: transform(name, load())


def _plan(decoder: TextDecoder, tensors: Tensors) -> list[Planned]:
    shapes, required = decoder.shapes()
    plan: dict[str, Planned] = {}
    slices: dict[str, dict[int, str]] = {}  # stacked GGUF name -> index -> HF name
    combined = decoder.combined(list(tensors))
    consumed = {n for c in combined.values() for n in c.sources}
    for name, c in combined.items():
        plan[name] = _plan_combined(tensors, name, c, shapes.get(name, ()))
    for hf_name in (n for n in tensors if n not in consumed):
        stack = decoder.stacked(hf_name)
        if stack is not None:
            slices.setdefault(stack[0], {})[stack[1]] = hf_name
            continue
        for name, part in decoder.split(hf_name).items():
            if name in plan:
                raise ConvertError(f"two tensors map to {name!r}")
            plan[name] = _plan_one(decoder, tensors, hf_name, name, part, shapes.get(name, ()))
    for name, parts in slices.items():
        plan[name] = _plan_stack(decoder, tensors, name, parts, shapes.get(name, ()))
    for name, value in decoder.extra_tensors().items():
        plan[name] = Planned(name, tuple(value.shape), torch.float32, _constant(value))
    missing = sorted(required - set(plan))
    if missing:
        raise ConvertError(
            f"the safetensors files lack {len(missing)} tensors, e.g. {missing[0]!r}"
        )
    return list(plan.values())


def _plan_one(
    decoder: TextDecoder,
    tensors: Tensors,
    hf_name: str,
    name: str,
    part: Callable[[torch.Tensor], torch.Tensor],
    shape: tuple[int, ...],
) -> Planned:
    """The GGUF tensor `part` makes of an HF tensor, its shape checked without reading it."""
    hf_shape = tensors.shape(hf_name)
    got = tuple(part(torch.empty(hf_shape, device="meta")).shape)
    if got != shape:
        what = f"tensor {hf_name!r} has shape {list(hf_shape)}"
        if got != hf_shape:
            what += f" (as {name!r}: {list(got)})"
        raise ConvertError(f"{what}, the config implies {list(shape)}")
    dtype = tensors.dtype(hf_name) if len(shape) > 1 else torch.float32
    return Planned(name, shape, dtype, lambda: decoder.transform(name, part(tensors.load(hf_name))))


def _plan_combined(tensors: Tensors, name: str, c: Combined, shape: tuple[int, ...]) -> Planned:
    if c.shape != shape:
        raise ConvertError(
            f"{name!r} would have shape {list(c.shape)}, the config implies {list(shape)}"
        )
    want = tuple(
        gguf.quants.quant_shape_to_byte_shape(c.shape, gguf.GGMLQuantizationType(c.ggml_type))
    )

    def load() -> torch.Tensor:
        data = c.build([tensors.load(n) for n in c.sources])
        if tuple(data.shape) != want or data.dtype != torch.uint8:
            raise ConvertError(f"{', '.join(c.sources)} do not make the {list(shape)} {name!r}")
        return data

    return Planned(name, shape, torch.uint8, load, c.ggml_type)


def _plan_stack(
    decoder: TextDecoder,
    tensors: Tensors,
    name: str,
    parts: dict[int, str],
    shape: tuple[int, ...],
) -> Planned:
    """One GGUF tensor stacked from HF tensors of equal shape (the experts of an MoE layer)."""
    count = shape[0] if shape else 0
    if sorted(parts) != list(range(count)):
        raise ConvertError(
            f"{name!r} stacks {count} tensors (one per expert); the safetensors files have "
            f"slices {sorted(parts)[:8]} ({len(parts)} in all)"
        )
    names = [parts[i] for i in range(count)]
    for hf_name in names:
        if tensors.shape(hf_name) != shape[1:]:
            raise ConvertError(
                f"tensor {hf_name!r} has shape {list(tensors.shape(hf_name))}, the config "
                f"implies {list(shape[1:])}"
            )
    dtypes = {tensors.dtype(n) for n in names}
    dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32

    def load() -> torch.Tensor:
        return torch.stack([decoder.transform(name, tensors.load(n)).to(dtype) for n in names])

    return Planned(name, shape, dtype, load)


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
        if p.ggml_type is not None:  # blocks: the shape in bytes, as gguf-py takes it
            qtype = gguf.GGMLQuantizationType(p.ggml_type)
            shape = tuple(gguf.quants.quant_shape_to_byte_shape(p.shape, qtype))
            writer.add_tensor_info(p.name, shape, np.dtype(np.uint8), int(np.prod(shape)), qtype)
            continue
        kind = _numpy_dtype(p.dtype)
        nbytes = int(np.prod(p.shape)) * kind.itemsize
        raw = gguf.GGMLQuantizationType.BF16 if p.dtype == torch.bfloat16 else None
        writer.add_tensor_info(p.name, p.shape, kind, nbytes, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for p in plan:
        data = p.load()
        writer.write_tensor_data(data.numpy() if p.ggml_type else _as_numpy(data, p.dtype))
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
