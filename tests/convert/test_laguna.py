"""Laguna converted from a tiny random-weight HF LagunaForCausalLM (per-layer head counts,
per-head gates, sliding and full layers with their own partial RoPE, YaRN on the full ones,
routed and shared experts): logits equal HF's over a prompt past the window and YaRN's original
positions, whole or token by token; two sequences in one batch equal each alone."""

import pytest

pytest.importorskip("transformers")

from hf_families import convert_family
from test_dense_families import OTHER, PROMPT, batch_error, stepped_error
from tinymodels import hf_logits

from ember.gguf import GGUFFile
from ember.model import load_model

LONG = PROMPT + OTHER + PROMPT  # 51 tokens


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return convert_family("laguna", tmp_path_factory.mktemp("laguna"))


def test_the_file_holds_ollamas_keys(converted):
    with GGUFFile.open(converted[0]) as f:
        md = f.metadata
    assert md["general.architecture"] == "laguna"
    assert md["laguna.attention.head_count"] == [4, 8, 4, 8]
    assert md["laguna.attention.sliding_window_pattern"] == [True, False, True, False]
    assert md["laguna.rope.dimension_count"] == 8 and md["laguna.rope.swa.dimension_count"] == 16
    assert md["laguna.dense_layers"] == [0] and md["laguna.rope.scaling.beta_fast"] == 64.0


def test_logits_equal_transformers(converted):
    path, hf = converted
    assert stepped_error(load_model(GGUFFile.open(path)), hf_logits(hf, LONG), LONG) < 1e-4


def test_two_sequences_in_one_batch_equal_each_alone(converted):
    assert batch_error(load_model(GGUFFile.open(converted[0]))) < 1e-4
