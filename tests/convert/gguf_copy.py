"""Copies of a GGUF with keys renamed or dropped and tensors replaced, for tests that need a file
as another writer (llama.cpp, Ollama) lays it out."""

import gguf
import numpy as np


def read_gguf(path) -> tuple[gguf.GGUFReader, dict[str, np.ndarray]]:
    reader = gguf.GGUFReader(path)
    tensors = {}
    for t in reader.tensors:  # float ones in their shape; blocks as gguf-py gives their bytes
        data = np.array(t.data)
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            data = data.reshape(tuple(int(n) for n in reversed(t.shape)))
        tensors[t.name] = data
    return reader, tensors


def write_gguf(
    reader, out, arch: str, tensors: dict, *, drop=(), prefix="gpt-oss.", extra=None
) -> None:
    """A GGUF of `reader`'s keys (those in `drop` left out, `gpt-oss.` renamed `arch.`) and
    `tensors`: name -> float array, or (bytes, their GGML type); `extra`: keys added (an
    int as uint32, a list as an array)."""
    writer = gguf.GGUFWriter(out, arch)
    for field in reader.fields.values():
        name = field.name
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop:
            continue
        key = arch + "." + name.removeprefix(prefix) if name.startswith(prefix) else name
        writer.add_key_value(key, field.contents(), field.types[0], field.types[-1])
    for key, value in (extra or {}).items():
        if isinstance(value, int):
            writer.add_uint32(key, value)
        else:
            writer.add_array(key, value)
    for name, value in tensors.items():
        data, raw = value if isinstance(value, tuple) else (value, None)
        writer.add_tensor(name, data, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def absorbed_layout(path, out, *, heads: int, nope: int, value: int, lora: int) -> None:
    """llama.cpp's layout of a `deepseek2` file that has Ollama's: each attn_kv_b (float32)
    split into attn_k_b (per head, lora x nope: transposed) and attn_v_b (value x lora)."""
    reader, tensors = read_gguf(path)
    for name in [n for n in tensors if n.endswith("attn_kv_b.weight")]:
        kv_b = tensors.pop(name).reshape(heads, nope + value, lora)
        k_b = kv_b[:, :nope].transpose(0, 2, 1)
        tensors[name.replace("kv_b", "k_b")] = np.ascontiguousarray(k_b)
        tensors[name.replace("kv_b", "v_b")] = np.ascontiguousarray(kv_b[:, nope:])
    write_gguf(reader, out, "deepseek2", tensors, prefix="deepseek2.")
