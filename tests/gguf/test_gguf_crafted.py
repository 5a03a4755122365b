"""Crafted broken GGUF files: each is rejected with GGUFError, fast and with little memory."""

import json
import subprocess
import sys
import textwrap
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from gguf_bytes import (
    Builder,
    T,
    array,
    kv,
    kv_array,
    kv_scalar,
    kv_string,
    scalar,
    string,
    tensor_info,
    u32,
    u64,
    valid_builder,
)

from ember.gguf import GGMLType, GGUFError, GGUFFile

HUGE = 2**63
MAX_SECONDS = 1.0
MAX_PEAK_BYTES = 50 * 2**20
ROOT = Path(__file__).resolve().parents[2]


def _edit(change: Callable[[Builder], object]) -> bytes:
    """The valid file with one change applied to its builder."""
    b = valid_builder()
    change(b)
    return b.build()


def _with_kv(entry: bytes) -> bytes:
    return _edit(lambda b: b.kvs.append(entry))


def _with_tensor(index: int, record: bytes) -> bytes:
    return _edit(lambda b: b.tensors.__setitem__(index, record))


def _with_kv_replaced(index: int, entry: bytes) -> bytes:
    return _edit(lambda b: b.kvs.__setitem__(index, entry))


def _header_only(*kvs: bytes, num_kv: int | None = None) -> bytes:
    return Builder(kvs=list(kvs), num_kv=num_kv).header()


def _nested(depth: int) -> bytes:
    """An array of arrays `depth` deep, ending in an empty uint8 array."""
    return b"".join(u32(T.ARRAY) + u64(1) for _ in range(depth)) + u32(T.UINT8) + u64(0)


VALID = valid_builder().build()
HEADER_END = len(valid_builder().header())
# Where the tokens entry starts: after magic, version, the two counts and two entries.
TOKENS_KV = 24 + sum(len(k) for k in valid_builder().kvs[:2])

# name -> (file bytes, regex the message must match)
CORPUS: dict[str, tuple[bytes, str]] = {
    "empty": (b"", "magic"),
    "bad_magic": (b"GGUX" + VALID[4:], "not a GGUF file"),
    "gguf_lowercase_magic": (b"gguf" + VALID[4:], "not a GGUF file"),
    "version_1": (_edit(lambda b: setattr(b, "version", 1)), "version 1 is not supported"),
    "version_4": (_edit(lambda b: setattr(b, "version", 4)), "version 4 is not supported"),
    "version_max": (_edit(lambda b: setattr(b, "version", 0xFFFFFFFF)), "not supported"),
    "version_big_endian": (_edit(lambda b: setattr(b, "version", 3 << 24)), "big-endian"),
    "kv_count_2_63": (_edit(lambda b: setattr(b, "num_kv", HUGE)), "metadata entries"),
    "kv_count_2_64_minus_1": (_edit(lambda b: setattr(b, "num_kv", 2**64 - 1)), "entries"),
    "tensor_count_2_63": (_edit(lambda b: setattr(b, "num_tensors", HUGE)), "tensors"),
    "kv_count_past_end": (
        _header_only(kv_string("a", "x"), kv_string("b", "y"), num_kv=3),
        "remain|left",
    ),
    "tensor_count_past_end": (
        Builder(tensors=[tensor_info("x", [4], 0, 0)], num_tensors=2).header(),
        "remain|left",
    ),
    "key_length_2_63": (_header_only(string("k", length=HUGE) + u32(T.UINT8) + b"\0"), "2^|long"),
    "key_length_past_end": (
        _header_only(string("key", length=13) + u32(T.UINT8) + b"\0"),
        "remain",
    ),
    "key_too_long": (_header_only(kv_string("k" * 70_000, "v")), "long"),
    "key_empty": (_header_only(kv_string("", "v")), "empty metadata key"),
    "string_length_2_63": (_header_only(kv("k", T.STRING, string("abc", length=HUGE))), "remain"),
    "string_length_past_end": (_header_only(kv("k", T.STRING, string("abc", length=4))), "remain"),
    "array_length_2_63": (_header_only(kv("k", T.ARRAY, array(T.UINT8, [], count=HUGE))), "claims"),
    "array_length_2_64_minus_1_u64": (
        _header_only(kv("k", T.ARRAY, array(T.UINT64, [], count=2**64 - 1))),
        "claims",
    ),
    "string_array_length_2_63": (
        _header_only(kv("k", T.ARRAY, array(T.STRING, [string("a")], count=HUGE))),
        "claims",
    ),
    "array_of_arrays_length_2_63": (
        _header_only(kv("k", T.ARRAY, array(T.ARRAY, [], count=HUGE))),
        "claims",
    ),
    "array_length_past_end": (
        _header_only(kv("k", T.ARRAY, array(T.UINT32, [scalar(T.UINT32, 1)] * 3, count=4))),
        "claims",
    ),
    "string_array_item_past_end": (
        _header_only(kv("k", T.ARRAY, array(T.STRING, [string("a"), string("bc", length=9)]))),
        "remain",
    ),
    "nested_arrays_deep": (_header_only(kv("k", T.ARRAY, _nested(1000))), "nested deeper"),
    "nested_arrays_huge_inner": (
        _header_only(kv("k", T.ARRAY, u32(T.ARRAY) + u64(1) + u32(T.UINT8) + u64(HUGE))),
        "claims",
    ),
    "unknown_value_type": (
        _header_only(kv("k", 13, b"\0" * 8)),
        "metadata .k.: unknown value type 13",
    ),
    "unknown_array_item_type": (
        _header_only(kv("k", T.ARRAY, array(0xFFFFFFFF, []))),
        "unknown array item type",
    ),
    "bool_not_0_or_1": (_header_only(kv("k", T.BOOL, b"\x02")), "bool"),
    "bool_array_not_0_or_1": (
        _header_only(kv("k", T.ARRAY, array(T.BOOL, [b"\x01", b"\x07"]))),
        "bool",
    ),
    "alignment_0": (_with_kv_replaced(1, kv_scalar("general.alignment", T.UINT32, 0)), "power"),
    "alignment_3": (_with_kv_replaced(1, kv_scalar("general.alignment", T.UINT32, 3)), "power"),
    "alignment_2_40": (
        _with_kv_replaced(1, kv_scalar("general.alignment", T.UINT64, 2**40)),
        "power of two from 1",
    ),
    "alignment_string": (_with_kv_replaced(1, kv_string("general.alignment", "32")), "integer"),
    "alignment_float": (
        _with_kv_replaced(1, kv_scalar("general.alignment", T.FLOAT32, 32.0)),
        "integer",
    ),
    "alignment_bool": (_with_kv_replaced(1, kv_scalar("general.alignment", T.BOOL, 1)), "integer"),
    "duplicate_key": (_with_kv(kv_string("general.architecture", "gemma3")), "duplicate metadata"),
    "invalid_utf8_key": (_with_kv(kv(b"general.\xff\xfe", T.UINT8, b"\0")), "UTF-8"),
    "invalid_utf8_tensor_name": (_with_tensor(1, tensor_info(b"b\xc3(", [32], 8, 64)), "UTF-8"),
    "tensor_outside_file": (_with_tensor(1, tensor_info("b", [32], 8, 1 << 20)), "file ends"),
    "tensor_offset_2_64": (
        _with_tensor(1, tensor_info("b", [32], 8, 2**64 - 32)),
        "file ends",
    ),
    "tensor_too_big": (_with_tensor(1, tensor_info("b", [2**40], 0, 64)), "file ends"),
    "tensors_overlap": (_with_tensor(1, tensor_info("b", [32], 8, 32)), "overlaps"),
    "tensor_misaligned": (_with_tensor(1, tensor_info("b", [32], 8, 65)), "not a multiple of 32"),
    "tensor_unknown_type_4": (_with_tensor(1, tensor_info("b", [32], 4, 64)), "unknown ggml type"),
    "tensor_unknown_type_max": (
        _with_tensor(1, tensor_info("b", [32], 0xFFFFFFFF, 64)),
        "unknown ggml type",
    ),
    "tensor_zero_dims": (_with_tensor(1, tensor_info("b", [], 0, 64)), "0 dimensions"),
    "tensor_zero_dim": (_with_tensor(1, tensor_info("b", [8, 0], 0, 64)), "zero dimension"),
    "tensor_5_dims": (_with_tensor(1, tensor_info("b", [1] * 5, 0, 64)), "5 dimensions"),
    "tensor_dims_2_32": (_with_tensor(1, tensor_info("b", [2**32] * 4, 0, 64)), "too many"),
    "tensor_elements_2_63": (_with_tensor(1, tensor_info("b", [2**62, 2], 24, 64)), "too many"),
    "tensor_dims_count_2_32": (
        _with_tensor(1, string("b") + u32(0xFFFFFFFF) + u64(1)),
        "dimensions",
    ),
    "tensor_row_not_whole_blocks": (
        _with_tensor(1, tensor_info("b", [33, 1], GGMLType.Q8_0, 64)),
        "multiple of the Q8_0 block size 32",
    ),
    "duplicate_tensor_name": (
        _with_tensor(1, tensor_info("a.weight", [32], 8, 64)),
        "duplicate tensor",
    ),
    "tokens_not_strings": (
        _with_kv_replaced(2, kv_array("tokenizer.ggml.tokens", T.INT32, [1, 2, 3, 4, 5, 6])),
        "tokens must be an array of STRING",
    ),
    "tokens_not_array": (
        _with_kv_replaced(2, kv_string("tokenizer.ggml.tokens", "abc")),
        "tokens must be an array",
    ),
    "scores_wrong_length": (
        _with_kv_replaced(3, kv_array("tokenizer.ggml.scores", T.FLOAT32, [0.0] * 5)),
        "scores has 5 items but there are 6 tokens",
    ),
    "scores_float64": (
        _with_kv_replaced(3, kv_array("tokenizer.ggml.scores", T.FLOAT64, [0.0] * 6)),
        "scores must be an array of FLOAT32",
    ),
    "token_type_uint32": (
        _with_kv_replaced(4, kv_array("tokenizer.ggml.token_type", T.UINT32, [1] * 6)),
        "token_type must be an array of INT32",
    ),
    "token_type_wrong_length": (
        _with_kv_replaced(4, kv_array("tokenizer.ggml.token_type", T.INT32, [1] * 7)),
        "7 items",
    ),
    "merges_not_strings": (
        _with_kv_replaced(5, kv_array("tokenizer.ggml.merges", T.UINT8, [1])),
        "merges must be an array of STRING",
    ),
    "token_id_past_vocab": (
        _with_kv_replaced(6, kv_scalar("tokenizer.ggml.bos_token_id", T.UINT32, 6)),
        "outside the vocabulary",
    ),
    "token_id_negative": (
        _with_kv_replaced(6, kv_scalar("tokenizer.ggml.bos_token_id", T.INT32, -1)),
        "outside the vocabulary",
    ),
    "token_id_string": (
        _with_kv_replaced(6, kv_string("tokenizer.ggml.bos_token_id", "1")),
        "must be an integer",
    ),
    "token_id_float": (
        _with_kv_replaced(7, kv_scalar("tokenizer.ggml.eos_token_id", T.FLOAT32, 2.0)),
        "must be an integer",
    ),
    "truncated_magic": (VALID[:2], "magic"),
    "truncated_version": (VALID[:6], "version"),
    "truncated_counts": (VALID[:14], "tensor count"),
    "truncated_key": (_header_only(kv_string("general.architecture", "llama"))[:42], "key"),
    "truncated_value": (_header_only(*valid_builder().kvs)[: TOKENS_KV + 40], "tokens"),
    "truncated_tensor_info": (VALID[: HEADER_END - 10], "tensor 'b.weight'"),
    "truncated_before_data": (VALID[:HEADER_END], "file ends"),
    "truncated_data": (VALID[:-1], "file ends"),
}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_crafted_file_is_rejected(name: str) -> None:
    data, match = CORPUS[name]
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(GGUFError, match=match):
            GGUFFile.from_bytes(data)
    finally:
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert elapsed < MAX_SECONDS
    assert peak < MAX_PEAK_BYTES


def test_base_of_the_corpus_is_valid() -> None:
    f = GGUFFile.from_bytes(VALID)
    assert len(f.tensors) == 2 and len(f.metadata) == 8


# Opens every corpus file from disk (the mmap path) in a child process whose address space is
# capped a little above what it uses after imports, so that any large allocation fails there.
_CHILD = textwrap.dedent(
    """
    import json, resource, sys, time
    from pathlib import Path
    from ember.gguf import GGUFError, GGUFFile

    with open("/proc/self/statm") as f:
        vm_bytes = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (vm_bytes + 256 * 2**20, resource.RLIM_INFINITY))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    results = {}
    for path in sorted(Path(sys.argv[1]).iterdir()):
        start = time.perf_counter()
        try:
            GGUFFile.open(path)
            outcome = "parsed"
        except GGUFError:
            outcome = "GGUFError"
        except BaseException as e:
            outcome = type(e).__name__
        results[path.name] = [outcome, time.perf_counter() - start]
    rss_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    print(json.dumps({"results": results, "rss_growth_kib": rss_growth}))
    """
)


def test_crafted_files_from_disk_under_an_address_space_cap(tmp_path: Path) -> None:
    for name, (data, _) in CORPUS.items():
        (tmp_path / f"{name}.gguf").write_bytes(data)
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=True,
    )
    report = json.loads(out.stdout)
    assert len(report["results"]) == len(CORPUS)
    for name, (outcome, seconds) in report["results"].items():
        # The empty file fails before parsing, when it is mapped: still a GGUFError.
        assert outcome == "GGUFError", name
        assert seconds < MAX_SECONDS, name
    assert report["rss_growth_kib"] * 1024 < MAX_PEAK_BYTES


def test_every_truncation_before_the_last_tensor_byte_is_rejected() -> None:
    f = GGUFFile.from_bytes(VALID)
    data_end = max(t.offset + t.nbytes for t in f.tensors.values())
    assert data_end == len(VALID)
    for cut in range(len(VALID)):
        with pytest.raises(GGUFError):
            GGUFFile.from_bytes(VALID[:cut])
