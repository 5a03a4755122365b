"""Long metadata arrays (a vocabulary, its scores, types and merges) kept packed as the file
stores them, each item made a Python object only when it is read.

As lists of Python strings, floats and ints, Gemma 3's 262,144-token vocabulary took ~40 MB
beside its 241 MiB file, in every process that opened it: a model's load, which never reads it,
and the server's cache of /api/show answers. Packed it takes ~7 MB. Shorter arrays stay lists.
"""

from collections.abc import Iterator, Sequence
from itertools import pairwise
from typing import Any

import numpy as np

PACKED_ITEMS = 1024  # arrays of at least this many items are packed


class PackedArray(Sequence[Any]):
    """A read-only sequence equal to the list of its items."""

    __slots__ = ()
    __hash__ = None  # type: ignore[assignment]  # equal to a list, so as unhashable

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (PackedArray, list, tuple)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {len(self)} items>"

    def _index(self, i: int) -> int:
        n = len(self)
        if not -n <= i < n:
            raise IndexError("packed array index out of range")
        return i + n if i < 0 else i


class PackedStrings(PackedArray):
    """Strings as the file stores them (each after its 8-byte length), decoded as UTF-8 with
    bad bytes replaced when read, as the reader decodes a short array's."""

    __slots__ = ("_data", "_starts")

    def __init__(self, data: bytes, starts: np.ndarray) -> None:
        # starts: where each item's bytes begin in data, then len(data) + 8; item i ends 8
        # bytes (the next one's length) before item i + 1 begins
        self._data, self._starts = data, starts

    def __len__(self) -> int:
        return len(self._starts) - 1

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = self._index(i)
        start, end = int(self._starts[i]), int(self._starts[i + 1]) - 8
        return self._data[start:end].decode("utf-8", "replace")

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        """As a list's, decoding only the items whose bytes are as long as value's (Gemma's
        turn marker looked for in a vocabulary that lacks it: every item read one by one took
        ~0.17 s). A replacement character in value may stand for bytes of another length, so
        then every item is compared."""
        if not isinstance(value, str) or "\ufffd" in value:
            return super().index(value, start, len(self) if stop is None else stop)
        try:
            width = len(value.encode("utf-8"))
        except UnicodeEncodeError:  # a lone surrogate: no decoded item holds one
            raise ValueError(f"{value!r} is not in the packed strings") from None
        lo, hi, _ = slice(start, stop).indices(len(self))
        lengths = np.diff(self._starts[lo : hi + 1]) - 8
        for i in np.flatnonzero(lengths == width).tolist():
            if self[lo + i] == value:
                return lo + i
        raise ValueError(f"{value!r} is not in the packed strings")

    def __iter__(self) -> Iterator[str]:
        data, starts = self._data, self._starts.tolist()
        return iter(
            [
                data[start : after - 8].decode("utf-8", "replace")
                for start, after in pairwise(starts)
            ]
        )


class PackedNumbers(PackedArray):
    """Numbers (or bools) as a numpy array; read as Python ints, floats and bools."""

    __slots__ = ("_values",)

    def __init__(self, values: np.ndarray) -> None:
        self._values = values

    def __len__(self) -> int:
        return len(self._values)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return self._values[i].tolist()
        return self._values[self._index(i)].item()

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values.tolist())

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """The values, cast to dtype only where every value survives the cast (as numpy does
        for a list of Python numbers)."""
        values = self._values
        if dtype is None or values.dtype == np.dtype(dtype):
            return values.copy() if copy else values
        cast = values.astype(dtype)
        if not np.array_equal(cast, values, equal_nan=values.dtype.kind == "f"):
            raise OverflowError(f"a value does not fit {np.dtype(dtype).name}")
        return cast
