"""A model name as the server serves it: found in the model store, else among the bundled models,
and read once into its GGUF path, chat template, default options, capabilities and details.

Only names resolve here, never file paths: a request cannot make the server open any file."""

import functools
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from ember import catalog
from ember.errors import ModelNotFoundError
from ember.gguf import GGUFError, GGUFFile
from ember.human import human_number
from ember.pooling import POOLING_RANK
from ember.server.errors import APIError, not_found
from ember.server.harmony import uses_harmony
from ember.server.prompt import (
    IMAGE_TOKENS,
    ChatTemplate,
    FillInMiddle,
    Message,
    fill_in_middle,
)
from ember.server.thinking import ThinkingTags, infer_tags
from ember.server.tools import ToolCallFormat, can_use_tools, tool_call_format
from ember.server.vision import runs_vision
from ember.store import Store, StoreError, get_model, list_models
from ember.store.ggufinfo import FILE_TYPES
from ember.template import BUILTIN, fills_gaps

log = logging.getLogger("ember.server")
CONTROL = 3  # GGUF's token type of a control token (ember.tokenizer's TokenType.CONTROL)


@dataclass(frozen=True, slots=True)
class GGUFFacts:
    """What the server needs from a GGUF's metadata (read without loading any weight)."""

    architecture: str
    chat_template: str | None
    bos_text: str  # "" when the tokenizer adds BOS itself (a template must not write it again)
    eos_text: str
    context_length: int  # the trained context; 0 when the file does not say
    file_type: str
    parameter_size: str
    fim: FillInMiddle | None  # the model can fill a gap (Ollama's "insert")
    has_vision: bool = False  # the file holds a vision tower (Ollama's single-file convention)
    is_embedding: bool = False  # an embedding-only model (a pooling type): it cannot complete
    is_rerank: bool = False  # a cross-encoder (pooling type rank): it only reranks
    # the vocabulary's control tokens by text: grammars match tags that are one as the token
    control_tokens: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str  # as /api/ps and /v1/models show it ("smollm2:135m")
    model_path: Path
    template: ChatTemplate
    parameters: dict[str, Any]  # Modelfile PARAMETERs: defaults under the request's options
    capabilities: frozenset[str]  # completion, tools, thinking, insert, vision; or embedding,
    # or rerank
    tool_format: ToolCallFormat
    thinking_tags: ThinkingTags | None
    digest: str
    size: int
    modified_at: datetime
    details: dict[str, Any]
    context_length: int
    owner: str = "library"  # /v1/models' owned_by
    facts: GGUFFacts | None = field(default=None, compare=False)
    projector_paths: tuple[Path, ...] = ()  # mmproj files (llama.cpp's vision convention)
    draft: str = ""  # the Modelfile's DRAFT: a model that drafts for speculative decoding
    harmony: bool = False  # gpt-oss's Harmony format: harmony.py reads its output


class Models:
    """Resolves names (store first, then the bundled catalogue); GGUF reads are cached by file."""

    def __init__(self, store_root: Path) -> None:
        self.store_root = store_root
        self._store: Store | None = None
        self._facts: dict[tuple[str, int], GGUFFacts] = {}
        self._lock = threading.Lock()

    def store(self) -> Store:
        if self._store is None:  # made on first use: creating it makes the folders
            self._store = Store(self.store_root)
        return self._store

    def resolve(self, name: str) -> ServedModel:
        """The model called name; APIError 404 when there is none."""
        try:
            stored = get_model(self.store(), name)
        except ModelNotFoundError:
            stored = None
        except StoreError as err:
            raise APIError(500, str(err)) from None
        except ValueError:  # not a valid store name: it may still be a bundled one
            stored = None
        if stored is not None and stored.model_path is not None:
            return self._from_store(stored)
        return self._from_catalog(name)

    def available(self) -> list[tuple[str, int, str]]:
        """(name, created, owner) of every model a request may name: the store's, newest
        first, then the bundled ones whose packages are installed."""
        out = [
            (e.name.display_shortest(), int(e.modified_at.timestamp()), e.name.namespace)
            for e in list_models(self.store())
        ]
        names = {name for name, _, _ in out}
        for entry in catalog.CATALOG.values():
            created = _installed_at(entry)
            if created is not None and entry.name not in names:
                out.append((entry.name, created, "library"))
        return out

    def _from_store(self, stored: Any) -> ServedModel:
        facts = self.facts(stored.model_path)
        template = stored.template
        messages = tuple(
            Message(
                m["role"],
                m.get("content", ""),
                tool_calls=tuple(m.get("tool_calls", ())),
                thinking=m.get("thinking", ""),
                tool_name=m.get("tool_name", ""),
            )
            for m in stored.messages
        )
        details = stored.details.to_json()
        return _served(
            facts,
            name=stored.name.display_shortest(),
            path=stored.model_path,
            template=template or None,
            system=stored.system or "",
            messages=messages,
            parameters=dict(stored.parameters),
            digest=stored.digest,
            size=stored.size,
            modified_at=stored.modified_at,
            details=details,
            owner=stored.name.namespace,
            projector_paths=tuple(stored.projector_paths),
            draft=str(stored.config.get("draft") or ""),
        )

    def _from_catalog(self, name: str) -> ServedModel:
        entry = catalog.entry_for(name)
        if entry is None:
            raise not_found(name)
        try:
            path = catalog.resolve_model(entry.name)
        except ModelNotFoundError as err:
            raise APIError(404, f"model '{name}' not found: {err}") from None
        facts = self.facts(path)
        details = {
            "parent_model": "",
            "format": "gguf",
            "family": facts.architecture,
            "families": [facts.architecture],
            "parameter_size": facts.parameter_size,
            "quantization_level": facts.file_type,
        }
        return _served(
            facts,
            name=entry.name,
            path=path,
            template=None,
            system="",
            messages=(),
            parameters={},
            digest=entry.sha256,
            size=entry.num_bytes,
            modified_at=datetime.fromtimestamp(path.stat().st_mtime, UTC),
            details=details,
            owner="library",
        )

    def facts(self, path: Path) -> GGUFFacts:
        key = (str(path), path.stat().st_mtime_ns)
        with self._lock:
            cached = self._facts.get(key)
        if cached is None:
            cached = read_facts(path)
            with self._lock:
                self._facts[key] = cached
        return cached


def _installed_at(entry: catalog.Entry) -> int | None:
    """When the bundled model's first package was installed; None if it is not."""
    try:
        dist = metadata.distribution(entry.parts[0].dist)
    except metadata.PackageNotFoundError:
        return None
    path = Path(str(dist.locate_file(entry.parts[0].path)))
    return int(path.stat().st_mtime) if path.is_file() else None


def read_facts(path: Path) -> GGUFFacts:
    try:
        with GGUFFile.open(path) as gguf:
            md = gguf.metadata
            vocab = [str(t) for t in md.get("tokenizer.ggml.tokens") or []]
            arch = str(md.get("general.architecture", ""))
            size_label = md.get("general.size_label")
            num_params = sum(_count(t.shape) for t in gguf.tensors.values())
    except (GGUFError, OSError) as err:
        raise APIError(500, f"cannot read the model file: {err}") from None
    template = md.get("tokenizer.chat_template")
    ftype = md.get("general.file_type")
    return GGUFFacts(
        architecture=arch,
        chat_template=template if isinstance(template, str) else BUILTIN.get(arch),
        bos_text="" if md.get("tokenizer.ggml.add_bos_token") else _token_text(md, vocab, "bos"),
        eos_text=_token_text(md, vocab, "eos"),
        context_length=int(md.get(f"{arch}.context_length", 0) or 0),
        file_type=FILE_TYPES.get(ftype, "unknown") if isinstance(ftype, int) else "unknown",
        parameter_size=human_number(num_params) if num_params else str(size_label or ""),
        fim=fill_in_middle(vocab),
        has_vision=runs_vision(md),
        is_embedding=f"{arch}.pooling_type" in md,
        is_rerank=md.get(f"{arch}.pooling_type") == POOLING_RANK,
        control_tokens=_control_tokens(vocab, md.get("tokenizer.ggml.token_type") or []),
    )


def _control_tokens(vocab: Sequence[str], types: Sequence[Any]) -> dict[str, int]:
    return {t: i for i, (t, k) in enumerate(zip(vocab, types, strict=False)) if k == CONTROL}


def _count(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _token_text(md: dict[str, Any], vocab: list[Any], kind: str) -> str:
    token_id = md.get(f"tokenizer.ggml.{kind}_token_id")
    if isinstance(token_id, int) and 0 <= token_id < len(vocab):
        return str(vocab[token_id])
    return ""


def _served(facts: GGUFFacts, *, template: str | None, system: str, **fields: Any) -> ServedModel:
    source = template or facts.chat_template
    chat = ChatTemplate(
        source,
        bos_token=facts.bos_text,
        eos_token=facts.eos_text,
        system=system,
        messages=fields.pop("messages"),
        fim=facts.fim,
        # as Ollama's chatPrompt: an image counts only where a projector file goes with the
        # model; a tower inside the model's own file (gemma3's, Ollama's own engine) counts 0
        image_tokens=IMAGE_TOKENS if fields.get("projector_paths") else 0,
    )
    tags, has_tools, tool_format = _template_facts(source)
    harmony = uses_harmony(facts.architecture, source)
    if harmony:  # its channels hold the thinking and the calls, not tags
        tags, has_tools = None, True
    capabilities = {"completion"}
    if has_tools:
        capabilities.add("tools")
    if tags is not None or harmony:
        capabilities.add("thinking")
    if chat.fim is not None or fills_gaps(source):
        capabilities.add("insert")
    if facts.has_vision or fields.get("projector_paths"):
        capabilities.add("vision")
    if facts.is_embedding:  # as Ollama: an embedding model (a pooling type) only embeds
        capabilities = {"rerank" if facts.is_rerank else "embedding"}
    return ServedModel(
        model_path=fields.pop("path"),
        template=chat,
        capabilities=frozenset(capabilities),
        tool_format=tool_format,
        thinking_tags=tags,
        harmony=harmony,
        context_length=facts.context_length,
        facts=facts,
        **fields,
    )


@functools.lru_cache(maxsize=64)
def _template_facts(source: str | None) -> tuple[ThinkingTags | None, bool, ToolCallFormat]:
    # each renders the template a few times: once per template, not once per request
    return infer_tags(source), can_use_tools(source), tool_call_format(source)
