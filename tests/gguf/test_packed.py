"""Long metadata arrays come packed (ember/gguf/packed.py): equal to the lists they stand for,
read item by item, and far smaller."""

import json
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from gguf_bytes import Builder, T, kv, kv_array, string, valid_builder

from ember.gguf import GGUFFile
from ember.gguf.packed import PACKED_ITEMS, PackedArray, PackedNumbers
from ember.server.model_show import model_info

N = PACKED_ITEMS + 3
WORDS = [f"▁w{i}" for i in range(N)]


def _file(*kvs: bytes) -> GGUFFile:
    return GGUFFile.from_bytes(Builder(kvs=list(kvs)).header())


def test_long_arrays_are_packed_and_equal_their_lists() -> None:
    f = _file(
        kv_array("words", T.STRING, WORDS),
        kv_array("scores", T.FLOAT32, [i / 4 for i in range(N)]),
        kv_array("types", T.INT32, [i % 7 - 3 for i in range(N)]),
        kv_array("flags", T.BOOL, [i % 2 for i in range(N)]),
        kv_array("short", T.STRING, WORDS[: PACKED_ITEMS - 1]),
    )
    words, scores, types, flags = (f.get(k) for k in ("words", "scores", "types", "flags"))
    assert all(isinstance(v, PackedArray) for v in (words, scores, types, flags))
    assert type(f.get("short")) is list and f.get("short") == WORDS[: PACKED_ITEMS - 1]
    assert words == WORDS and WORDS[::-1] != words and words != WORDS[:-1] and words != "x"
    assert list(words) == WORDS and tuple(words) == tuple(WORDS) and len(words) == N
    assert words[0] == WORDS[0] and words[-1] == WORDS[-1] and words[5:8] == WORDS[5:8]
    assert "▁w7" in words and bool(words)
    with pytest.raises(IndexError):
        words[N]
    assert scores == [i / 4 for i in range(N)] and type(scores[3]) is float
    assert types[-1] == (N - 1) % 7 - 3 and type(types[0]) is int
    assert flags[1] is True and flags[::2] == [False] * len(range(0, N, 2))
    with pytest.raises(TypeError):
        hash(words)


def test_packed_numbers_convert_to_numpy_as_a_list_would() -> None:
    values = PackedNumbers(np.array([1, 2, 300], dtype=np.int32))
    assert np.asarray(values).dtype == np.int32
    assert np.asarray(values, dtype=np.int64).tolist() == [1, 2, 300]
    with pytest.raises(OverflowError):
        np.asarray(values, dtype=np.int8)  # as numpy refuses the list [1, 2, 300]
    nan = PackedNumbers(np.array([np.nan, 1.0], dtype=np.float32))
    assert np.isnan(np.asarray(nan, dtype=np.float64)[0])


def test_bad_utf8_is_replaced_in_a_packed_array() -> None:
    items = [string(b"a\xffb")] + [string(w) for w in WORDS[1:]]
    body = T.STRING.to_bytes(4, "little") + N.to_bytes(8, "little") + b"".join(items)
    words = _file(kv("words", T.ARRAY, body)).get("words")
    assert isinstance(words, PackedArray) and words[0] == next(iter(words)) == "a\ufffdb"


def test_packed_strings_index_as_a_list_does() -> None:
    items = ["a\ufffdb", "\u00e9", *WORDS[2:]]
    raw = [string(b"a\xffb"), string("\u00e9".encode())] + [string(w) for w in WORDS[2:]]
    body = T.STRING.to_bytes(4, "little") + N.to_bytes(8, "little") + b"".join(raw)
    words = _file(kv("words", T.ARRAY, body)).get("words")
    assert isinstance(words, PackedArray) and list(words) == items
    END = sys.maxsize  # a list's default stop
    for value, start, stop in [
        ("▁w7", 0, END), ("▁w7", 7, END), ("▁w7", -N, -1), ("▁w1000", 0, N),
        ("a\ufffdb", 0, END), ("\u00e9", 0, END), (WORDS[-1], 0, END),
    ]:  # fmt: skip
        assert words.index(value, start, stop) == items.index(value, start, stop)
    for value, start, stop in [
        ("▁w7", 8, END), ("▁w7", 0, 7), ("nope", 0, END), ("\ud800", 0, END), ("a", 0, END),
    ]:  # fmt: skip
        with pytest.raises(ValueError):
            items.index(value, start, stop)
        with pytest.raises(ValueError):
            words.index(value, start, stop)
    with pytest.raises(ValueError):
        words.index(7)
    assert words.index("▁w7", 0, None) == 7  # as any Sequence's


def test_packed_arrays_outlive_the_file_and_show_as_lists(tmp_path: Path) -> None:
    b = valid_builder()
    b.kvs.append(kv_array("general.words", T.STRING, WORDS))
    path = tmp_path / "m.gguf"
    path.write_bytes(b.build())
    with GGUFFile.open(path) as f:
        metadata = f.metadata
    assert metadata["general.words"][-1] == WORDS[-1]  # the map is closed: a copy was kept
    assert model_info(metadata, verbose=False)["general.words"] is None
    assert json.loads(json.dumps(model_info(metadata, verbose=True)))["general.words"] == WORDS


def test_a_big_vocabulary_takes_little_memory() -> None:
    num_tokens = 262_144  # Gemma 3's: ~40 MB as lists of Python objects
    data = Builder(
        kvs=[
            kv_array("tokenizer.ggml.tokens", T.STRING, [f"▁tok{i}" for i in range(num_tokens)]),
            kv_array("tokenizer.ggml.scores", T.FLOAT32, [-1.5] * num_tokens),
            kv_array("tokenizer.ggml.token_type", T.INT32, [1] * num_tokens),
        ]
    ).header()
    tracemalloc.start()
    try:
        f = GGUFFile.from_bytes(data)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # the strings' bytes as stored (4.7 MB) and their starts (2 MB), the numbers (2 MB)
    assert held < 12 << 20, f"{held / 2**20:.1f} MiB"
    assert f.get("tokenizer.ggml.tokens")[-1] == f"▁tok{num_tokens - 1}"
