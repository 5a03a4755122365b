"""What the GGUF reader must do with any bytes, for the coverage-guided fuzz (fuzz_gguf_reader.py)
and the replay of its corpus: parse them, or raise GGUFError; nothing else, ever."""

from ember.gguf import GGUFError, GGUFFile


def read_any(data: bytes) -> None:
    """Parses data; a GGUFError is a good answer, any other exception escapes (a crash)."""
    try:
        f = GGUFFile.from_bytes(data)
    except GGUFError:
        return
    for info in f.tensors.values():
        view = f.raw(info.name)  # every tensor lies inside the file
        if view.size != info.nbytes or info.offset + info.nbytes > len(data):
            raise AssertionError(f"tensor {info.name!r} reaches past the file")
    for key in f.metadata:
        f.get(key)
