"""Bounded reading of GGUF bytes: every length and count is checked against the bytes left
before anything is allocated. The file structure (header, tensors) is read in reader.py."""

import struct
from array import array
from typing import Any

import numpy as np

from ember.errors import EmberError
from ember.gguf.packed import PACKED_ITEMS, PackedArray, PackedNumbers, PackedStrings
from ember.gguf.types import GGUFValueType

MAX_NAME_BYTES = 65535  # GGUF spec: keys are at most 2^16 - 1 bytes
MAX_ARRAY_DEPTH = 3  # an array of arrays of arrays; real files use one level
# All metadata array items together; the largest real vocabularies (262,144 tokens with scores and
# types, or ~150k tokens with merges) use about a million.
MAX_ARRAY_ITEMS = 1 << 22

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_SCALARS: dict[GGUFValueType, struct.Struct] = {
    GGUFValueType.UINT8: struct.Struct("<B"),
    GGUFValueType.INT8: struct.Struct("<b"),
    GGUFValueType.UINT16: struct.Struct("<H"),
    GGUFValueType.INT16: struct.Struct("<h"),
    GGUFValueType.UINT32: struct.Struct("<I"),
    GGUFValueType.INT32: struct.Struct("<i"),
    GGUFValueType.FLOAT32: struct.Struct("<f"),
    GGUFValueType.BOOL: struct.Struct("<B"),
    GGUFValueType.UINT64: struct.Struct("<Q"),
    GGUFValueType.INT64: struct.Struct("<q"),
    GGUFValueType.FLOAT64: struct.Struct("<d"),
}
_DTYPES = {vtype: np.dtype(st.format) for vtype, st in _SCALARS.items()}  # same letters
INTEGER_TYPES = frozenset(_SCALARS) - {
    GGUFValueType.FLOAT32,
    GGUFValueType.FLOAT64,
    GGUFValueType.BOOL,
}
# Smallest encoding of one array item: a string is at least its 8-byte length, an array its
# 4-byte type and 8-byte count.
_MIN_ITEM_BYTES = {vtype: st.size for vtype, st in _SCALARS.items()} | {
    GGUFValueType.STRING: 8,
    GGUFValueType.ARRAY: 12,
}

# A value's type as stored: (STRING,), (UINT32,), (ARRAY, STRING), (ARRAY, ARRAY) ...
ValueSignature = tuple[GGUFValueType, ...]


class GGUFError(EmberError, ValueError):
    """A file that is not a valid GGUF v2/v3 file, with what is wrong and where."""


class Cursor:
    """Reads little-endian values from a buffer, each length checked against the bytes left."""

    def __init__(self, buf: Any) -> None:
        self.buf = buf
        self.pos = 0
        self.end = len(buf)
        self.num_items = 0  # metadata array items read so far, bounded by MAX_ARRAY_ITEMS

    @property
    def left(self) -> int:
        return self.end - self.pos

    def need(self, num_bytes: int, what: str) -> None:
        if num_bytes > self.left:
            raise GGUFError(
                f"{what} at byte {self.pos} needs {num_bytes} bytes but only {self.left} remain"
            )

    def unpack(self, st: struct.Struct, what: str) -> Any:
        self.need(st.size, what)
        value = st.unpack_from(self.buf, self.pos)[0]
        self.pos += st.size
        return value

    def u32(self, what: str) -> int:
        return int(self.unpack(_U32, what))

    def u64(self, what: str) -> int:
        return int(self.unpack(_U64, what))

    def raw_string(self, what: str, *, max_bytes: int | None = None) -> bytes:
        length = self.u64(f"length of {what}")
        if max_bytes is not None and length > max_bytes:
            raise GGUFError(
                f"{what} at byte {self.pos - 8} is {length} bytes long (max {max_bytes})"
            )
        self.need(length, what)
        data = self.buf[self.pos : self.pos + length]
        self.pos += length
        return bytes(data)

    def name(self, what: str) -> str:
        """A key or tensor name: must be valid UTF-8, unlike string values."""
        start = self.pos
        data = self.raw_string(what, max_bytes=MAX_NAME_BYTES)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise GGUFError(f"{what} at byte {start} is not valid UTF-8: {data[:64]!r}") from e

    def value(self, vtype: GGUFValueType, depth: int = 0) -> tuple[Any, ValueSignature]:
        if vtype == GGUFValueType.STRING:
            return str(self.raw_string("string value"), "utf-8", "replace"), (vtype,)
        if vtype == GGUFValueType.ARRAY:
            return self.array(depth + 1)
        value = self.unpack(_SCALARS[vtype], f"{vtype.name} value")
        if vtype == GGUFValueType.BOOL:
            return _as_bool(value, self.pos - 1), (vtype,)
        return value, (vtype,)

    def array(self, depth: int) -> tuple[list[Any] | PackedArray, ValueSignature]:
        if depth > MAX_ARRAY_DEPTH:
            raise GGUFError(f"arrays nested deeper than {MAX_ARRAY_DEPTH} at byte {self.pos}")
        item_type = self.value_type(self.u32("array item type"), "array item type")
        start = self.pos
        count = self.u64("array length")
        min_bytes = count * _MIN_ITEM_BYTES[item_type]
        if min_bytes > self.left:
            raise GGUFError(
                f"array at byte {start} claims {count} {item_type.name} items ({min_bytes} bytes "
                f"at least) but only {self.left} bytes remain"
            )
        self.num_items += count
        if self.num_items > MAX_ARRAY_ITEMS:
            raise GGUFError(f"metadata arrays hold more than {MAX_ARRAY_ITEMS} items in all")
        if item_type == GGUFValueType.STRING:
            return self.string_array(count), (GGUFValueType.ARRAY, item_type)
        if item_type == GGUFValueType.ARRAY:
            items = [self.array(depth + 1)[0] for _ in range(count)]
            return items, (GGUFValueType.ARRAY, item_type)
        return self.scalar_array(item_type, count), (GGUFValueType.ARRAY, item_type)

    def string_array(self, count: int) -> list[str] | PackedStrings:
        # The hot loop of a vocabulary (262,144 tokens): locals only, one bound check per item;
        # each item's start is noted, and the strings are decoded when read (packed.py).
        buf, pos, end, unpack = self.buf, self.pos, self.end, _U64.unpack_from
        first = pos
        starts = array("q")
        add = starts.append
        for _ in range(count):
            if end - pos < 8:
                raise GGUFError(f"array string length at byte {pos} is cut off by the end")
            length = unpack(buf, pos)[0]
            pos += 8
            if length > end - pos:
                raise GGUFError(
                    f"array string at byte {pos - 8} claims {length} bytes but only "
                    f"{end - pos} remain"
                )
            add(pos - first)
            pos += length
        self.pos = pos
        starts.append(pos - first + 8)
        packed = PackedStrings(bytes(buf[first:pos]), np.frombuffer(starts, np.int64))
        return packed if count >= PACKED_ITEMS else list(packed)

    def scalar_array(self, item_type: GGUFValueType, count: int) -> list[Any] | PackedNumbers:
        st = _SCALARS[item_type]
        start = self.pos
        self.need(count * st.size, f"array of {count} {item_type.name}")
        # copied at once: no view of the buffer (an export that keeps an mmap open) outlives it
        values = np.frombuffer(self.buf, _DTYPES[item_type], count, start).copy()
        self.pos += count * st.size
        if item_type == GGUFValueType.BOOL:
            if (over := np.flatnonzero(values > 1)).size:
                raise _bad_bool(int(values[over[0]]), start + int(over[0]))
            values = values.astype(bool)
        if count >= PACKED_ITEMS:
            return PackedNumbers(values)
        items: list[Any] = values.tolist()
        return items

    def value_type(self, raw: int, what: str) -> GGUFValueType:
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise GGUFError(f"unknown {what} {raw} at byte {self.pos - 4}") from None


def _as_bool(value: int, pos: int) -> bool:
    if value > 1:
        raise _bad_bool(value, pos)
    return value == 1


def _bad_bool(value: int, pos: int) -> GGUFError:
    return GGUFError(f"bool at or after byte {pos} has the value {value} (must be 0 or 1)")
