"""Whether a model file's own vision tower is one Ember runs (the server decides without
importing the models): Ollama's single-file convention puts `{arch}.vision.*` beside the text
model, and files of families whose vision Ember lacks (Gemma 3n's, Nemotron-H's, LFM2's) still
hold it: those serve text, and say so by not listing vision."""

from collections.abc import Mapping
from typing import Any

# the architectures whose single-file vision ember/model/archs builds (gemma3_vision.py,
# gemma4_vision.py, mistral3.py, qwen25vl.py, qwen3vl.py, qwen35.py, mllama.py);
# tests/server/test_vision_archs.py checks it
VISION_ARCHS = frozenset({"gemma3", "gemma4", "mistral3", "qwen25vl", "qwen2vl", "qwen3vl",
                          "qwen3vlmoe", "qwen35", "qwen35moe", "mllama"})  # fmt: skip


def runs_vision(metadata: Mapping[str, Any]) -> bool:
    arch = metadata.get("general.architecture", "")
    return arch in VISION_ARCHS and f"{arch}.vision.block_count" in metadata
