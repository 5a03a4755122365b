"""Typed, validated access to a GGUF's hyperparameters, read once when a model is built."""

import builtins
from typing import Any

from ember.errors import EmberError


class ModelLoadError(EmberError):
    """A model file that cannot run: unknown architecture, missing or mis-shaped tensor, bad key."""


class Config:
    """Metadata of one GGUF, with keys relative to its architecture (`llama.block_count`...)."""

    def __init__(self, metadata: dict[str, Any], arch: str | None = None) -> None:
        self.metadata = metadata
        self.arch = arch or self.string("general.architecture", absolute=True)

    def _lookup(self, key: str, absolute: bool) -> Any:
        return self.metadata.get(key if absolute else f"{self.arch}.{key}")

    def uint(
        self,
        key: str,
        default: int | None = None,
        *,
        absolute: bool = False,
        maximum: int = 1 << 24,
    ) -> int:
        value = self._lookup(key, absolute)
        if value is None:
            return self._default(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= maximum:
            raise ModelLoadError(
                f"model key {key!r} must be an integer in 1..{maximum}, got {value!r}"
            )
        return value

    def count(self, key: str, *, maximum: int = 1 << 24) -> int:
        """A count the file may leave out or give as 0 (Ollama's converters write some such
        keys even then): 0 for those, else as uint checks it."""
        return self.uint(key, maximum=maximum) if self._lookup(key, False) else 0

    def float(self, key: str, default: float | None = None, *, absolute: bool = False) -> float:
        value = self._lookup(key, absolute)
        if value is None:
            return self._default(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
            raise ModelLoadError(f"model key {key!r} must be a number, got {value!r}")
        return float(value)

    def string(self, key: str, default: str | None = None, *, absolute: bool = False) -> str:
        value = self._lookup(key, absolute)
        if value is None:
            return self._default(key, default)
        if not isinstance(value, str):
            raise ModelLoadError(f"model key {key!r} must be a string, got {type(value).__name__}")
        return value

    def _default(self, key: str, default: Any) -> Any:
        if default is None:
            raise ModelLoadError(f"the model file lacks the key {key!r}")
        return default

    def bool(self, key: str, default: bool, *, absolute: bool = False) -> bool:
        value = self._lookup(key, absolute)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise ModelLoadError(f"model key {key!r} must be true or false, got {value!r}")
        return value

    def bools(self, key: str, count: int) -> tuple[builtins.bool, ...] | None:
        """An array of `count` booleans (a per-layer pattern); None where the file lacks it."""
        value = self._lookup(key, False)
        if value is None:
            return None
        if not isinstance(value, list) or len(value) != count:
            raise ModelLoadError(f"model key {key!r} must be an array of {count} booleans")
        if not all(isinstance(v, bool) for v in value):
            raise ModelLoadError(f"model key {key!r} must hold true or false only")
        return tuple(value)

    def per_layer(self, key: str, count: int) -> tuple[int, ...]:
        """A count for each of `count` layers: an array (0 allowed: LFM2's head_count_kv is 0 on
        its convolution layers), or one integer for all."""
        value = self._lookup(key, False)
        if not isinstance(value, list):
            return (self.uint(key),) * count
        ok = all(isinstance(v, int) and not isinstance(v, builtins.bool) for v in value)
        if len(value) != count or not ok or not all(0 <= v <= 1 << 16 for v in value):
            raise ModelLoadError(f"model key {key!r} must be {count} integers, one a layer")
        return tuple(value)
