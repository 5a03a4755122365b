"""Quantizing a GGUF model from F32, F16 or BF16 tensors to a llama.cpp file type (Q8_0,
Q4_K_M, Q4_K_S, or F32, F16, BF16), each tensor to the type quantmix chooses, with Ember's
K-quant encoders and gguf-py's Q8_0, Q5_0, Q5_1 and BF16 ones (all as llama.cpp's reference C).

The metadata is copied byte for byte from the source (already validated by Ember's reader)
except general.file_type; kept tensors are copied. The output is streamed into a BlobWriter,
rows quantized a slice at a time, never the whole model in memory.
"""

import math
import struct
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, quants

from ember.gguf import BLOCK_SIZES, GGMLType, GGUFFile, TensorInfo
from ember.gguf.cursor import Cursor
from ember.gguf.types import GGUFValueType
from ember.store import kquants
from ember.store.blobs import BlobWriter
from ember.store.errors import CreateError
from ember.store.quantmix import FILE_TYPES, tensor_types

_CHUNK_ELEMENTS = 1 << 22  # rows are quantized in slices of about 16 MB of float32
_ENCODERS: dict[GGMLType, Callable[[np.ndarray], np.ndarray]] = {
    GGMLType.Q4_K: kquants.quantize_q4_k,
    GGMLType.Q5_K: kquants.quantize_q5_k,
    GGMLType.Q6_K: kquants.quantize_q6_k,
    GGMLType.F16: partial(np.asarray, dtype=np.float16),
    GGMLType.F32: partial(np.asarray, dtype=np.float32),
    **{
        t: partial(quants.quantize, qtype=GGMLQuantizationType(t))
        for t in (GGMLType.Q8_0, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.BF16)
    },
}


def quantize(source: Path, writer: BlobWriter, file_type: str) -> Iterator[tuple[int, int]]:
    """Writes `source` quantized to `file_type` (a FILE_TYPES name) into `writer`; yields
    (source tensor bytes done, total) after each tensor."""
    if file_type not in FILE_TYPES:
        raise CreateError(f"cannot quantize to {file_type}: choose one of {', '.join(FILE_TYPES)}")
    with GGUFFile.open(source) as gguf:
        types = tensor_types(gguf, file_type)
        plan = [(t, types[t.name]) for t in gguf.tensors.values()]
        writer.write(_header(gguf, plan, FILE_TYPES[file_type]))
        total, done = sum(t.nbytes for t, _ in plan), 0
        for info, target in plan:
            raw = gguf.raw(info.name)
            if target == info.ggml_type:
                writer.write(raw.tobytes())
            else:
                for part in _encoded_rows(raw, info, _ENCODERS[target]):
                    writer.write(part)
            writer.write(b"\0" * _pad(_nbytes(info, target), gguf.alignment))
            done += info.nbytes
            yield done, total


def _nbytes(info: TensorInfo, ggml_type: GGMLType) -> int:
    block_elements, block_bytes = BLOCK_SIZES[ggml_type]
    return math.prod(info.shape) // block_elements * block_bytes


def _pad(n: int, alignment: int) -> int:
    return -n % alignment


def _encoded_rows(
    raw: np.ndarray, info: TensorInfo, encode: Callable[[np.ndarray], np.ndarray]
) -> Iterator[bytes]:
    cols = info.shape[-1]
    row_bytes = info.nbytes // (math.prod(info.shape) // cols)
    step = max(1, _CHUNK_ELEMENTS // cols) * row_bytes
    for start in range(0, raw.size, step):
        values = _to_f32(raw[start : start + step], info.ggml_type).reshape(-1, cols)
        yield np.ascontiguousarray(encode(values)).tobytes()


def _to_f32(raw: np.ndarray, ggml_type: GGMLType) -> np.ndarray:
    if ggml_type == GGMLType.F32:
        return raw.view(np.float32)
    if ggml_type == GGMLType.F16:
        return raw.view(np.float16).astype(np.float32)
    return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)  # BF16


# ---------------------------------------------------------------- header


def _header(gguf: GGUFFile, plan: list[tuple[TensorInfo, GGMLType]], file_type: int) -> bytes:
    kvs = [kv for key, kv in _raw_kvs(gguf) if key != "general.file_type"]
    file_type_kv = struct.pack("<II", GGUFValueType.UINT32, file_type)
    kvs.append(_string(b"general.file_type") + file_type_kv)
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(plan), len(kvs)))
    out += b"".join(kvs)
    offset = 0
    for info, target in plan:
        ne = tuple(reversed(info.shape))
        out += _string(info.name.encode()) + struct.pack(f"<I{len(ne)}Q", len(ne), *ne)
        out += struct.pack("<IQ", target, offset)
        size = _nbytes(info, target)
        offset += size + _pad(size, gguf.alignment)
    out += b"\0" * _pad(len(out), gguf.alignment)
    return bytes(out)


def _raw_kvs(gguf: GGUFFile) -> Iterator[tuple[str, bytes]]:
    """(key, its bytes as stored) for every metadata entry, read again from the file."""
    with open(gguf.path, "rb") as f:
        head = f.read(_header_end(gguf))
    cur = Cursor(head)
    cur.pos = 4 + 4 + 8  # magic, version, tensor count
    num_kv = cur.u64("metadata count")
    for _ in range(num_kv):
        start = cur.pos
        key = cur.name("metadata key")
        cur.value(cur.value_type(cur.u32("value type"), "value type"))
        yield key, head[start : cur.pos]


def _header_end(gguf: GGUFFile) -> int:
    """Where tensor data starts: the metadata lies before it."""
    if not gguf.tensors:
        return gguf.path.stat().st_size
    return min(t.offset for t in gguf.tensors.values())


def _string(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data
