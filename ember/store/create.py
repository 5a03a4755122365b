"""Creating a model in the store (/api/create): from GGUF blobs already uploaded, or from a stored
model, plus template, system, parameters, messages and license. Yields Ollama's progress dicts.

The manifest is written last, after every blob: a create that fails leaves the old model (if
any) as it was. Pulling a missing FROM model is the caller's job (see registry.py).
"""

import hashlib
import json
import re
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ember.errors import ModelNotFoundError, OptionsError
from ember.gotemplate import GoTemplate, GoTemplateError, is_go_template
from ember.human import human_number
from ember.options import Options
from ember.store import manifest as mt
from ember.store.convert_files import convert_files, is_hf_directory
from ember.store.errors import CreateError, ModelfileError, StoreError
from ember.store.ggufinfo import GGUFInfo, read_gguf_info
from ember.store.manifest import Layer, Manifest, go_json
from ember.store.modelfile import (
    DEPRECATED_PARAMETERS,
    Command,
    collect_parameters,
    parameter_types,
    typed_parameter,
)
from ember.store.models import MAX_TEXT_BLOB, read_config, stored_message
from ember.store.names import Digest, ModelName
from ember.store.quantize import quantize
from ember.store.quantmix import FILE_TYPES
from ember.store.store import Store, as_name
from ember.template import TemplateError, check_jinja

Progress = dict[str, Any]
QUANTIZE_TYPES = tuple(FILE_TYPES)
_SEMVER = re.compile(r"v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?")
_INHERITED = ("renderer", "parser", "requires", "draft", "model_format", "capabilities")


@dataclass(frozen=True, slots=True)
class CreateRequest:
    """The fields of Ollama's /api/create request that Ember carries out."""

    from_: str | None = None  # a stored model's name
    files: Mapping[str, str] | None = None  # relative file name -> digest of a blob in the store
    adapters: Mapping[str, str] | None = None  # refused: LoRA adapters are not supported
    template: str | None = None
    system: str | None = None
    parameters: Mapping[str, Any] | None = None
    messages: Sequence[Mapping[str, Any]] | None = None
    license: str | Sequence[str] | None = None
    quantize: str | None = None
    renderer: str | None = None
    parser: str | None = None
    requires: str | None = None
    draft: str | None = None  # a model's name: it drafts tokens for speculative decoding

    @classmethod
    def from_modelfile(
        cls,
        commands: Sequence[Command],
        *,
        files: Mapping[str, str] | None = None,
        quantize: str | None = None,
    ) -> "CreateRequest":
        """A request from parsed Modelfile commands. A FROM that names a local file must be
        uploaded by the caller and passed as `files` (name -> digest); it then replaces FROM."""
        values: dict[str, Any] = {"files": files, "quantize": quantize}
        licenses, messages = [], []
        for c in commands:
            if c.name == "adapter":
                raise ModelfileError("ADAPTER is not supported")
            if c.name == "model":
                values["from_"] = None if files else c.args
            elif c.name in ("template", "system", "renderer", "parser", "requires", "draft"):
                values[c.name] = c.args
            elif c.name == "license":
                licenses.append(c.args)
            elif c.name == "message":
                role, _, text = c.args.partition(": ")
                messages.append({"role": role, "content": text})
        params = collect_parameters(commands)
        return cls(
            **values,
            parameters=params or None,
            messages=messages or None,
            license=licenses or None,
        )


def create_model(store: Store, name: ModelName | str, request: CreateRequest) -> Iterator[Progress]:
    """Creates (or replaces) `name`; yields {"status": ...} dicts ending with "success".

    Raises CreateError, ModelfileError or InvalidDigestError for a bad request,
    ModelNotFoundError for a missing FROM model.
    """
    target = store.existing_name(as_name(name))
    _check_request(request)
    inherited: dict[str, Any] = {}
    created: set[Digest] = set()
    if request.from_:
        layers, inherited = _layers_from_model(store, request.from_)
        info = _model_info(store, layers)
    elif request.files and is_hf_directory(request.files):
        yield {"status": "converting model"}
        layers, info = convert_files(store, request.files)
        created = {layer.digest for layer in layers}
    elif request.files:
        yield {"status": "parsing GGUF"}
        layers, info = _layers_from_files(store, request.files)
    else:
        raise CreateError("neither 'from' or 'files' was specified")
    wanted = _check_quantize(request.quantize, info) if request.quantize else None
    if wanted is not None and wanted != info.file_type:  # already that type: kept, as Ollama
        layers, info = yield from _quantize(store, layers, info, wanted, created)
    config = _config(request, info, inherited=inherited)
    layers, statuses = _add_value_layers(store, layers, request, created)
    config_info = store.write_blob(go_json(config))
    config_layer = Layer(mt.CONFIG_MEDIA_TYPE, config_info.digest, config_info.size)
    yield from ({"status": s} for s in statuses)
    yield {"status": "writing manifest"}
    old = _old_manifest(store, target)
    store.write_manifest(target, Manifest(config_layer, tuple(layers)))
    if old is not None:
        store.remove_unused_blobs(old.digests())
    yield {"status": "success"}


# ---------------------------------------------------------------- checks


def _check_request(request: CreateRequest) -> None:
    """Everything about a request that can be checked before any work is done."""
    if request.adapters:
        raise CreateError("adapters are not supported")
    for file_name, digest in (request.files or {}).items():
        if not _is_relative_path(file_name):
            raise CreateError(f"file path must be relative: {file_name!r}")
        Digest.parse(digest)
    if request.draft:
        ModelName.parse(request.draft)  # a name in the store or the catalogue, not a file
    if request.requires and not _SEMVER.fullmatch(request.requires):
        raise CreateError("requires must be a valid semver (e.g. 0.14.0)")
    normalize_parameters(request.parameters or {})
    _messages(request.messages or [])
    _licenses(request.license)
    if request.template:  # as Ollama's create parses a TEMPLATE: a bad one is refused
        try:
            if is_go_template(request.template):
                GoTemplate(request.template)
            else:
                check_jinja(request.template)
        except (GoTemplateError, TemplateError) as e:
            raise CreateError(f"template error: {e}") from None


def _is_relative_path(text: str) -> bool:
    # Go's fs.ValidPath: unrooted, slash-separated, no empty, "." or ".." elements
    parts = text.split("/")
    return bool(text) and "\\" not in text and all(p not in ("", ".", "..") for p in parts)


def _check_quantize(requested: str, info: GGUFInfo) -> str:
    """The file type to quantize to ("q4_K" means Q4_K_M, as in Ollama)."""
    wanted = requested.upper()
    wanted = "Q4_K_M" if wanted == "Q4_K" else wanted
    if wanted not in QUANTIZE_TYPES:
        raise CreateError(
            f"unsupported quantization type {requested} - supported types are "
            f"{', '.join(QUANTIZE_TYPES)}"
        )
    if info.file_type not in ("F32", "F16", "BF16"):
        raise CreateError("quantization is only supported for F16, BF16 and F32 models")
    return wanted


def _quantize(
    store: Store, layers: list[Layer], info: GGUFInfo, wanted: str, created: set[Digest]
) -> Generator[Progress, None, tuple[list[Layer], GGUFInfo]]:
    """Replaces the model layer by its quantized version; yields Ollama's progress."""
    model = next(x for x in layers if x.media_type == mt.MEDIA_MODEL)
    status = f"quantizing {info.file_type} model to {wanted}"
    progress = {"status": status, "digest": "0" * 19, "total": model.size}  # as Ollama's
    with store.blob_writer() as writer:
        for done, total in quantize(store.blob_path(model.digest), writer, wanted):
            yield progress | {"completed": model.size * done // max(total, 1)}
        yield {"status": "verifying conversion"}
        blob = writer.commit()
    created.add(blob.digest)
    new_info = read_gguf_info(store.blob_path(blob.digest), f"the {wanted} model")
    new_layer = Layer(mt.MEDIA_MODEL, blob.digest, blob.size, model.source)
    return [new_layer if x is model else x for x in layers], new_info


# ---------------------------------------------------------------- base layers


def _layers_from_files(store: Store, files: Mapping[str, str]) -> tuple[list[Layer], GGUFInfo]:
    layers, model_info = [], None
    for file_name in sorted(files):
        digest = Digest.parse(files[file_name])
        path = store.blob_path(digest)
        if not path.is_file():
            raise CreateError(f"blob {digest} for {file_name!r} is not in the store: upload it")
        info = read_gguf_info(path, file_name)
        if info.media_type == mt.MEDIA_MODEL:
            if model_info is not None:
                raise CreateError("only one GGUF model file is supported (split files are not)")
            model_info = info
        layers.append(Layer(info.media_type, digest, path.stat().st_size, file_name))
    if model_info is None:
        raise CreateError("no GGUF model file among the files (only projectors)")
    return layers, model_info


def _layers_from_model(store: Store, source: str) -> tuple[list[Layer], dict[str, Any]]:
    """The layers of a stored model (each marked as coming from it) and its config's fields that
    a derived model keeps."""
    stored = store.read_manifest(ModelName.parse(source))
    short = stored.name.display_shortest()
    layers = [Layer(x.media_type, x.digest, x.size, short) for x in stored.manifest.layers]
    base = read_config(store, stored.manifest)
    return layers, {k: base[k] for k in _INHERITED if base.get(k)}


def _model_info(store: Store, layers: Sequence[Layer]) -> GGUFInfo:
    model = next((x for x in layers if x.media_type == mt.MEDIA_MODEL), None)
    if model is None:
        raise CreateError("the FROM model has no GGUF model layer")
    return read_gguf_info(store.blob_path(model.digest), model.source or str(model.digest))


def _config(request: CreateRequest, info: GGUFInfo, *, inherited: dict[str, Any]) -> dict[str, Any]:
    """Ollama's ConfigV2, fields in its order (the blob hashes as Ollama's would)."""
    config: dict[str, Any] = {
        "model_format": inherited.get("model_format") or "gguf",
        "model_family": info.architecture,
        "model_families": [info.architecture],
        "model_type": human_number(info.num_params),
        "file_type": info.file_type,
    }
    for key in ("renderer", "parser", "requires", "draft"):
        value = getattr(request, key) or inherited.get(key)
        if value:
            config[key] = value.removeprefix("v") if key == "requires" else value
    if inherited.get("capabilities"):
        config["capabilities"] = inherited["capabilities"]
    config.update(architecture="amd64", os="linux")
    return config


def _old_manifest(store: Store, name: ModelName) -> Manifest | None:
    try:
        return store.read_manifest(name).manifest
    except (ModelNotFoundError, StoreError, OSError):  # none, or unreadable: nothing to clean
        return None


# ---------------------------------------------------------------- value layers


def _add_value_layers(
    store: Store, layers: list[Layer], request: CreateRequest, created: set[Digest]
) -> tuple[list[Layer], list[str]]:
    """Adds template/system/license/params/messages layers; returns them and the status lines
    (Ollama's "using existing layer" / "creating new layer")."""
    out = list(layers)
    statuses = [
        f"{'creating new' if x.digest in created else 'using existing'} layer {x.digest}"
        for x in layers
    ]

    def put(media_type: str, data: bytes, *, replace: bool) -> None:
        if len(data) > MAX_TEXT_BLOB:  # the most a stored model's reader takes
            kind = media_type.rsplit(".", 1)[-1]
            raise CreateError(f"the {kind} is larger than {MAX_TEXT_BLOB >> 20} MiB")
        if replace:
            out[:] = [x for x in out if x.media_type != media_type]
        existed = store.has_blob(Digest(hashlib.sha256(data).hexdigest()))
        info = store.write_blob(data)
        out.append(Layer(media_type, info.digest, info.size))
        verb = "using existing" if existed else "creating new"
        statuses.append(f"{verb} layer {info.digest}")

    if request.template:
        put(mt.MEDIA_TEMPLATE, request.template.encode(), replace=True)
    if request.system:
        put(mt.MEDIA_SYSTEM, request.system.encode(), replace=True)
    for text in _licenses(request.license):
        put(mt.MEDIA_LICENSE, text.encode(), replace=False)
    params = _merged_params(store, out, request.parameters)
    if params:
        put(mt.MEDIA_PARAMS, go_json(params), replace=True)
    if request.messages:
        put(mt.MEDIA_MESSAGES, go_json(_messages(request.messages)), replace=True)
    return out, statuses


def _licenses(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    items = [value] if isinstance(value, str) else list(value)
    if not all(isinstance(x, str) for x in items):
        raise CreateError("license must be a string or a list of strings")
    return [x for x in items if x]


def _merged_params(
    store: Store, layers: Sequence[Layer], given: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The base model's parameters overridden by `given` (typed and validated)."""
    merged: dict[str, Any] = {}
    base = next((x for x in layers if x.media_type == mt.MEDIA_PARAMS), None)
    if base is not None:
        value = json.loads(store.read_blob(base.digest, max_bytes=MAX_TEXT_BLOB))
        merged.update(value if isinstance(value, dict) else {})
    merged.update(normalize_parameters(given or {}))
    return dict(sorted(merged.items()))  # Go encodes a map with its keys sorted


def normalize_parameters(params: Mapping[str, Any]) -> dict[str, Any]:
    """Parameters of an API request typed as Ollama's options and checked as Ember's Options
    checks them (unknown names, impossible values). Deprecated names are dropped."""
    types = parameter_types()
    out: dict[str, Any] = {}
    for name, value in params.items():
        if name in DEPRECATED_PARAMETERS:
            continue
        if name not in types:
            raise CreateError(f"unknown parameter '{name}'")
        out[name] = _typed(name, value, types[name])
    try:
        Options.parse({k: v for k, v in out.items() if k not in ("use_mmap",)})
    except OptionsError as e:
        raise CreateError(str(e)) from None
    return out


def _typed(name: str, value: Any, kind: Any) -> Any:
    if name == "stop":
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
            raise CreateError("parameter 'stop' must be a string or a list of strings")
        return items
    if isinstance(value, str):
        try:
            return typed_parameter(name, value)
        except ModelfileError as e:
            raise CreateError(str(e)) from None
    if kind is bool and isinstance(value, bool):
        return value
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int and is_number and float(value).is_integer():
        return int(value)
    if kind is float and is_number:
        return float(value)
    raise CreateError(f"parameter '{name}' has the wrong type: {value!r}")


def _messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The messages as stored: role, content, and thinking, tool calls and tool name where
    given (as Ollama's, so a model's example of a tool call keeps its call)."""
    out = [stored_message(m) for m in messages]
    if any(m is None for m in out):
        raise CreateError(
            "each message needs a role, string content, thinking and tool_name, "
            "and tool_calls as a list of calls"
        )
    return [m for m in out if m is not None]
