"""EmbeddingGemma: a Gemma3TextModel with bidirectional attention in a sentence-transformers
folder (modules.json, a Pooling module, two bias-free Dense modules such as 2_Dense and 3_Dense),
written as Ollama's engine reads it: architecture `gemma3` with `gemma3.pooling_type`, and the
Dense layers' weights as `dense.0.weight` and `dense.1.weight` (float32)."""

import re
from pathlib import Path
from typing import Any

import torch

from ember.convert.bert import pooling_type, sentence_modules
from ember.convert.gemma3 import Gemma3Decoder
from ember.convert.source import ConvertError, Tensors, read_json

_IDENTITY = (None, "torch.nn.modules.linear.Identity")
_FOLDER = re.compile(r"[\w.-]+")


class Gemma3EmbeddingDecoder(Gemma3Decoder):
    is_embedding = True

    def rename(self, hf_name: str) -> str | None:
        # Gemma3TextModel's checkpoint has no "model." prefix (embed_tokens, layers.N, norm)
        return super().rename(hf_name if hf_name.startswith("model.") else "model." + hf_name)

    def directory_metadata(self, directory: Path) -> dict[str, Any]:
        if not (directory / "modules.json").is_file():
            raise ConvertError("an EmbeddingGemma folder needs sentence-transformers' modules.json")
        self.pooling_type = pooling_type(directory)
        self.dense = _dense_modules(directory, self.hidden)
        return super().directory_metadata(directory)

    def extra_tensors(self) -> dict[str, torch.Tensor]:
        out = {}
        for i, (folder, shape) in enumerate(self.dense):
            tensors = Tensors(folder)
            if "linear.weight" not in list(tensors) or tensors.shape("linear.weight") != shape:
                raise ConvertError(f"{folder.name} must hold a {list(shape)} linear.weight")
            out[f"dense.{i}.weight"] = tensors.load("linear.weight").float()
        return out

    def metadata(self) -> dict[str, Any]:
        return super().metadata() | {
            "gemma3.pooling_type": self.pooling_type,
            "gemma3.attention.causal": False,
        }


def _dense_modules(directory: Path, hidden: int) -> list[tuple[Path, tuple[int, int]]]:
    """(folder, weight shape (out, in)) of the two Dense modules modules.json names, in order,
    each taking the previous one's output (the first, the hidden states)."""
    found: list[tuple[Path, tuple[int, int]]] = []
    for entry in sentence_modules(directory):
        if not isinstance(entry, dict) or not str(entry.get("type", "")).endswith(".Dense"):
            continue
        path = entry.get("path")
        if not isinstance(path, str) or not _FOLDER.fullmatch(path) or path in (".", ".."):
            raise ConvertError("modules.json names a bad Dense path")
        found.append(_dense_shape(directory / path, found[-1][1][0] if found else hidden))
    if len(found) != 2:
        raise ConvertError(f"EmbeddingGemma needs two Dense modules, modules.json has {len(found)}")
    return found


def _dense_shape(folder: Path, width: int) -> tuple[Path, tuple[int, int]]:
    config = read_json(folder / "config.json", required=False)
    if config is None:
        raise ConvertError(f"the Dense module's {folder.name}/config.json is missing")
    if config.get("bias", True) or config.get("activation_function") not in _IDENTITY:
        raise ConvertError(f"{folder.name}: only a Dense layer without bias or activation")
    if not (folder / "model.safetensors").is_file():
        raise ConvertError(f"{folder.name}/model.safetensors is missing (only safetensors convert)")
    features = config.get("in_features"), config.get("out_features")
    if features[0] != width or not isinstance(features[1], int) or features[1] <= 0:
        raise ConvertError(f"{folder.name}: in_features must be {width}, got {features[0]!r}")
    return folder, (features[1], width)
