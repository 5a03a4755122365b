"""The model store on disk, laid out as Ollama's: `manifests/<host>/<ns>/<model>/<tag>` and
`blobs/sha256-<hex>`, plus `tmp/` for writes in progress.

Everything is written to `tmp/` first and renamed into place, and a manifest is written only
after every blob it names is present, so an interrupted write never leaves a broken model.
Models are listed and resolved in models.py; this module knows paths, blobs and manifests.
"""

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from ember.errors import ModelNotFoundError
from ember.store.blobs import READ_CHUNK, BlobInfo, BlobWriter
from ember.store.errors import BlobSizeError, InvalidNameError, StoreError
from ember.store.manifest import MAX_MANIFEST_BYTES, Manifest
from ember.store.names import Digest, ModelName, is_valid_part

log = logging.getLogger(__name__)

_LOCK_NAME = "store.lock"
MAX_FILE_NAME = 255  # bytes: the longest file or folder name Linux file systems take
_PART_KINDS = ("host", "namespace", "model", "tag")


@dataclass(frozen=True, slots=True)
class StoredManifest:
    """A manifest as found in the store."""

    name: ModelName  # as spelled on disk
    manifest: Manifest
    raw: bytes
    digest: str  # sha256 hex of the manifest file: the model's digest in /api/tags
    modified_at: datetime


def as_name(name: ModelName | str) -> ModelName:
    return name if isinstance(name, ModelName) else ModelName.parse(name)


def as_digest(digest: Digest | str) -> Digest:
    return digest if isinstance(digest, Digest) else Digest.parse(digest)


class Store:
    """A model store rooted at `root` (created if missing)."""

    def __init__(self, root: str | os.PathLike[str], *, max_blob_bytes: int | None = None) -> None:
        self.root = Path(root).expanduser()
        for sub in ("manifests", "blobs", "tmp"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self.root = self.root.resolve()
        self.manifests_dir = self.root / "manifests"
        self.blobs_dir = self.root / "blobs"
        self.tmp_dir = self.root / "tmp"
        self.max_blob_bytes = max_blob_bytes  # quota for one blob; None: no limit
        self._thread_lock = threading.RLock()
        self._lock_depth = 0
        self._lock_file: BinaryIO | None = None

    # ------------------------------------------------------------ paths

    def _inside(self, path: Path) -> Path:
        """`path` with symlinks resolved; raises if that leaves the store root."""
        resolved = path.resolve()
        if not resolved.is_relative_to(self.root):
            raise StoreError(f"{path} resolves outside the model store {self.root}")
        return resolved

    def blob_path(self, digest: Digest | str) -> Path:
        """Where the blob of `digest` lives (whether or not it is there)."""
        return self._inside(self.blobs_dir / as_digest(digest).filename)

    def has_blob(self, digest: Digest | str) -> bool:
        return self.blob_path(digest).is_file()

    def manifest_path(self, name: ModelName | str) -> Path:
        parts = as_name(name).parts
        # Ollama's rules allow a 350-character host, a folder name here: past what a file
        # system names (255 bytes) it is a bad name, not an OSError (Ollama answers a 500)
        if any(len(part.encode()) > MAX_FILE_NAME for part in parts):
            raise InvalidNameError(f"invalid model name: a part is longer than {MAX_FILE_NAME}")
        return self._inside(self.manifests_dir.joinpath(*parts))

    # ------------------------------------------------------------ blobs

    def blob_writer(
        self,
        *,
        expected: Digest | None = None,
        size: int | None = None,
        max_bytes: int | None = None,
        resume: bool = False,
    ) -> BlobWriter:
        """A writer for one blob (see BlobWriter); the store's quota applies unless overridden."""
        limit = self.max_blob_bytes if max_bytes is None else max_bytes
        if size is not None and limit is not None and size > limit:
            raise BlobSizeError(f"a blob of {size} bytes exceeds the limit of {limit} bytes")
        if size is not None and size > shutil.disk_usage(self.tmp_dir).free:
            raise BlobSizeError(f"not enough disk space for a blob of {size} bytes")
        return BlobWriter(
            self.tmp_dir,
            self._publish,
            expected=expected,
            size=size,
            max_bytes=limit,
            resume=resume,
        )

    def write_blob(
        self,
        source: bytes | BinaryIO | Iterable[bytes],
        *,
        expected: Digest | None = None,
        size: int | None = None,
        max_bytes: int | None = None,
    ) -> BlobInfo:
        """Streams `source` into the store; verifies `expected` and `size` when given."""
        with self.blob_writer(expected=expected, size=size, max_bytes=max_bytes) as writer:
            for chunk in _chunks(source):
                writer.write(chunk)
            return writer.commit()

    def _publish(self, temp: Path, digest: Digest) -> Path:
        target = self.blob_path(digest)
        if target.exists():
            temp.unlink()  # same content already there: keep the old file
            os.utime(target)  # fresh for prune's grace period
        else:
            os.chmod(temp, 0o644)
            os.replace(temp, target)
        return target

    def read_blob(self, digest: Digest | str, *, max_bytes: int) -> bytes:
        """A small blob (config, params, template...) read whole; raises past `max_bytes`."""
        path = self.blob_path(digest)
        try:
            with open(path, "rb") as f:
                data = f.read(max_bytes + 1)
        except FileNotFoundError:
            raise StoreError(f"blob {as_digest(digest)} is missing from the store") from None
        if len(data) > max_bytes:
            raise BlobSizeError(f"blob {as_digest(digest)} is larger than {max_bytes} bytes")
        return data

    # ------------------------------------------------------------ manifests

    def names(self) -> list[ModelName]:
        """Every name with a manifest file whose path parts are a valid name."""
        found = []
        for path in sorted(self.manifests_dir.glob("*/*/*/*")):
            parts = path.relative_to(self.manifests_dir).parts
            if path.is_file() and all(map(is_valid_part, _PART_KINDS, parts)):
                found.append(ModelName(*parts))
        return found

    def existing_name(self, name: ModelName | str) -> ModelName:
        """The stored spelling of `name` if one differs only in case, else `name` itself."""
        name = as_name(name)
        if self.manifest_path(name).is_file():
            return name
        match = next((n for n in self.names() if n.equal_fold(name)), None)
        return ModelName(*match.parts, scheme=name.scheme) if match else name

    def read_manifest(self, name: ModelName | str) -> StoredManifest:
        """Raises ModelNotFoundError when there is none, ManifestError when it is bad."""
        name = self.existing_name(name)
        path = self.manifest_path(name)
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_MANIFEST_BYTES + 1)
                mtime = os.fstat(f.fileno()).st_mtime
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ModelNotFoundError(f"model '{name.display_shortest()}' not found") from None
        manifest = Manifest.from_bytes(raw)
        digest = hashlib.sha256(raw).hexdigest()
        return StoredManifest(name, manifest, raw, digest, datetime.fromtimestamp(mtime, UTC))

    def manifests(self) -> dict[ModelName, Manifest]:
        """Every readable manifest; unreadable ones are skipped (as Ollama's continueOnError)."""
        out = {}
        for name in self.names():
            with contextlib.suppress(StoreError, ModelNotFoundError, OSError):
                out[name] = self.read_manifest(name).manifest
        return out

    def write_manifest(self, name: ModelName | str, manifest: Manifest | bytes) -> ModelName:
        """Writes atomically, after checking every blob it names is in the store.

        Bytes are stored as given (a pulled manifest keeps the registry's digest) once they
        parse. Returns the name as stored.
        """
        raw = manifest if isinstance(manifest, bytes) else manifest.to_bytes()
        parsed = Manifest.from_bytes(raw)
        with self.locked():
            missing = [str(d) for d in parsed.digests() if not self.has_blob(d)]
            if missing:
                raise StoreError(f"cannot write the manifest: blobs missing: {', '.join(missing)}")
            name = self.existing_name(name)
            self._write_atomic(self.manifest_path(name), raw)
        return name

    def _write_atomic(self, path: Path, data: bytes) -> None:
        self._inside(path.parent)  # before mkdir: a symlinked part must not make dirs elsewhere
        path.parent.mkdir(parents=True, exist_ok=True)
        self._inside(path.parent)
        fd, temp = tempfile.mkstemp(prefix="manifest-", dir=self.tmp_dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(temp, 0o644)
            os.replace(temp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise

    # ------------------------------------------------------------ copy, delete, prune

    def copy(self, source: ModelName | str, destination: ModelName | str) -> ModelName:
        """Copies the manifest (blobs are shared); returns the destination as stored."""
        stored = self.read_manifest(source)
        destination = as_name(destination)
        if stored.name.parts == destination.parts:
            return stored.name
        return self.write_manifest(destination, stored.raw)

    def delete(self, name: ModelName | str) -> None:
        """Removes the manifest, then the blobs of it that no other manifest names."""
        with self.locked():
            stored = self.read_manifest(name)
            path = self.manifest_path(stored.name)
            path.unlink()
            self._remove_empty_dirs(path.parent)
            self.remove_unused_blobs(stored.manifest.digests())

    def remove_unused_blobs(self, candidates: Iterable[Digest]) -> list[Digest]:
        """Removes those of `candidates` that no manifest names; returns them. While a manifest
        cannot be read, nothing is removed (its blobs are unknown), as Ollama's serve skips its
        prune when a manifest is corrupt: a mended manifest finds its blobs again."""
        with self.locked():
            used: set[Digest] = set()
            for name in self.names():
                try:
                    used |= self.read_manifest(name).manifest.digests()
                except ModelNotFoundError:
                    continue
                except (StoreError, OSError):
                    log.warning("unreadable manifest: no blob removed", extra={"model": str(name)})
                    return []
            removed = []
            for digest in set(candidates) - used:
                with contextlib.suppress(FileNotFoundError):
                    self.blob_path(digest).unlink()
                    removed.append(digest)
            return removed

    def _remove_empty_dirs(self, directory: Path) -> None:
        while directory != self.manifests_dir and directory.is_relative_to(self.manifests_dir):
            try:
                directory.rmdir()
            except OSError:  # not empty (or already gone): stop climbing
                return
            directory = directory.parent

    def prune(self, *, grace_seconds: float = 3600.0) -> list[Digest]:
        """Removes unreferenced blobs and stale temp files older than `grace_seconds`.

        The grace period spares blobs of a create or pull whose manifest is not written yet.
        """
        cutoff = time.time() - grace_seconds
        with self.locked():
            for path in self.tmp_dir.iterdir():
                if path.name != _LOCK_NAME and path.is_file() and path.stat().st_mtime < cutoff:
                    path.unlink(missing_ok=True)
            old = []
            for path in self.blobs_dir.iterdir():
                if not path.is_file() or path.stat().st_mtime >= cutoff:
                    continue
                try:
                    old.append(Digest.parse(path.name))
                except ValueError:
                    path.unlink(missing_ok=True)  # not a blob name: an old partial file
            return self.remove_unused_blobs(old)

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Serialises manifest writes and blob removal, across threads and processes (CLI and
        server). Re-entrant in one thread of one Store: only the outermost level takes the flock,
        since a second flock through another open file would wait on ourselves."""
        with self._thread_lock:
            if self._lock_depth == 0:
                self._lock_file = open(self.tmp_dir / _LOCK_NAME, "a+b")  # noqa: SIM115
                fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_EX)
            self._lock_depth += 1
            try:
                yield
            finally:
                self._lock_depth -= 1
                if self._lock_depth == 0 and self._lock_file is not None:
                    self._lock_file.close()  # releases the flock
                    self._lock_file = None


def _chunks(source: bytes | BinaryIO | Iterable[bytes]) -> Iterator[bytes]:
    if isinstance(source, bytes | bytearray | memoryview):
        yield bytes(source)
        return
    read = getattr(source, "read", None)
    if read is None:
        yield from source  # type: ignore[misc]
        return
    while chunk := read(READ_CHUNK):
        yield chunk
