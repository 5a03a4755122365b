"""gpt-oss converted from a tiny random-weight HF GptOssForCausalLM (8 experts, top-2, a
sliding window of 6 on even layers, YaRN, sinks, every bias, SwiGLU clamps reached): logits
equal HF's, decode equals a prefill, a batch equals its sequences alone, and MXFP4 expert stacks
(gguf-py's quantizer) against HF on gguf-py's dequantized weights."""

import copy

import gguf
import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from hf_dirs import _save_bpe
from hf_families import build_family
from test_dense_families import OTHER, PROMPT, run, run_both
from tinymodels import hf_logits, tiny_vocab

from ember.convert import convert_directory
from ember.gguf import GGMLType, GGUFFile
from ember.model import load_model
from ember.model.archs.gptoss import GptOss

LONG = PROMPT + OTHER + PROMPT  # 51 tokens: past YaRN's original 32 positions


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("gptoss")
    hf = build_family("gpt-oss")
    with torch.no_grad():  # larger expert inputs, so the gate and up clamps at 7 take effect
        for layer in hf.model.layers:
            layer.mlp.experts.gate_up_proj.mul_(6.0)
    hf.save_pretrained(root / "hf")
    _save_bpe("qwen2", tiny_vocab("qwen2"), root / "hf")
    convert_directory(root / "hf", root / "model.gguf")
    return root / "model.gguf", hf


@pytest.fixture(scope="module")
def model(converted) -> GptOss:
    loaded = load_model(GGUFFile.open(converted[0]))
    assert isinstance(loaded, GptOss)
    return loaded


def test_the_file_carries_llama_cpp_names(converted):
    with GGUFFile.open(converted[0]) as f:
        meta, tensors = f.metadata, f.tensors
    assert meta["general.architecture"] == "gpt-oss"
    assert meta["gpt-oss.expert_count"] == 8 and meta["gpt-oss.expert_used_count"] == 2
    assert meta["gpt-oss.attention.sliding_window"] == 6
    assert meta["gpt-oss.rope.scaling.type"] == "yarn"
    assert tensors["blk.0.attn_sinks.weight"].shape == (4,)
    assert tensors["blk.0.ffn_gate_exps.weight"].shape == (8, 32, 64)
    assert tensors["blk.0.ffn_down_exps.weight"].shape == (8, 64, 32)
    assert tensors["blk.0.ffn_up_exps.bias"].shape == (8, 32)


def test_the_clamps_are_reached(converted):
    """The SwiGLU limit matters for this model: some gate or up values pass 7."""
    experts = converted[1].model.layers[0].mlp.experts
    inputs: list[torch.Tensor] = []
    hook = experts.register_forward_hook(lambda module, args, out: inputs.append(args[0]))
    hf_logits(converted[1], LONG)
    hook.remove()
    gate_up = inputs[0] @ experts.gate_up_proj + experts.gate_up_proj_bias[:, None]  # (E, T, 2F)
    assert gate_up.abs().max() > 7.0


def test_logits_equal_transformers(converted, model):
    assert (run(model, [LONG]) - hf_logits(converted[1], LONG)).abs().max() < 1e-4


def test_incremental_decode_equals_prefill(model):
    full = run(model, [LONG])
    assert (run(model, [LONG[:5]] + [[t] for t in LONG[5:]]) - full).abs().max() < 1e-4


def test_two_sequences_in_one_batch_equal_each_alone(converted, model):
    both = run_both(model)
    alone = torch.cat([run(model, [PROMPT]), run(model, [OTHER])])
    assert (both - alone).abs().max() < 1e-4


def test_mxfp4_expert_stacks_equal_transformers_on_the_dequantized_weights(converted, tmp_path):
    path, hf = converted
    reader = gguf.GGUFReader(path)
    writer = gguf.GGUFWriter(tmp_path / "mxfp4.gguf", "gpt-oss")
    for field in reader.fields.values():
        if not field.name.startswith("GGUF.") and field.name != "general.architecture":
            writer.add_key_value(field.name, field.contents(), field.types[0], field.types[-1])
    stacks = {}
    for t in reader.tensors:
        data = np.array(t.data).reshape(tuple(int(n) for n in reversed(t.shape)))
        if t.name.endswith("_exps.weight"):
            q = gguf.quants.quantize(data, gguf.GGMLQuantizationType.MXFP4)
            stacks[t.name] = torch.from_numpy(
                gguf.quants.dequantize(q, gguf.GGMLQuantizationType.MXFP4).copy()
            )
            writer.add_tensor(t.name, q, raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        else:
            writer.add_tensor(t.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with GGUFFile.open(tmp_path / "mxfp4.gguf") as f:
        assert f.tensors["blk.1.ffn_down_exps.weight"].ggml_type == GGMLType.MXFP4
    reference = copy.deepcopy(hf)
    with torch.no_grad():
        for i, layer in enumerate(reference.model.layers):
            gate, up, down = (
                stacks[f"blk.{i}.ffn_{n}_exps.weight"] for n in ("gate", "up", "down")
            )
            layer.mlp.experts.gate_up_proj.copy_(torch.stack([gate, up], 2).flatten(1, 2).mT)
            layer.mlp.experts.down_proj.copy_(down.mT)
    quantized = run(load_model(GGUFFile.open(tmp_path / "mxfp4.gguf")), [PROMPT])
    assert (quantized - hf_logits(reference, PROMPT)).abs().max() < 1e-4
