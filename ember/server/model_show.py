"""What /api/show answers about a stored model: its GGUF metadata as `model_info` (large arrays
as null, as Ollama), its capabilities, and the text fields of the model (template, system,
parameters, Modelfile, license). Reading the store is store/'s job; this only shapes answers."""

import dataclasses
import functools
from pathlib import Path
from typing import Any

import numpy as np

from ember.errors import EmberError
from ember.gguf import GGUFError, GGUFFile
from ember.gguf.packed import PackedArray
from ember.gotime import rfc3339_nano
from ember.pooling import POOLING_RANK
from ember.server.harmony import uses_harmony
from ember.server.prompt import fill_in_middle
from ember.server.thinking import can_think
from ember.server.tools import can_use_tools
from ember.server.vision import runs_vision
from ember.store import (
    ModelEntry,
    Store,
    StoredModel,
    format_parameters,
    get_model,
    render_modelfile,
)
from ember.template import fills_gaps

MAX_ARRAY_ITEMS = 1024  # longer arrays (the vocabulary, merges) show as null unless verbose
_HIDDEN_KEYS = ("general.name", "tokenizer.chat_template")  # as Ollama's show deletes them


@functools.lru_cache(maxsize=16)
def _read_gguf(path: Path, mtime_ns: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(metadata, tensors) of a model blob; cached: blobs are content-addressed, never edited."""
    with GGUFFile.open(path) as gguf:
        tensors = [
            {"name": t.name, "type": t.ggml_type.name, "shape": list(reversed(t.shape))}
            for t in gguf.tensors.values()
        ]
        num_params = sum(int(np.prod(t.shape)) for t in gguf.tensors.values())
        meta = dict(gguf.metadata)
    meta.setdefault("general.parameter_count", num_params)
    return meta, tensors


def gguf_metadata(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The GGUF's metadata and tensor list ({name, type, shape} in ggml's order)."""
    return _read_gguf(path, path.stat().st_mtime_ns)


def model_info(metadata: dict[str, Any], *, verbose: bool) -> dict[str, Any]:
    """`model_info`: every key in the file's order, arrays past 1024 items as null unless
    verbose, float32 values in their shortest form (1e-05, not 9.999999747378752e-06)."""
    info: dict[str, Any] = {}
    for key, value in metadata.items():
        if key in _HIDDEN_KEYS:
            continue
        if isinstance(value, list | PackedArray) and len(value) > MAX_ARRAY_ITEMS and not verbose:
            info[key] = None
        else:
            info[key] = _shortest(value)
    return info


def _shortest(value: Any) -> Any:
    if isinstance(value, float) and float(np.float32(value)) == value:
        return float(str(np.float32(value)))
    if isinstance(value, list | PackedArray):
        return [_shortest(v) for v in value]
    return value


def capabilities(metadata: dict[str, Any], model: StoredModel) -> list[str]:
    """Ollama's capability names the model has: an embedding model (a pooling type) only
    embeds, a cross-encoder (pooling type rank) only reranks; others complete, and tools,
    thinking and vision come from template and files."""
    arch = metadata.get("general.architecture", "")
    if f"{arch}.pooling_type" in metadata:
        return ["rerank" if metadata[f"{arch}.pooling_type"] == POOLING_RANK else "embedding"]
    found = ["completion"]
    # a GGUF imported without TEMPLATE is served with the file's own chat template
    source = model.template or metadata.get("tokenizer.chat_template")
    harmony = uses_harmony(arch, source)  # its channels hold thinking and calls
    if harmony or can_use_tools(source):
        found.append("tools")
    if fills_gaps(source) or fill_in_middle(metadata.get("tokenizer.ggml.tokens") or ()):
        found.append("insert")  # suffix works: a Go template's .Suffix, or the vocabulary's
        # fill-in-the-middle tokens
    if model.projector_paths or runs_vision(metadata):
        found.append("vision")
    if harmony or can_think(source):
        found.append("thinking")  # Ollama's order: completion, tools, insert, vision, thinking
    return found


@functools.lru_cache(maxsize=1024)
def _listed_facts(store: Store, name: str, digest: str) -> tuple[dict[str, int], tuple[str, ...]]:
    # by the manifest's digest: a model re-created under its name is read again
    model = get_model(store, name)
    metadata = gguf_metadata(model.model_path)[0] if model.model_path else {}
    arch = metadata.get("general.architecture", "")
    lengths = {
        key: int(metadata[f"{arch}.{key}"])
        for key in ("context_length", "embedding_length")
        if isinstance(metadata.get(f"{arch}.{key}"), int)
    }
    return lengths, tuple(capabilities(metadata, model))


def listed(store: Store, entry: ModelEntry) -> dict[str, Any]:
    """An /api/tags entry: with Ollama's capabilities and the details' context and embedding
    lengths from its GGUF (without them where the model cannot be read)."""
    out = entry.to_json()
    try:
        lengths, caps = _listed_facts(store, str(entry.name), entry.digest)
    except (EmberError, OSError):
        return out
    out["details"] = out["details"] | lengths
    if caps:
        out["capabilities"] = list(caps)
    return out


def show_response(
    model: StoredModel,
    *,
    verbose: bool = False,
    system: str = "",
    template: str = "",
    options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The /api/show body; `system`/`template` given in the request replace the model's, and
    `options` join its parameters in `modelfile` (not in `parameters`), as Ollama's REPL shows
    its session's Modelfile."""
    metadata: dict[str, Any] = {}
    tensors: list[dict[str, Any]] = []
    if model.model_path is not None:
        try:
            metadata, tensors = gguf_metadata(model.model_path)
        except (GGUFError, OSError):
            metadata, tensors = {}, []  # shown without model_info rather than not at all
    out: dict[str, Any] = {
        "license": "\n".join(model.license),
        "modelfile": render_modelfile(
            dataclasses.replace(
                model,
                system=system or model.system,
                parameters=model.parameters | (options or {}),
            )
        ),
        "parameters": format_parameters(model.parameters),
        "template": template or model.template or metadata.get("tokenizer.chat_template") or "",
        "system": system or model.system or "",
        "details": model.details.to_json(),
        # role and content only, as Ollama's show
        "messages": [{"role": m["role"], "content": m["content"]} for m in model.messages],
        "requires": model.config.get("requires") or "",
        "model_info": model_info(metadata, verbose=verbose),
        "capabilities": capabilities(metadata, model),
        "modified_at": rfc3339_nano(model.modified_at.astimezone()),
    }
    if model.projector_paths:  # as Ollama: the projector file's metadata beside the model's
        try:
            projector, _ = gguf_metadata(model.projector_paths[0])
            out["projector_info"] = model_info(projector, verbose=verbose)
        except (GGUFError, OSError):
            pass
    out["tensors"] = tensors  # verbose or not, as Ollama's GetModelInfo (only its CLI hides them)
    return {k: v for k, v in out.items() if v not in ("", [], None) or k == "model_info"}
