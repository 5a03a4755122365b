"""Gemma 4 (text) converted from tiny random-weight HF Gemma4ForCausalLM models: sliding and full
layers with their own head sizes and KV heads, keys as values, proportional RoPE, layers that read
earlier layers' keys, per-layer embeddings, softcapped logits; and the mixture layers beside a
dense MLP. Logits equal HF's over a prompt past the window, whole or token by token; two sequences
in one batch equal each alone."""

import pytest
import torch

pytest.importorskip("transformers")

from hf_families import convert_family, convert_multimodal, save_family
from test_dense_families import OTHER, PROMPT, batch_error, run, shift_error, stepped_error
from tinymodels import hf_logits

from ember.convert import convert_directory
from ember.gguf import GGUFFile
from ember.model import load_model

LONG = PROMPT + OTHER + PROMPT  # 51 tokens


@pytest.fixture(scope="module", params=["gemma4", "gemma4-moe"])
def converted(request, tmp_path_factory):
    return convert_family(request.param, tmp_path_factory.mktemp(request.param))


def test_the_file_holds_ollamas_keys(converted):
    with GGUFFile.open(converted[0]) as f:
        md, names = f.metadata, set(f.tensors)
    assert md["general.architecture"] == "gemma4"
    assert md["gemma4.attention.key_length"] == 32 and md["gemma4.attention.key_length_swa"] == 16
    assert "rope_freqs.weight" in names and "blk.0.layer_output_scale.weight" in names
    if md["gemma4.block_count"] == 5:
        assert md["gemma4.attention.head_count_kv"] == [2, 1, 2, 2, 1]
        assert md["gemma4.attention.shared_kv_layers"] == 2
        assert md["gemma4.embedding_length_per_layer_input"] == 8
        assert md["gemma4.final_logit_softcapping"] == 30.0
        assert "blk.1.attn_v.weight" not in names and "blk.3.attn_k.weight" not in names
    else:
        assert md["gemma4.feed_forward_length"] == [128, 128, 128, 256]
        assert md["gemma4.expert_count"] == 8 and "blk.0.ffn_gate_up_exps.weight" in names


def test_logits_equal_transformers(converted):
    path, hf = converted
    assert stepped_error(load_model(GGUFFile.open(path)), hf_logits(hf, LONG), LONG) < 1e-4


def test_two_sequences_in_one_batch_equal_each_alone(converted):
    assert batch_error(load_model(GGUFFile.open(converted[0]))) < 1e-4


def test_context_shift_rerotates_the_proportional_keys(tmp_path):
    """One full layer (a deeper stack mixes dropped tokens into the kept keys)."""
    save_family("gemma4", tmp_path / "hf", num_hidden_layers=1, num_kv_shared_layers=0,
                layer_types=["full_attention"])  # fmt: skip
    convert_directory(tmp_path / "hf", tmp_path / "model.gguf")
    assert shift_error(load_model(GGUFFile.open(tmp_path / "model.gguf"))) < 1e-4


def test_the_text_model_of_a_multimodal_checkpoint_converts(tmp_path):
    """Gemma4ForConditionalGeneration: its text answers as HF's beside its tower (whose image
    tokens this vocabulary lacks: images then go in without their start and end tokens, as
    Ollama's engine puts them)."""
    text = {
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "global_head_dim": 32, "sliding_window": 6,
        "layer_types": ["sliding_attention", "full_attention"],
        "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 299,
    }  # fmt: skip
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
              "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16}  # fmt: skip
    path, hf = convert_multimodal(tmp_path, "Gemma4", text, vision, audio_config=None)
    with GGUFFile.open(path) as f:
        assert {"v.patch_embd.weight", "mm.input_projection.weight"} <= set(f.tensors)
    model = load_model(GGUFFile.open(path))
    ids = torch.tensor([LONG])
    expected = hf(input_ids=ids, use_cache=False).logits[0].float()
    assert (run(model, [LONG]) - expected).abs().max() < 1e-4
