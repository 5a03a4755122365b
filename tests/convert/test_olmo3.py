"""OLMo 3 as the two writers lay it out: Ollama's `olmo3` keys (Ember's converter writes them)
and llama.cpp's, which keep OLMo 3 under `olmo2`; the same model either way."""

import pytest

pytest.importorskip("transformers")

from gguf_copy import read_gguf, write_gguf
from hf_families import convert_family
from test_dense_families import PROMPT, run
from tinymodels import hf_logits

from ember.gguf import GGUFFile
from ember.model import load_model
from ember.model.config import ModelLoadError

LONG = PROMPT + PROMPT + PROMPT  # 60 tokens: past YaRN's original 32 and ten windows of 6


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return convert_family("olmo3", tmp_path_factory.mktemp("olmo3"))


def test_the_converter_writes_ollamas_olmo3_keys(converted):
    with GGUFFile.open(converted[0]) as f:
        m = f.metadata
    assert m["general.architecture"] == "olmo3"
    assert m["olmo3.attention.sliding_window"] == 6
    assert m["olmo3.attention.sliding_window_pattern"] == [True, True, True, False]
    assert m["olmo3.rope.scaling.type"] == "yarn"
    assert m["olmo3.rope.scaling.original_context_length"] == 32


def test_a_long_prompt_equals_transformers(converted):
    path, hf = converted
    logits = run(load_model(GGUFFile.open(path)), [LONG[:40], LONG[40:]])
    assert (logits - hf_logits(hf, LONG)).abs().max() < 1e-4


def test_llama_cpps_olmo2_layout_of_olmo3_runs_the_same(converted, tmp_path):
    path, hf = converted
    reader, tensors = read_gguf(path)
    write_gguf(reader, tmp_path / "olmo2.gguf", "olmo2", tensors, prefix="olmo3.")
    with GGUFFile.open(tmp_path / "olmo2.gguf") as f:
        assert f.metadata["olmo2.attention.sliding_window_pattern"] == [True, True, True, False]
    logits = run(load_model(GGUFFile.open(tmp_path / "olmo2.gguf")), [LONG])
    assert (logits - hf_logits(hf, LONG)).abs().max() < 1e-4


PATTERN = "olmo3.attention.sliding_window_pattern"


def test_without_a_pattern_three_layers_of_four_slide(converted, tmp_path):
    reader, tensors = read_gguf(converted[0])
    write_gguf(reader, tmp_path / "m.gguf", "olmo3", tensors, drop=(PATTERN,), prefix="olmo3.")
    assert load_model(GGUFFile.open(tmp_path / "m.gguf")).options.sliding == (
        True, True, True, False)  # fmt: skip


def test_a_pattern_of_the_wrong_length_is_a_load_error(converted, tmp_path):
    reader, tensors = read_gguf(converted[0])
    write_gguf(reader, tmp_path / "m.gguf", "olmo3", tensors, drop=(PATTERN,), prefix="olmo3.",
               extra={PATTERN: [True, False]})  # fmt: skip
    with pytest.raises(ModelLoadError, match="array of 4 booleans"):
        load_model(GGUFFile.open(tmp_path / "m.gguf"))
