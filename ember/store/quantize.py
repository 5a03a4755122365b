"""Quantizing a GGUF model to Q8_0 from F32, F16 or BF16 tensors, with gguf-py's reference
quantizer (the gguf package is needed only here, and imported only when asked).

The metadata is copied byte for byte from the source (already validated by Ember's reader)
except general.file_type; 2-D weights become Q8_0 as llama.cpp's Q8_0 file type makes them, the
rest is copied. The output is streamed into a BlobWriter, never held whole in memory.
"""

import math
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ember.gguf import BLOCK_SIZES, GGMLType, GGUFFile, TensorInfo
from ember.gguf.cursor import Cursor
from ember.gguf.types import GGUFValueType
from ember.store.blobs import BlobWriter
from ember.store.errors import CreateError

Q8_0_FILE_TYPE = 7  # llama_ftype MOSTLY_Q8_0
_SOURCE_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16)
# Tensors llama.cpp never quantizes (routers, position and type embeddings, conv kernels).
_KEEP = ("ffn_gate_inp", "pos_embd", "token_types", "ssm_conv1d", "rel_pos")
_CHUNK_ELEMENTS = 1 << 22  # rows are quantized in slices of about 16 MB of float32


def quantize_q8_0(source: Path, writer: BlobWriter) -> Iterator[tuple[int, int]]:
    """Writes `source` quantized to Q8_0 into `writer`; yields (tensor bytes done, total)."""
    try:
        from gguf import GGMLQuantizationType, quants
    except ImportError:
        raise CreateError("quantize needs the gguf package (pip install gguf)") from None
    with GGUFFile.open(source) as gguf:
        plan = [(t, _target(t)) for t in gguf.tensors.values()]
        writer.write(_header(gguf, plan))
        total, done = sum(t.nbytes for t, _ in plan), 0
        for info, target in plan:
            raw = gguf.raw(info.name)
            if target == info.ggml_type:
                writer.write(raw.tobytes())
            else:
                for part in _q8_0_rows(raw, info, quants, GGMLQuantizationType.Q8_0):
                    writer.write(part)
            writer.write(b"\0" * _pad(_nbytes(info, target), gguf.alignment))
            done += info.nbytes
            yield done, total


def _target(info: TensorInfo) -> GGMLType:
    """Q8_0 for a float weight matrix whose rows are whole Q8_0 blocks; else the same type."""
    row = info.shape[-1]
    eligible = (
        len(info.shape) >= 2
        and info.name.endswith("weight")
        and info.ggml_type in _SOURCE_TYPES
        and row % BLOCK_SIZES[GGMLType.Q8_0][0] == 0
        and not any(k in info.name for k in _KEEP)
    )
    return GGMLType.Q8_0 if eligible else info.ggml_type


def _nbytes(info: TensorInfo, ggml_type: GGMLType) -> int:
    block_elements, block_bytes = BLOCK_SIZES[ggml_type]
    return math.prod(info.shape) // block_elements * block_bytes


def _pad(n: int, alignment: int) -> int:
    return -n % alignment


def _q8_0_rows(raw: np.ndarray, info: TensorInfo, quants: Any, q8_0: Any) -> Iterator[bytes]:
    cols = info.shape[-1]
    row_bytes = info.nbytes // (math.prod(info.shape) // cols)
    step = max(1, _CHUNK_ELEMENTS // cols) * row_bytes
    for start in range(0, raw.size, step):
        values = _to_f32(raw[start : start + step], info.ggml_type).reshape(-1, cols)
        yield np.ascontiguousarray(quants.quantize(values, q8_0)).tobytes()


def _to_f32(raw: np.ndarray, ggml_type: GGMLType) -> np.ndarray:
    if ggml_type == GGMLType.F32:
        return raw.view(np.float32)
    if ggml_type == GGMLType.F16:
        return raw.view(np.float16).astype(np.float32)
    return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)  # BF16


# ---------------------------------------------------------------- header


def _header(gguf: GGUFFile, plan: list[tuple[TensorInfo, GGMLType]]) -> bytes:
    kvs = [kv for key, kv in _raw_kvs(gguf) if key != "general.file_type"]
    file_type = struct.pack("<II", GGUFValueType.UINT32, Q8_0_FILE_TYPE)
    kvs.append(_string(b"general.file_type") + file_type)
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
