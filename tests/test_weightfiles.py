"""Which safetensors files of a folder are its model, as Ollama's create picks them."""

from pathlib import Path

import pytest

from ember.weightfiles import model_safetensors


@pytest.mark.parametrize(
    ("names", "chosen"),
    [
        (["consolidated.safetensors", "model-00002-of-00002.safetensors",
          "model-00001-of-00002.safetensors"],
         ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]),
        (["consolidated.safetensors", "adapter.safetensors"], ["consolidated.safetensors"]),
        (["weights.safetensors"], ["weights.safetensors"]),  # no Ollama names: every file
        ([], []),
    ],
)  # fmt: skip
def test_model_files_first_then_consolidated_ones(names, chosen):
    assert [p.name for p in model_safetensors(Path(n) for n in names)] == chosen
