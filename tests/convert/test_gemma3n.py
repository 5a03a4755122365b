"""Gemma 3n (text) converted from a tiny random-weight HF Gemma3nForCausalLM (AltUp's four
streams, LAuReL, per-layer embeddings with a table shorter than the vocabulary, sparsified MLP
gates, layers of two widths, sliding and full layers, two layers reading earlier layers' keys,
softcapped logits): logits equal HF's over a prompt past the window, whole or token by token;
two sequences in one batch equal each alone; a context shift equals a fresh run."""

import pytest

pytest.importorskip("transformers")

from hf_families import convert_family, save_family
from test_dense_families import PROMPT, batch_error, shift_error, stepped_error
from tinymodels import hf_logits

from ember.convert import convert_directory
from ember.gguf import GGUFFile
from ember.model import load_model

LONG = [*PROMPT, 250, 200, 150, *PROMPT, *PROMPT]  # 51 tokens, some past the per-layer table


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return convert_family("gemma3n", tmp_path_factory.mktemp("gemma3n"))


def test_the_file_holds_ollamas_keys(converted):
    with GGUFFile.open(converted[0]) as f:
        md, names = f.metadata, set(f.tensors)
    assert md["general.architecture"] == "gemma3n"
    assert md["gemma3n.altup.num_inputs"] == 4 and md["gemma3n.attention.shared_kv_layers"] == 2
    assert md["gemma3n.feed_forward_length"] == [128, 96] * 3
    assert abs(md["gemma3n.activation_sparsity_scale"][0] - 1.6448536) < 1e-5
    assert "altup_proj.weight" in names and "blk.5.attn_k.weight" not in names


def test_logits_equal_transformers(converted):
    path, hf = converted
    assert stepped_error(load_model(GGUFFile.open(path)), hf_logits(hf, LONG), LONG) < 1e-4


def test_two_sequences_in_one_batch_equal_each_alone(converted):
    assert batch_error(load_model(GGUFFile.open(converted[0]))) < 1e-4


def test_context_shift_equals_a_fresh_run(tmp_path):
    """One full layer (a deeper stack mixes dropped tokens into the kept keys)."""
    save_family("gemma3n", tmp_path / "hf", num_hidden_layers=1, num_kv_shared_layers=0,
                layer_types=["full_attention"], intermediate_size=[128],
                activation_sparsity_pattern=[0.95])  # fmt: skip
    convert_directory(tmp_path / "hf", tmp_path / "model.gguf")
    assert shift_error(load_model(GGUFFile.open(tmp_path / "model.gguf"))) < 1e-4
