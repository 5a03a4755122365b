"""DeepSeek V2 and V3 (`deepseek2`) and GLM-4.7-Flash (`glm4moelite`) converted from tiny
random-weight HF models (transformers' own classes): logits equal HF's over a prompt past YaRN's
original positions, incremental decode equals a prefill, two sequences in one batch equal each
alone, a context shift equals a fresh run, and the absorbed layout (`attn_k_b` / `attn_v_b`, the
latent cached: llama.cpp's, and Ollama's for GLM) gives the same logits as the expanded one."""

import pytest
import torch

pytest.importorskip("transformers")

from gguf_copy import absorbed_layout
from hf_families import convert_family, save_family
from test_dense_families import OTHER, PROMPT, run, run_both, shift_error
from tinymodels import hf_logits

from ember.convert import convert_directory
from ember.gguf import GGUFFile
from ember.model import load_model

FAMILIES = ("deepseek-v2", "deepseek-v3", "glm4-moe-lite")
ARCH = {"deepseek-v2": "deepseek2", "deepseek-v3": "deepseek2", "glm4-moe-lite": "glm4moelite"}
SIGMOIDS = {"deepseek-v2": 1, "deepseek-v3": 2, "glm4-moe-lite": 2}
LONG = PROMPT + OTHER + PROMPT  # 51 tokens: past YaRN's original 32 positions
HEADS, NOPE, VALUE, LORA = 4, 16, 16, 32


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return {f: convert_family(f, tmp_path_factory.mktemp(f)) for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_transformers(converted, family):
    path, hf = converted[family]
    arch = ARCH[family]
    with GGUFFile.open(path) as f:
        assert f.metadata["general.architecture"] == arch
        assert f.metadata[f"{arch}.expert_gating_func"] == SIGMOIDS[family]
    logits = run(load_model(GGUFFile.open(path)), [LONG[:20], LONG[20:]])
    assert (logits - hf_logits(hf, LONG)).abs().max() < 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_incremental_decode_equals_prefill(converted, family):
    model = load_model(GGUFFile.open(converted[family][0]))
    full = run(model, [PROMPT])
    assert (run(model, [PROMPT[:5]] + [[t] for t in PROMPT[5:]]) - full).abs().max() < 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_two_sequences_in_one_batch_equal_each_alone(converted, family):
    model = load_model(GGUFFile.open(converted[family][0]))
    alone = torch.cat([run(model, [PROMPT]), run(model, [OTHER])])
    assert (run_both(model) - alone).abs().max() < 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_context_shift_equals_a_fresh_run_over_kept_tokens(family, tmp_path):
    save_family(family, tmp_path / "hf", num_hidden_layers=1)  # one layer: keys of own tokens
    convert_directory(tmp_path / "hf", tmp_path / "model.gguf")
    assert shift_error(load_model(GGUFFile.open(tmp_path / "model.gguf"))) < 1e-4


@pytest.mark.parametrize("family", FAMILIES[:2])
def test_llama_cpps_absorbed_layout_gives_the_same_logits(converted, family, tmp_path):
    path, hf = converted[family]
    absorbed_layout(path, tmp_path / "mla.gguf", heads=HEADS, nope=NOPE, value=VALUE, lora=LORA)
    model = load_model(GGUFFile.open(tmp_path / "mla.gguf"))
    assert model.options.is_mla
    steps = [LONG[:20], *[[t] for t in LONG[20:30]], LONG[30:]]  # a prompt, decode, a prompt
    assert (run(model, steps) - hf_logits(hf, LONG)).abs().max() < 1e-4
