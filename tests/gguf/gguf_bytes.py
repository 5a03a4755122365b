"""GGUF files for tests: a byte-level builder (struct.pack) for crafted valid or broken files,
and a reference file written by gguf-py's GGUFWriter.
"""

import struct
from dataclasses import dataclass, field

import gguf
import numpy as np

from ember.gguf.types import GGMLType, GGUFValueType

T = GGUFValueType

_FORMATS = {
    T.UINT8: "<B",
    T.INT8: "<b",
    T.UINT16: "<H",
    T.INT16: "<h",
    T.UINT32: "<I",
    T.INT32: "<i",
    T.FLOAT32: "<f",
    T.BOOL: "<B",
    T.UINT64: "<Q",
    T.INT64: "<q",
    T.FLOAT64: "<d",
}


def u32(value: int) -> bytes:
    return struct.pack("<I", value)


def u64(value: int) -> bytes:
    return struct.pack("<Q", value)


def string(text: str | bytes, *, length: int | None = None) -> bytes:
    """A GGUF string; `length` overrides the stored length (to lie about it)."""
    data = text.encode() if isinstance(text, str) else text
    return u64(len(data) if length is None else length) + data


def scalar(vtype: GGUFValueType, value: int | float) -> bytes:
    return struct.pack(_FORMATS[vtype], value)


def array(item_type: int, items: list[bytes], *, count: int | None = None) -> bytes:
    """An array body (item type, count, items), each item already encoded without its type."""
    return u32(item_type) + u64(len(items) if count is None else count) + b"".join(items)


def kv(key: str | bytes, vtype: int, body: bytes) -> bytes:
    return string(key) + u32(vtype) + body


def kv_scalar(key: str, vtype: GGUFValueType, value: int | float) -> bytes:
    return kv(key, vtype, scalar(vtype, value))


def kv_string(key: str, value: str | bytes) -> bytes:
    return kv(key, T.STRING, string(value))


def kv_array(key: str, item_type: GGUFValueType, values: list) -> bytes:
    if item_type == T.STRING:
        items = [string(v) for v in values]
    else:
        items = [scalar(item_type, v) for v in values]
    return kv(key, T.ARRAY, array(item_type, items))


def tensor_info(name: str | bytes, ne: list[int], ggml_type: int, offset: int) -> bytes:
    """A tensor record; `ne` in ggml order (innermost first)."""
    dims = b"".join(u64(d) for d in ne)
    return string(name) + u32(len(ne)) + dims + u32(ggml_type) + u64(offset)


@dataclass
class Builder:
    """Assembles a file; counts default to the true ones, and every field can be overridden."""

    kvs: list[bytes] = field(default_factory=list)
    tensors: list[bytes] = field(default_factory=list)
    data: bytes = b""
    magic: bytes = b"GGUF"
    version: int = 3
    num_kv: int | None = None
    num_tensors: int | None = None
    alignment: int = 32

    def header(self) -> bytes:
        num_tensors = len(self.tensors) if self.num_tensors is None else self.num_tensors
        num_kv = len(self.kvs) if self.num_kv is None else self.num_kv
        head = self.magic + u32(self.version) + u64(num_tensors) + u64(num_kv)
        return head + b"".join(self.kvs) + b"".join(self.tensors)

    def build(self) -> bytes:
        head = self.header()
        padding = b"\0" * (-len(head) % self.alignment)
        return head + padding + self.data


VOCAB = ["<unk>", "<s>", "</s>", "a", "b", "ab"]


def valid_builder() -> Builder:
    """A small valid file: vocabulary, alignment 32, an F32 (2, 8) and a Q8_0 (1, 32) tensor."""
    kvs = [
        kv_string("general.architecture", "llama"),
        kv_scalar("general.alignment", T.UINT32, 32),
        kv_array("tokenizer.ggml.tokens", T.STRING, VOCAB),
        kv_array("tokenizer.ggml.scores", T.FLOAT32, [0.0, -1.0, -2.0, -3.0, -4.0, -5.0]),
        kv_array("tokenizer.ggml.token_type", T.INT32, [2, 3, 3, 1, 1, 1]),
        kv_array("tokenizer.ggml.merges", T.STRING, ["a b"]),
        kv_scalar("tokenizer.ggml.bos_token_id", T.UINT32, 1),
        kv_scalar("tokenizer.ggml.eos_token_id", T.UINT32, 2),
    ]
    tensors = [
        tensor_info("a.weight", [8, 2], GGMLType.F32, 0),  # 64 bytes
        tensor_info("b.weight", [32, 1], GGMLType.Q8_0, 64),  # 34 bytes
    ]
    data = bytes(range(64)) + bytes(range(100, 134))
    return Builder(kvs=kvs, tensors=tensors, data=data)


def write_with_gguf_py(path: str, *, alignment: int | None = None) -> None:
    """A valid file written by gguf-py's GGUFWriter: every value type and several tensor types."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4_000_000_000)
    w.add_int32("test.i32", -2_000_000_000)
    w.add_uint64("test.u64", 2**64 - 1)
    w.add_int64("test.i64", -(2**63))
    w.add_float32("test.f32", 0.1)
    w.add_float64("test.f64", 0.1)
    w.add_bool("test.true", True)
    w.add_bool("test.false", False)
    w.add_string("test.str", "héllo ✓ 日本")
    for item_type, values in [
        (T.UINT8, [1, 2, 255]),
        (T.INT8, [-128, 127]),
        (T.UINT16, [65535]),
        (T.INT16, [-32768, 5]),
        (T.UINT32, [2**32 - 1, 0]),
        (T.INT32, [-(2**31), 7]),
        (T.UINT64, [2**64 - 1]),
        (T.INT64, [-(2**63), 1]),
        (T.FLOAT32, [0.1, -2.5]),
        (T.FLOAT64, [0.1, 1e300]),
        (T.BOOL, [True, False, True]),
        (T.STRING, ["x", "", "日本"]),
    ]:
        w.add_key_value(f"test.arr_{item_type.name.lower()}", values, T.ARRAY, sub_type=item_type)
    w.add_array("test.nested", [[1, 2], [3]])
    w.add_token_list(VOCAB)
    w.add_token_scores([0.0, -1.0, -2.0, -3.0, -4.0, -5.5])
    w.add_token_types([2, 3, 3, 1, 1, 1])
    w.add_token_merges(["a b"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_tensor("f32.weight", rng.standard_normal((3, 5), dtype=np.float32))
    w.add_tensor("f16.weight", rng.standard_normal((4, 8)).astype(np.float16))
    w.add_tensor("i32.weight", np.arange(7, dtype=np.int32))
    w.add_tensor("f32_4d.weight", rng.standard_normal((1, 2, 3, 4), dtype=np.float32))
    for name, ggml_type, byte_shape in [
        ("q8_0.weight", GGMLType.Q8_0, (2, 68)),
        ("q4_k.weight", GGMLType.Q4_K, (1, 144)),
        ("q6_k.weight", GGMLType.Q6_K, (2, 210)),
        ("bf16.weight", GGMLType.BF16, (2, 3, 8)),
    ]:
        raw = rng.integers(0, 256, byte_shape, dtype=np.uint8)
        w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType(ggml_type))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
