"""Randomly truncated or mutated GGUF files: the reader parses them or raises GGUFError, fast."""

import struct
import tempfile
import time
from pathlib import Path

from gguf_bytes import valid_builder, write_with_gguf_py
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ember.gguf import GGUFError, GGUFFile


def _writer_file() -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ref.gguf"
        write_with_gguf_py(str(path))
        return path.read_bytes()


BASES = [valid_builder().build(), _writer_file()]
# Values that stress bounds when they land on a length, count, type or offset field.
NASTY_U64 = [0, 1, 3, 4, 5, 31, 2**31, 2**32 - 1, 2**32, 2**62, 2**63, 2**64 - 1]


@st.composite
def _mutation(draw: st.DrawFn, data: bytes) -> bytes:
    # Plain integers cluster near 0 (the magic); sampled_from spreads over the whole file.
    pos = draw(st.sampled_from(range(len(data) + 1)))
    kind = draw(st.sampled_from(["truncate", "overwrite", "u64", "u32", "insert", "delete"]))
    if kind == "truncate":
        return data[:pos]
    if kind in ("u64", "u32"):
        value = draw(st.sampled_from(NASTY_U64) | st.integers(0, 2**64 - 1))
        chunk = struct.pack("<Q", value) if kind == "u64" else struct.pack("<I", value & 0xFFFFFFFF)
    elif kind == "delete":
        return data[:pos] + data[pos + draw(st.integers(1, 16)) :]
    else:
        chunk = draw(st.binary(min_size=1, max_size=16))
    if kind == "insert":
        return data[:pos] + chunk + data[pos:]
    return data[:pos] + chunk + data[pos + len(chunk) :]


@st.composite
def mutated_files(draw: st.DrawFn) -> bytes:
    data = draw(st.sampled_from(BASES))
    for _ in range(draw(st.integers(1, 3))):
        data = draw(_mutation(data))
    return data


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_files())
def test_mutated_file_parses_or_raises_gguf_error(data: bytes) -> None:
    start = time.perf_counter()
    try:
        f = GGUFFile.from_bytes(data)
    except GGUFError:
        pass
    else:
        for info in f.tensors.values():
            assert f.raw(info.name).size == info.nbytes
            assert info.offset + info.nbytes <= len(data)
    assert time.perf_counter() - start < 1.0
