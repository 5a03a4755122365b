"""Which safetensors files of a Hugging Face folder hold its model, as Ollama's create picks them;
shared by the CLI's upload and the converter (a module of its own: neither imports the other)."""

from collections.abc import Iterable
from pathlib import Path

# model*.safetensors where there are any, else consolidated*.safetensors: Mistral's folders ship
# both, the same weights under two naming schemes
_PREFERRED = ("model", "consolidated")


def model_safetensors(files: Iterable[Path]) -> list[Path]:
    """The files of a folder's *.safetensors that make its model (every one where none of them
    has Ollama's names)."""
    files = sorted(files)
    for prefix in _PREFERRED:
        if chosen := [f for f in files if f.name.startswith(prefix)]:
            return chosen
    return files
