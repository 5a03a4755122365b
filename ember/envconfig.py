"""Typed EMBER_* settings: the only place in Ember that reads os.environ.

Every function reads the environment when called, so a test or a child process sees changes.
"""

import os
from pathlib import Path

from ember.errors import OptionsError

_FALSE_WORDS = frozenset({"0", "false", "no", "off"})


def _get(name: str) -> str:
    return os.environ.get(name, "").strip()


def _path(name: str, default: str) -> Path:
    return Path(_get(name) or default).expanduser()


def _int(name: str, default: int, *, minimum: int) -> int:
    text = _get(name)
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        raise OptionsError(f"{name} must be an integer, got {text!r}") from None
    if value < minimum:
        raise OptionsError(f"{name} must be at least {minimum}, got {value}")
    return value


def _bool(name: str) -> bool:
    # As Ollama's envconfig.Bool: unset or a "false" word is off, any other value is on.
    text = _get(name).lower()
    return bool(text) and text not in _FALSE_WORDS


def models_dir() -> Path:
    """Where pulled and created models live (EMBER_MODELS, default ~/.ember/models)."""
    return _path("EMBER_MODELS", "~/.ember/models")


def cache_dir() -> Path:
    """Where assembled model files and checksum records live (EMBER_CACHE, ~/.ember/cache)."""
    return _path("EMBER_CACHE", "~/.ember/cache")


def num_threads() -> int:
    """CPU threads for compute (EMBER_NUM_THREADS); 0 means let the backend choose."""
    return _int("EMBER_NUM_THREADS", 0, minimum=0)


def debug() -> bool:
    """Verbose logging (EMBER_DEBUG)."""
    return _bool("EMBER_DEBUG")
