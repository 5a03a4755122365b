"""Architectures registered by their GGUF name; loading a file picks the class from its metadata."""

from collections.abc import Callable

from ember.backend import heap, startup_pages
from ember.gguf import GGUFFile
from ember.model.activations import Activations
from ember.model.base import Model
from ember.model.config import Config, ModelLoadError
from ember.pooling import POOLING_CLS, POOLING_LAST, POOLING_MEAN

Builder = Callable[[GGUFFile, Config], Model]
ProjectorBuilder = Callable[[GGUFFile, Config, GGUFFile], Model]
_ARCHS: dict[str, Builder] = {}
# archs that take a separate mmproj file, by (arch, clip.projector_type or None for any other)
_WITH_PROJECTOR: dict[tuple[str, str | None], ProjectorBuilder] = {}


def register(*names: str) -> Callable[[Builder], Builder]:
    def add(builder: Builder) -> Builder:
        for name in names:
            _ARCHS[name] = builder
        return builder

    return add


def register_projector(
    *names: str, kind: str | None = None
) -> Callable[[ProjectorBuilder], ProjectorBuilder]:
    """Builders of archs `names` with an mmproj file; `kind` narrows them to one projector type
    (a llama text model takes llava's `mlp` projector or Pixtral's)."""

    def add(builder: ProjectorBuilder) -> ProjectorBuilder:
        for name in names:
            _WITH_PROJECTOR[name, kind] = builder
        return builder

    return add


def load_model(gguf: GGUFFile, projector: GGUFFile | None = None) -> Model:
    """The model of a GGUF file; `projector` is a separate mmproj file (llama.cpp's vision
    convention) for the architectures that take one."""
    import ember.model.archs  # noqa: F401  (registers the architectures)

    config = Config(gguf.metadata)
    model = _build(gguf, config, projector)
    pooling = config.metadata.get(f"{config.arch}.pooling_type")
    if pooling in (POOLING_MEAN, POOLING_CLS, POOLING_LAST) and not hasattr(model, "pooling_type"):
        # a decoder's file made an embedding model (Qwen3-Embedding: qwen3, the last token, as
        # Ollama's qwen3_embed and llama.cpp pool it): the runner pools as the file says
        model.pooling_type = pooling  # type: ignore[attr-defined]
    heap.keep_freed_memory()  # after the load's own temporaries: see backend/heap.py
    # what a batch's activations take, at most: the load-time reservation checks it
    model.activations = Activations.of(  # type: ignore[attr-defined]
        gguf, experts_used=config.uint("expert_used_count", 1, maximum=1 << 10)
    )
    startup_pages.let_go()  # torch's code that only its start ran: see backend/startup_pages.py
    return model


def _build(gguf: GGUFFile, config: Config, projector: GGUFFile | None) -> Model:
    if projector is not None:
        kind = projector.metadata.get("clip.projector_type")
        with_projector = _WITH_PROJECTOR.get((config.arch, kind if isinstance(kind, str) else None))
        with_projector = with_projector or _WITH_PROJECTOR.get((config.arch, None))
        if with_projector is None:
            raise ModelLoadError(f"architecture {config.arch!r} takes no projector file")
        return with_projector(gguf, config, projector)
    builder = _ARCHS.get(config.arch)
    if builder is None:
        known = ", ".join(sorted(_ARCHS))
        raise ModelLoadError(f"unsupported model architecture {config.arch!r} (supported: {known})")
    return builder(gguf, config)
