"""An HF model directory read as untrusted input: bounded JSON files, typed config access, and
safetensors tensors found by name (headers checked by the safetensors library)."""

import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from ember.errors import EmberError
from ember.weightfiles import model_safetensors

MAX_JSON_BYTES = 64 << 20  # tokenizer.json of a 256k vocabulary is ~35 MB
MAX_TENSORS = 1 << 16
DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


class ConvertError(EmberError, ValueError):
    """An HF directory that cannot be converted: missing or malformed files, an unsupported
    architecture, tensors that do not fit the config."""


def read_json(path: Path, *, required: bool = True) -> dict[str, Any] | None:
    """A JSON object from `path`; None when it is absent and not required."""
    if not path.is_file():
        if required:
            raise ConvertError(f"the model directory has no {path.name}")
        return None
    if path.stat().st_size > MAX_JSON_BYTES:
        raise ConvertError(f"{path.name} is larger than {MAX_JSON_BYTES >> 20} MB")
    try:
        value = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as e:
        raise ConvertError(f"{path.name} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ConvertError(f"{path.name} is not a JSON object")
    return value


class HFConfig:
    """config.json (or one of its sub-configs) with typed, checked lookups."""

    def __init__(self, values: Mapping[str, Any], label: str = "config.json") -> None:
        self.values = values
        self.label = label

    def get(self, key: str, default: Any = None) -> Any:
        value = self.values.get(key)
        return default if value is None else value

    def int(self, key: str, default: int | None = None, *, maximum: int = 1 << 24) -> int:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= maximum:
            what = "missing" if value is None else f"{value!r}"
            raise ConvertError(f"{self.label}: {key} must be an integer in 1..{maximum}: {what}")
        return value

    def float(self, key: str, default: float | None = None) -> float:
        value = self.get(key, default)
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not math.isfinite(value):
            raise ConvertError(f"{self.label}: {key} must be a number, got {value!r}")
        return float(value)

    def bool(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise ConvertError(f"{self.label}: {key} must be true or false, got {value!r}")
        return value

    def sub(self, key: str) -> "HFConfig":
        """A nested config (text_config, vision_config); an absent one reads as empty."""
        value = self.get(key, {})
        if not isinstance(value, dict):
            raise ConvertError(f"{self.label}: {key} must be an object")
        return HFConfig(value, f"{self.label} {key}")

    def rope(self, layer_type: str | None = None) -> dict[str, Any]:
        """RoPE settings: transformers 5's rope_parameters (per layer type for gemma3), or the
        older rope_theta + rope_scaling."""
        params = self.get("rope_parameters")
        if isinstance(params, dict) and layer_type is not None and layer_type in params:
            params = params[layer_type]
        if isinstance(params, dict):
            return params
        scaling = self.get("rope_scaling", {})
        if not isinstance(scaling, dict):
            raise ConvertError(f"{self.label}: rope_scaling must be an object")
        theta_key = "rope_local_base_freq" if layer_type == "sliding_attention" else "rope_theta"
        out = dict(scaling) if layer_type != "sliding_attention" else {}
        if self.get(theta_key) is not None:
            out["rope_theta"] = self.get(theta_key)
        return out


class Tensors:
    """The tensors of every *.safetensors file of a directory, by name."""

    def __init__(self, directory: Path) -> None:
        files = model_safetensors(directory.glob("*.safetensors"))
        if not files:
            raise ConvertError("the model directory has no .safetensors files")
        self._handles: list[Any] = []
        self._where: dict[str, Any] = {}
        for path in files:
            try:
                handle = safe_open(str(path), framework="pt")
            except (SafetensorError, OSError, ValueError) as e:
                raise ConvertError(f"{path.name} is not a valid safetensors file: {e}") from None
            self._handles.append(handle)
            for name in handle.keys():  # noqa: SIM118 - a safe_open handle is not a dict
                if name in self._where:
                    raise ConvertError(f"tensor {name!r} appears in two safetensors files")
                self._where[name] = handle
            if len(self._where) > MAX_TENSORS:
                raise ConvertError(f"more than {MAX_TENSORS} tensors")

    def names(self) -> list[str]:
        return list(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._where[name].get_slice(name).get_shape())

    def dtype(self, name: str) -> torch.dtype:
        kind = self._where[name].get_slice(name).get_dtype()
        if kind not in DTYPES:
            raise ConvertError(f"tensor {name!r} has type {kind}: only F32, F16 and BF16 convert")
        return DTYPES[kind]

    def load(self, name: str) -> torch.Tensor:
        try:
            return self._where[name].get_tensor(name)
        except (SafetensorError, OSError, ValueError) as e:
            raise ConvertError(f"tensor {name!r} cannot be read: {e}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)
