"""Bounded, validating reader of GGUF v2/v3 files from untrusted sources.

Every length is checked against the bytes left before anything is allocated; tensor data stays
in the memory map and is handed out as read-only uint8 views. No dequantization here.
"""

import contextlib
import itertools
import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from ember.gguf.cursor import INTEGER_TYPES, Cursor, GGUFError, ValueSignature
from ember.gguf.types import BLOCK_SIZES, GGMLType, GGUFValueType

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 1 << 20
MAX_DIMS = 4
MAX_ELEMENTS = (1 << 63) - 1  # ggml counts elements in int64
_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, one byte of value
_MIN_TENSOR_BYTES = 8 + 4 + 8 + 4 + 8  # name length, n_dims, one dim, type, offset


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """Where a tensor lies in the file and how it is encoded."""

    name: str
    shape: tuple[int, ...]  # torch order, the reverse of ggml's ne: a 2-D weight is (out, in)
    ggml_type: GGMLType
    offset: int  # absolute byte offset in the file
    nbytes: int


@dataclass(frozen=True, slots=True)
class _Header:
    version: int
    alignment: int
    metadata: dict[str, Any]
    signatures: dict[str, ValueSignature]
    tensors: dict[str, TensorInfo]


def _read_preamble(cur: Cursor) -> tuple[int, int, int]:
    """Magic, version, tensor count, kv count: returns (version, num_tensors, num_kv)."""
    cur.need(4, "magic")
    magic = bytes(cur.buf[0:4])
    if magic != MAGIC:
        raise GGUFError(f"not a GGUF file: magic is {magic!r}, expected {MAGIC!r}")
    cur.pos = 4
    version = cur.u32("version")
    if version not in SUPPORTED_VERSIONS:
        if version & 0xFFFF == 0 and int.from_bytes(version.to_bytes(4, "little"), "big") < 4:
            raise GGUFError("big-endian GGUF files are not supported")
        hint = " (v1 files predate 2023-08: convert them again)" if version == 1 else ""
        raise GGUFError(f"GGUF version {version} is not supported, only 2 and 3{hint}")
    num_tensors = cur.u64("tensor count")
    num_kv = cur.u64("metadata count")
    min_bytes = num_kv * _MIN_KV_BYTES + num_tensors * _MIN_TENSOR_BYTES
    if min_bytes > cur.left:
        raise GGUFError(
            f"header claims {num_tensors} tensors and {num_kv} metadata entries "
            f"({min_bytes} bytes at least) but the file has only {cur.left} bytes left"
        )
    return version, num_tensors, num_kv


def _read_metadata(cur: Cursor, num_kv: int) -> tuple[dict[str, Any], dict[str, ValueSignature]]:
    metadata: dict[str, Any] = {}
    signatures: dict[str, ValueSignature] = {}
    for _ in range(num_kv):
        start = cur.pos
        key = cur.name("metadata key")
        if not key:
            raise GGUFError(f"empty metadata key at byte {start}")
        if key in metadata:
            raise GGUFError(f"duplicate metadata key {key!r} at byte {start}")
        try:
            vtype = cur.value_type(cur.u32("value type"), "value type")
            metadata[key], signatures[key] = cur.value(vtype)
        except GGUFError as e:
            raise GGUFError(f"metadata {key!r}: {e}") from None
    return metadata, signatures


def _read_alignment(metadata: dict[str, Any], signatures: dict[str, ValueSignature]) -> int:
    key = "general.alignment"
    if key not in metadata:
        return DEFAULT_ALIGNMENT
    sig = signatures[key]
    if len(sig) != 1 or sig[0] not in INTEGER_TYPES:
        raise GGUFError(f"{key} must be an integer, not {'/'.join(t.name for t in sig)}")
    value = metadata[key]
    if not 1 <= value <= MAX_ALIGNMENT or value & (value - 1):
        raise GGUFError(f"{key} is {value}: must be a power of two from 1 to {MAX_ALIGNMENT}")
    return int(value)


def _check_tokenizer(metadata: dict[str, Any], signatures: dict[str, ValueSignature]) -> None:
    """The vocabulary arrays have the right item types and lengths; special ids are in range."""
    prefix = "tokenizer.ggml."
    expected = {
        "tokens": GGUFValueType.STRING,
        "scores": GGUFValueType.FLOAT32,
        "token_type": GGUFValueType.INT32,
        "merges": GGUFValueType.STRING,
    }
    for name, item_type in expected.items():
        sig = signatures.get(prefix + name)
        if sig is not None and sig != (GGUFValueType.ARRAY, item_type):
            found = "/".join(t.name for t in sig)
            raise GGUFError(f"{prefix}{name} must be an array of {item_type.name}, not {found}")
    tokens = metadata.get(prefix + "tokens")
    num_vocab = None if tokens is None else len(tokens)
    for name in ("scores", "token_type"):
        values = metadata.get(prefix + name)
        if values is not None and num_vocab is not None and len(values) != num_vocab:
            raise GGUFError(
                f"{prefix}{name} has {len(values)} items but there are {num_vocab} tokens"
            )
    for key, sig in signatures.items():
        if key.startswith(prefix) and key.endswith("_token_id"):
            _check_token_id(key, sig, metadata[key], num_vocab)


def _check_token_id(key: str, sig: ValueSignature, value: Any, num_vocab: int | None) -> None:
    if len(sig) != 1 or sig[0] not in INTEGER_TYPES:
        raise GGUFError(f"{key} must be an integer, not {'/'.join(t.name for t in sig)}")
    if value < 0 or (num_vocab is not None and value >= num_vocab):
        raise GGUFError(f"{key} is {value}, outside the vocabulary of {num_vocab} tokens")


def _read_tensor_info(cur: Cursor) -> tuple[str, tuple[int, ...], GGMLType, int, int]:
    """One tensor record: (name, torch shape, type, offset in the data section, byte size)."""
    start = cur.pos
    name = cur.name("tensor name")
    num_dims = cur.u32(f"dimension count of tensor {name!r}")
    if not 1 <= num_dims <= MAX_DIMS:
        raise GGUFError(f"tensor {name!r} has {num_dims} dimensions (must be 1 to {MAX_DIMS})")
    cur.need(8 * num_dims, f"dimensions of tensor {name!r}")
    ne = struct.unpack_from(f"<{num_dims}Q", cur.buf, cur.pos)
    cur.pos += 8 * num_dims
    if min(ne) < 1:
        raise GGUFError(f"tensor {name!r} has a zero dimension: ne = {list(ne)}")
    num_elements = math.prod(ne)
    if num_elements > MAX_ELEMENTS:
        raise GGUFError(f"tensor {name!r} has too many elements: ne = {list(ne)}")
    raw_type = cur.u32(f"type of tensor {name!r}")
    try:
        ggml_type = GGMLType(raw_type)
    except ValueError:
        raise GGUFError(
            f"tensor {name!r} at byte {start} has unknown ggml type {raw_type}"
        ) from None
    block_elements, block_bytes = BLOCK_SIZES[ggml_type]
    if ne[0] % block_elements:
        raise GGUFError(
            f"tensor {name!r}: row length {ne[0]} is not a multiple of the "
            f"{ggml_type.name} block size {block_elements}"
        )
    offset = cur.u64(f"offset of tensor {name!r}")
    nbytes = num_elements // block_elements * block_bytes
    return name, tuple(reversed(ne)), ggml_type, offset, nbytes


def _read_tensors(cur: Cursor, num_tensors: int, alignment: int) -> dict[str, TensorInfo]:
    records = [_read_tensor_info(cur) for _ in range(num_tensors)]
    data_start = cur.pos + (-cur.pos % alignment)
    tensors: dict[str, TensorInfo] = {}
    for name, shape, ggml_type, rel_offset, nbytes in records:
        if name in tensors:
            raise GGUFError(f"duplicate tensor name {name!r}")
        if rel_offset % alignment:
            raise GGUFError(f"tensor {name!r} offset {rel_offset} is not a multiple of {alignment}")
        offset = data_start + rel_offset
        if offset + nbytes > cur.end:
            raise GGUFError(
                f"tensor {name!r} spans bytes {offset} to {offset + nbytes} "
                f"but the file ends at {cur.end}"
            )
        tensors[name] = TensorInfo(name, shape, ggml_type, offset, nbytes)
    _check_overlaps(list(tensors.values()))
    return tensors


def _check_overlaps(tensors: list[TensorInfo]) -> None:
    ordered = sorted(tensors, key=lambda t: t.offset)
    for prev, cur in itertools.pairwise(ordered):
        if cur.offset < prev.offset + prev.nbytes:
            raise GGUFError(
                f"tensor {cur.name!r} (from byte {cur.offset}) overlaps tensor {prev.name!r} "
                f"(bytes {prev.offset} to {prev.offset + prev.nbytes})"
            )


def _parse(buf: Any) -> _Header:
    cur = Cursor(buf)
    version, num_tensors, num_kv = _read_preamble(cur)
    metadata, signatures = _read_metadata(cur, num_kv)
    alignment = _read_alignment(metadata, signatures)
    _check_tokenizer(metadata, signatures)
    tensors = _read_tensors(cur, num_tensors, alignment)
    return _Header(version, alignment, metadata, signatures, tensors)


class GGUFFile:
    """A parsed, validated GGUF file; tensor bytes stay in the memory map until close()."""

    path: Path
    version: int
    alignment: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]

    def __init__(self, buf: mmap.mmap | bytes, path: Path) -> None:
        """Parse `buf` (prefer `open` or `from_bytes`); raises GGUFError on any defect."""
        header = _parse(buf)
        self.path = path
        self.version = header.version
        self.alignment = header.alignment
        self.metadata = header.metadata
        self.tensors = header.tensors
        self._signatures = header.signatures
        self._buf: mmap.mmap | bytes | None = buf
        self._bytes: np.ndarray | None = np.frombuffer(buf, dtype=np.uint8)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> "GGUFFile":
        """Memory-map the file at `path` read-only, parse and validate it."""
        file_path = Path(path)
        try:
            with open(file_path, "rb") as f:
                if os.fstat(f.fileno()).st_size == 0:
                    raise GGUFError(f"{file_path}: the file is empty")
                mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise GGUFError(f"cannot open {file_path}: {e.strerror or e}") from e
        try:
            return cls(mapped, file_path)
        except GGUFError as e:
            _close_quietly(mapped)
            raise GGUFError(f"{file_path}: {e}") from None

    @classmethod
    def from_bytes(cls, data: bytes) -> "GGUFFile":
        """Parse a GGUF file held in memory (tests, small files)."""
        return cls(bytes(data), Path("<bytes>"))

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 1-D view of the map (no copy).

        Raises KeyError for a name not in `tensors`.
        """
        if self._bytes is None:
            raise GGUFError(f"{self.path} is closed")
        info = self.tensors.get(name)
        if info is None:
            raise KeyError(f"no tensor named {name!r} in {self.path}")
        return self._bytes[info.offset : info.offset + info.nbytes]

    def release(self, name: str) -> None:
        """The pages of tensor `name` stop counting in this process's memory (a copy of its
        bytes replaced it): they are read again from the file if it is touched. Whole pages
        inside the tensor only; nothing where the file is not mapped."""
        buf, info = self._buf, self.tensors.get(name)
        if not isinstance(buf, mmap.mmap) or info is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        start = -(-info.offset // mmap.PAGESIZE) * mmap.PAGESIZE
        stop = (info.offset + info.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if stop > start:
            with contextlib.suppress(OSError, ValueError):  # advice only: a closed map is fine
                buf.madvise(mmap.MADV_DONTNEED, start, stop - start)
                # a flag of its own makes the range a mapping of its own: Linux 6.18 maps a whole
                # large folio of the page cache at a fault, and faults on the tensors beside it
                # brought these pages back (SmolLM2's decode: +40 MB); a fault never maps across
                if hasattr(mmap, "MADV_DONTDUMP"):  # Linux only
                    buf.madvise(mmap.MADV_DONTDUMP, start, stop - start)

    def get(self, key: str, default: Any = None) -> Any:
        """The metadata value of `key`, or `default` when the file has none."""
        return self.metadata.get(key, default)

    def close(self) -> None:
        """Release the map; views from raw() keep it alive until they are dropped."""
        self._bytes = None
        buf, self._buf = self._buf, None
        if isinstance(buf, mmap.mmap):
            _close_quietly(buf)

    def __enter__(self) -> "GGUFFile":
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _close_quietly(mapped: mmap.mmap) -> None:
    # numpy views still use it: the map then closes when the last one goes
    with contextlib.suppress(BufferError):
        mapped.close()
