"""Models in the store as the API shows them: the list (/api/tags) and one model resolved to its
GGUF path, template, system prompt, parameters, license and messages (/api/show, loading).

Blob contents come from registries, so every read is bounded and every JSON value is checked.
"""

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ember.errors import ModelNotFoundError
from ember.gotime import rfc3339_nano
from ember.store import manifest as mt
from ember.store.errors import ManifestError, StoreError
from ember.store.names import ModelName
from ember.store.store import Store

MAX_TEXT_BLOB = 16 << 20  # config, template, system, license, params, messages


@dataclass(frozen=True, slots=True)
class ModelDetails:
    """The `details` object of /api/tags and /api/show, from the config blob."""

    parent_model: str = ""
    format: str = ""
    family: str = ""
    families: tuple[str, ...] | None = None
    parameter_size: str = ""
    quantization_level: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "parent_model": self.parent_model,
            "format": self.format,
            "family": self.family,
            "families": list(self.families) if self.families is not None else None,
            "parameter_size": self.parameter_size,
            "quantization_level": self.quantization_level,
        }


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One model of the list: /api/tags' item."""

    name: ModelName
    size: int  # bytes of all its blobs
    digest: str  # sha256 hex of the manifest
    modified_at: datetime  # the manifest file's mtime, UTC
    details: ModelDetails

    def to_json(self) -> dict[str, Any]:
        short = self.name.display_shortest()
        return {
            "name": short,
            "model": short,
            "modified_at": rfc3339_nano(self.modified_at.astimezone()),
            "size": self.size,
            "digest": self.digest,
            "details": self.details.to_json(),
        }


@dataclass(frozen=True, slots=True)
class StoredModel:
    """A model resolved to files and values: what loading and /api/show need."""

    name: ModelName
    digest: str
    modified_at: datetime
    size: int
    manifest: mt.Manifest
    config: dict[str, Any]  # Ollama's ConfigV2 as stored (model_format, model_family, ...)
    details: ModelDetails
    model_path: Path | None  # the GGUF; None for a model without one (a remote model)
    projector_paths: tuple[Path, ...] = ()
    adapter_paths: tuple[Path, ...] = ()
    template: str | None = None
    system: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)  # Modelfile PARAMETERs, typed
    license: tuple[str, ...] = ()
    messages: tuple[dict[str, Any], ...] = ()


def list_models(store: Store) -> list[ModelEntry]:
    """Every readable model, newest first (as `ollama list`); unreadable manifests are skipped."""
    entries = []
    for name in store.names():
        try:
            stored = store.read_manifest(name)
        except (ModelNotFoundError, StoreError, OSError):  # removed meanwhile, or unreadable
            continue
        config = read_config(store, stored.manifest)
        details = details_of(config, stored.manifest)
        entries.append(
            ModelEntry(name, stored.manifest.size, stored.digest, stored.modified_at, details)
        )
    entries.sort(key=lambda e: (-e.modified_at.timestamp(), str(e.name)))
    return entries


def get_model(store: Store, name: ModelName | str) -> StoredModel:
    """Resolves `name`; raises ModelNotFoundError, or StoreError for a broken model."""
    stored = store.read_manifest(name)
    config = read_config(store, stored.manifest)
    values = _layer_values(store, stored.manifest)
    return StoredModel(
        name=stored.name,
        digest=stored.digest,
        modified_at=stored.modified_at,
        size=stored.manifest.size,
        manifest=stored.manifest,
        config=config,
        details=details_of(config, stored.manifest),
        **values,
    )


def read_config(store: Store, manifest: mt.Manifest) -> dict[str, Any]:
    """The config blob as a JSON object; {} when it is missing or not an object."""
    try:
        value = json.loads(store.read_blob(manifest.config.digest, max_bytes=MAX_TEXT_BLOB))
    except (StoreError, ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def details_of(config: dict[str, Any], manifest: mt.Manifest) -> ModelDetails:
    families = config.get("model_families")
    model_layer = manifest.first(mt.MEDIA_MODEL)
    return ModelDetails(
        parent_model=model_layer.source if model_layer else "",
        format=_str(config, "model_format"),
        family=_str(config, "model_family"),
        families=tuple(f for f in families if isinstance(f, str))
        if isinstance(families, list)
        else None,
        parameter_size=_str(config, "model_type"),
        quantization_level=_str(config, "file_type"),
    )


def _str(config: dict[str, Any], key: str) -> str:
    value = config.get(key)
    return value if isinstance(value, str) else ""


def _layer_values(store: Store, manifest: mt.Manifest) -> dict[str, Any]:
    """The StoredModel fields that come from layers, in manifest order (last one wins)."""
    out: dict[str, Any] = {"model_path": None}
    projectors, adapters, licenses = [], [], []
    for layer in manifest.layers:
        kind = layer.media_type
        if kind == mt.MEDIA_MODEL:
            out["model_path"] = _present(store, layer)
        elif kind == mt.MEDIA_PROJECTOR:
            projectors.append(store.blob_path(layer.digest))
        elif kind == mt.MEDIA_ADAPTER:
            adapters.append(store.blob_path(layer.digest))
        elif kind in (mt.MEDIA_TEMPLATE, mt.MEDIA_PROMPT):
            out["template"] = _text(store, layer)
        elif kind == mt.MEDIA_SYSTEM:
            out["system"] = _text(store, layer)
        elif kind == mt.MEDIA_LICENSE:
            licenses.append(_text(store, layer))
        elif kind == mt.MEDIA_PARAMS:
            out["parameters"] = _params(store, layer)
        elif kind == mt.MEDIA_MESSAGES:
            out["messages"] = _messages(store, layer)
    out.update(projector_paths=tuple(projectors), adapter_paths=tuple(adapters))
    out["license"] = tuple(licenses)
    return out


def _present(store: Store, layer: mt.Layer) -> Path:
    path = store.blob_path(layer.digest)
    if not path.is_file():
        raise StoreError(f"the model's blob {layer.digest} is missing: pull or create it again")
    return path


def _text(store: Store, layer: mt.Layer) -> str:
    return store.read_blob(layer.digest, max_bytes=MAX_TEXT_BLOB).decode("utf-8", "replace")


def _json(store: Store, layer: mt.Layer) -> Any:
    try:
        return json.loads(store.read_blob(layer.digest, max_bytes=MAX_TEXT_BLOB))
    except (ValueError, RecursionError) as e:
        raise ManifestError(f"layer {layer.digest} ({layer.media_type}) is not JSON: {e}") from None


def _params(store: Store, layer: mt.Layer) -> dict[str, Any]:
    value = _json(store, layer)
    if not isinstance(value, dict):
        raise ManifestError(f"params layer {layer.digest} is not a JSON object")
    return value


# what a stored message keeps beside its role, as Ollama's api.Message (images aside)
MESSAGE_TEXTS = ("content", "thinking", "tool_name", "tool_call_id")


def stored_message(m: Any) -> dict[str, Any] | None:
    """A message as a messages layer holds it, or None when m is not one. Any role, as create
    stores them (Ollama's too): the template decides what each means."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not m["role"]:
        return None
    out: dict[str, Any] = {"role": m["role"], "content": ""}
    for key in MESSAGE_TEXTS:
        if m.get(key) is not None:
            if not isinstance(m[key], str):
                return None
            out[key] = m[key]
    calls = m.get("tool_calls")
    if calls:
        if not isinstance(calls, list) or not all(
            isinstance(c, dict) and isinstance(c.get("function"), dict) for c in calls
        ):
            return None
        out["tool_calls"] = calls
    return out


def _messages(store: Store, layer: mt.Layer) -> tuple[dict[str, Any], ...]:
    value = _json(store, layer)
    messages = [stored_message(m) for m in value] if isinstance(value, list) else [None]
    if any(m is None for m in messages):
        raise ManifestError(f"messages layer {layer.digest} is not a list of messages")
    return tuple(m for m in messages if m is not None)
