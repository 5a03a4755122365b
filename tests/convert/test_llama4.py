"""Llama 4 (text) converted from a tiny random-weight HF Llama4ForCausalLM: MoE layers (8
experts, top-2, a shared expert) between dense ones, a NoPE layer with temperature tuning
after chunked RoPE layers with QK-norm and llama 3 scaling, and prompts longer than the chunk.
Logits equal HF's, decode equals a prefill, a batch equals its sequences alone, tokens spread
over the experts with only the routed ones read; the text part of a
Llama4ForConditionalGeneration converts the same."""

import json

import pytest
import torch

pytest.importorskip("transformers")

from hf_families import convert_family, save_family
from safetensors.torch import load_file, save_file
from test_dense_families import OTHER, PROMPT, run, run_both, shift_error
from test_qwen3moe import check_routing, spy_on_experts  # top-2, as qwen3moe
from tinymodels import hf_logits

from ember.convert import ConvertError, convert_directory
from ember.convert.llama import llama3_rope_factors
from ember.convert.source import HFConfig
from ember.gguf import GGUFFile
from ember.model import load_model
from ember.model.archs.llama4 import Llama4, Mixture

EXPERTS, EXPERT_FFN, MLP_FFN, HIDDEN, CHUNK = 8, 32, 128, 64, 8
LONG = PROMPT + OTHER  # 31 tokens: four chunks of 8


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama4")
    return *convert_family("llama4", root), root / "hf"


@pytest.fixture(scope="module")
def model(converted) -> Llama4:
    loaded = load_model(GGUFFile.open(converted[0]))
    assert isinstance(loaded, Llama4)
    return loaded


def test_the_file_carries_llama_cpp_names_and_ollamas_keys(converted, model):
    with GGUFFile.open(converted[0]) as f:
        meta, tensors = f.metadata, f.tensors
    assert meta["general.architecture"] == "llama4"
    assert meta["llama4.feed_forward_length"] == MLP_FFN
    assert meta["llama4.expert_feed_forward_length"] == EXPERT_FFN
    assert meta["llama4.interleave_moe_layer_step"] == 2
    assert meta["llama4.attention.chunk_size"] == CHUNK
    assert tensors["rope_freqs.weight"].shape == (8,)
    assert tensors["blk.0.ffn_gate.weight"].shape == (MLP_FFN, HIDDEN)  # dense
    assert "blk.0.ffn_gate_exps.weight" not in tensors
    assert tensors["blk.1.ffn_gate_inp.weight"].shape == (EXPERTS, HIDDEN)
    assert tensors["blk.1.ffn_gate_exps.weight"].shape == (EXPERTS, EXPERT_FFN, HIDDEN)
    assert tensors["blk.1.ffn_down_exps.weight"].shape == (EXPERTS, HIDDEN, EXPERT_FFN)
    assert tensors["blk.3.ffn_up_shexp.weight"].shape == (EXPERT_FFN, HIDDEN)
    o = model.options
    assert [o.uses_rope(i) for i in range(4)] == [True, True, True, False]
    assert [o.is_moe(i) for i in range(4)] == [False, True, False, True]
    assert o.temperatures(torch.tensor(LONG)).max() > 1.5  # the NoPE layer's scale matters


def test_logits_equal_transformers(converted, model):
    assert (run(model, [LONG]) - hf_logits(converted[1], LONG)).abs().max() < 1e-4


def test_incremental_decode_equals_prefill(model):
    full = run(model, [LONG])
    assert (run(model, [LONG[:5]] + [[t] for t in LONG[5:]]) - full).abs().max() < 1e-4


def test_two_sequences_in_one_batch_equal_each_alone(converted, model):
    both = run_both(model)
    alone = torch.cat([run(model, [PROMPT]), run(model, [OTHER])])
    assert (both - alone).abs().max() < 1e-4
    hf = torch.cat([hf_logits(converted[1], PROMPT), hf_logits(converted[1], OTHER)])
    assert (both - hf).abs().max() < 1e-4


def test_a_batch_spreads_over_the_experts_and_decode_reads_only_the_routed_ones(converted):
    model = load_model(GGUFFile.open(converted[0]))
    mixtures = [b.ffn for b in model.blocks if isinstance(b.ffn, Mixture)]
    assert len(mixtures) == 2
    check_routing(model, spy_on_experts(m.experts for m in mixtures))


@pytest.mark.parametrize("no_rope_interval", [1, 4])
def test_context_shift_equals_a_fresh_run_over_kept_tokens(tmp_path, no_rope_interval):
    """One layer, NoPE (its keys stay put) or chunked RoPE (its keys re-rotate)."""
    save_family("llama4", tmp_path / "hf", num_hidden_layers=1, interleave_moe_layer_step=1,
                no_rope_layer_interval=no_rope_interval)  # fmt: skip
    convert_directory(tmp_path / "hf", tmp_path / "model.gguf")
    assert shift_error(load_model(GGUFFile.open(tmp_path / "model.gguf"))) < 1e-4


def test_the_text_of_a_conditional_generation_checkpoint_converts_the_same(converted, tmp_path):
    """Llama4ForConditionalGeneration: the text under `language_model.` (and its config under
    text_config), the vision tower and projector left out."""
    _, hf, directory = converted
    weights = load_file(directory / "model.safetensors")
    weights = {"language_model." + name: tensor for name, tensor in weights.items()}
    weights["vision_model.patch_embedding.linear.weight"] = torch.zeros(4, 4)
    weights["multi_modal_projector.linear_1.weight"] = torch.zeros(4, 4)
    save_file(weights, tmp_path / "model.safetensors")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((directory / name).read_bytes())
    text = json.loads((directory / "config.json").read_text())
    config = {"architectures": ["Llama4ForConditionalGeneration"], "text_config": text}
    (tmp_path / "config.json").write_text(json.dumps(config))
    convert_directory(tmp_path, tmp_path / "model.gguf")
    with GGUFFile.open(tmp_path / "model.gguf") as f:
        assert not any(n.startswith(("v.", "mm.")) for n in f.tensors)
    loaded = load_model(GGUFFile.open(tmp_path / "model.gguf"))
    assert (run(loaded, [LONG]) - hf_logits(hf, LONG)).abs().max() < 1e-4


def test_layer_patterns_ollama_cannot_place_are_refused_before_writing(converted, tmp_path):
    directory = converted[2]
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((directory / name).read_bytes())
    config = json.loads((directory / "config.json").read_text())
    for change, message in [({"moe_layers": [0, 1]}, "moe_layers"),
                            ({"no_rope_layers": [0, 1, 1, 1]}, "no_rope_layers"),
                            ({"attention_chunk_size": None}, "attention_chunk_size")]:  # fmt: skip
        (tmp_path / "config.json").write_text(json.dumps(config | change))
        with pytest.raises(ConvertError, match=message):
            convert_directory(tmp_path, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


def test_llama3_rope_factors_with_equal_low_and_high_factors_equal_transformers():
    """Llama 4 Scout's scaling: low_freq_factor = high_freq_factor = 1 (no blended band)."""
    from transformers import Llama4TextConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0, "low_freq_factor": 1.0,
            "high_freq_factor": 1.0, "original_max_position_embeddings": 8192}  # fmt: skip
    config = Llama4TextConfig(head_dim=128, rope_parameters=rope)
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](config)
    base = 1.0 / (500000.0 ** (torch.arange(0, 128, 2, dtype=torch.float32) / 128))
    factors = llama3_rope_factors(HFConfig(rope, "rope"), 128)
    assert torch.allclose(base / factors, inv_freq, rtol=1e-6)
    assert set(factors.tolist()) == {1.0, 16.0}
