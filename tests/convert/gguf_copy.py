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
