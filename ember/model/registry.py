"""Architectures registered by their GGUF name; loading a file picks the class from its metadata."""

from collections.abc import Callable

from ember.gguf import GGUFFile
from ember.model.base import Model
from ember.model.config import Config, ModelLoadError

Builder = Callable[[GGUFFile, Config], Model]
_ARCHS: dict[str, Builder] = {}


def register(*names: str) -> Callable[[Builder], Builder]:
    def add(builder: Builder) -> Builder:
        for name in names:
            _ARCHS[name] = builder
        return builder

    return add


def load_model(gguf: GGUFFile) -> Model:
    import ember.model.archs  # noqa: F401  (registers the architectures)

    config = Config(gguf.metadata)
    builder = _ARCHS.get(config.arch)
    if builder is None:
        known = ", ".join(sorted(_ARCHS))
        raise ModelLoadError(f"unsupported model architecture {config.arch!r} (supported: {known})")
    return builder(gguf, config)
