"""The load-time reservation's bound on a batch's activations (ember/model/activations.py), from
the file's tensor shapes alone, against the peak torch's profiler measures for a worst-case
batch (every cell seen) of each text family converted from a tiny HF model: dense, sliding
window, softcapped and sink attention, and mixtures of experts."""

import importlib

import pytest

pytest.importorskip("transformers")

from hf_families import FAMILIES, save_family
from memprofile import worst_case_within_bound

from ember.convert import convert_directory
from ember.gguf import GGUFFile
from ember.model import load_model


@pytest.mark.parametrize("family", FAMILIES)
def test_the_bound_holds_a_worst_case_batch(tmp_path, monkeypatch, family):
    # Attention's score blocks shrunk to 64 KiB (from 16 MiB), in the bound as in the paths
    # that block their queries, so that the tiny models' bound is tight enough to fail.
    for module in ("ember.nn.attention", "ember.model.activations"):
        monkeypatch.setattr(importlib.import_module(module), "SCORES_BYTES", 64 << 10)
    save_family(family, tmp_path / "hf")
    convert_directory(tmp_path / "hf", tmp_path / "model.gguf")
    model = load_model(GGUFFile.open(tmp_path / "model.gguf"))
    measured, bound = worst_case_within_bound(model, num_parallel=2, num_ctx=64, num_batch=64)
    assert 0 < measured <= bound
