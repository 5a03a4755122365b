"""Writing a blob into the store: hashed while written to a temp file, verified, then renamed.

A blob only ever appears under `blobs/` whole and with the content its name promises; an
interrupted write leaves at most a file in the store's `tmp/` (kept on purpose for a resumable
download, removed otherwise).
"""

import contextlib
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from ember.store.errors import BlobBusyError, BlobDigestError, BlobSizeError, StoreError
from ember.store.names import Digest

READ_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class BlobInfo:
    digest: Digest
    size: int


def partial_path(tmp_dir: Path, digest: Digest) -> Path:
    """Where a resumable download of `digest` keeps what it has so far."""
    return tmp_dir / f"{digest.filename}-partial"


class BlobWriter:
    """Receives a blob's bytes in pieces; `commit()` verifies and publishes it.

    Use as a context manager: leaving it without commit discards the temp file, except a
    resumable partial download (`resume=True`) which stays for the next attempt unless it was
    found to be bad (too long, wrong digest).
    """

    def __init__(
        self,
        tmp_dir: Path,
        publish: Callable[[Path, Digest], Path],
        *,
        expected: Digest | None = None,
        size: int | None = None,
        max_bytes: int | None = None,
        resume: bool = False,
    ) -> None:
        if resume and expected is None:
            raise StoreError("a resumable blob write needs the expected digest")
        self._publish = publish
        self.expected = expected
        self.size = size  # the exact size announced (manifest, Content-Length); None: unknown
        self.max_bytes = max_bytes
        self._hash = hashlib.sha256()
        self._keep_on_abort = resume
        self._done = False
        if resume and expected is not None:
            self.path = partial_path(tmp_dir, expected)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        else:
            fd, name = tempfile.mkstemp(prefix="blob-", dir=tmp_dir)
            self.path = Path(name)
        self._file = os.fdopen(fd, "r+b")
        self._lock()
        self.written = self._rehash() if resume else 0

    def _lock(self) -> None:
        # two pulls of one digest would interleave their bytes in the same partial file
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            # the holder may have just published the file we opened: then it is not ours
            if os.stat(self.path).st_ino != os.fstat(self._file.fileno()).st_ino:
                raise BlockingIOError
        except (BlockingIOError, FileNotFoundError):
            self._file.close()
            raise BlobBusyError(f"a download of {self.expected} is already under way") from None

    def _rehash(self) -> int:
        """Hashes what a previous attempt left, so the download continues where it stopped."""
        total = 0
        while chunk := self._file.read(READ_CHUNK):
            self._hash.update(chunk)
            total += len(chunk)
        if self.size is not None and total > self.size:
            self.restart()
            return 0
        return total

    def restart(self) -> None:
        """Forget what was written (a server that ignored our Range request sends it all)."""
        self._file.seek(0)
        self._file.truncate()
        self._hash = hashlib.sha256()
        self.written = 0

    def write(self, data: bytes) -> None:
        """Appends `data`; raises BlobSizeError past the declared size or the quota."""
        end = self.written + len(data)
        if self.size is not None and end > self.size:
            self._keep_on_abort = False  # a longer body than declared is never resumable
            raise BlobSizeError(
                f"blob {self._label()} is longer than its declared {self.size} bytes"
            )
        if self.max_bytes is not None and end > self.max_bytes:
            self._keep_on_abort = False
            raise BlobSizeError(f"blob {self._label()} exceeds the limit of {self.max_bytes} bytes")
        self._file.write(data)
        self._hash.update(data)
        self.written = end

    def commit(self) -> BlobInfo:
        """Checks size and digest, then renames the file into `blobs/` (atomic)."""
        if self.size is not None and self.written != self.size:
            raise BlobSizeError(
                f"blob {self._label()} ended after {self.written} of {self.size} bytes"
            )
        digest = Digest(self._hash.hexdigest())
        if self.expected is not None and digest != self.expected:
            self._keep_on_abort = False
            raise BlobDigestError(f"digest mismatch: expected {self.expected}, got {digest}")
        self._file.flush()
        os.fsync(self._file.fileno())  # the rename must not publish a file the disk lacks
        self._publish(self.path, digest)
        self._close()
        self._done = True
        return BlobInfo(digest, self.written)

    def abort(self) -> None:
        """Drops the temp file (keeps a resumable partial that is still good)."""
        if self._done:
            return
        self._close()
        self._done = True
        if not self._keep_on_abort:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    def discard(self) -> None:
        """Drops the temp file even if resumable (the blob was published meanwhile)."""
        self._keep_on_abort = False
        self.abort()

    def _close(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()  # also releases the lock

    def _label(self) -> str:
        return str(self.expected) if self.expected else "upload"

    def __enter__(self) -> "BlobWriter":
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.abort()
