"""The pieces of a SentencePiece `tokenizer.model` (a ModelProto), read with a minimal protobuf
wire-format parser: no generated code, every length checked, unknown fields skipped."""

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from ember.convert.source import ConvertError

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


@dataclass(frozen=True, slots=True)
class SentencePieceModel:
    pieces: list[str]
    scores: list[float]
    types: list[int]
    add_dummy_prefix: bool


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ConvertError("tokenizer.model is not a valid SentencePiece model")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if byte < 0x80:
            return value, pos


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field of one message."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            value, pos = _varint(data, pos)
            yield number, wire, value
            continue
        if wire == _BYTES:
            size, pos = _varint(data, pos)
        elif wire in (_FIXED32, _FIXED64):
            size = 4 if wire == _FIXED32 else 8
        else:
            raise ConvertError("tokenizer.model is not a valid SentencePiece model")
        if pos + size > len(data):
            raise ConvertError("tokenizer.model is truncated")
        yield number, wire, data[pos : pos + size]
        pos += size


def _piece(data: bytes) -> tuple[str, float, int]:
    text, score, kind = "", 0.0, NORMAL
    for number, wire, value in _fields(data):
        if number == 1 and wire == _BYTES:
            text = bytes(value).decode("utf-8", "replace")  # type: ignore[arg-type]
        elif number == 2 and wire == _FIXED32:
            score = struct.unpack("<f", value)[0]  # type: ignore[arg-type]
        elif number == 3 and wire == _VARINT:
            kind = int(value)  # type: ignore[arg-type]
    if not NORMAL <= kind <= BYTE:
        raise ConvertError(f"tokenizer.model: piece {text!r} has unknown type {kind}")
    return text, score, kind


def read_sentencepiece(data: bytes) -> SentencePieceModel:
    """Pieces (field 1) and the normalizer's add_dummy_prefix (field 3.3, default true)."""
    pieces, scores, types = [], [], []
    add_dummy_prefix = True
    for number, wire, value in _fields(data):
        if number == 1 and wire == _BYTES:
            text, score, kind = _piece(bytes(value))  # type: ignore[arg-type]
            pieces.append(text)
            scores.append(score)
            types.append(kind)
        elif number == 3 and wire == _BYTES:
            for sub, sub_wire, sub_value in _fields(bytes(value)):  # type: ignore[arg-type]
                if sub == 3 and sub_wire == _VARINT:
                    add_dummy_prefix = bool(sub_value)
    if not pieces:
        raise ConvertError("tokenizer.model has no pieces")
    return SentencePieceModel(pieces, scores, types, add_dummy_prefix)
