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

from gguf_copy import read_gguf, write_gguf
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
    reader, tensors = read_gguf(path)
    mxfp4, stacks = gguf.GGMLQuantizationType.MXFP4, {}
    for name, data in tensors.items():
        if name.endswith("_exps.weight"):
            q = gguf.quants.quantize(data, mxfp4)
            stacks[name] = torch.from_numpy(gguf.quants.dequantize(q, mxfp4).copy())
            tensors[name] = (q, mxfp4)
    write_gguf(reader, tmp_path / "mxfp4.gguf", "gpt-oss", tensors)
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


def ollama_layout(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The tensors as Ollama's gptoss files name and lay them out."""
    renamed = {"attn_output": "attn_out", "post_attention_norm": "ffn_norm"}
    out = {}
    for name, data in tensors.items():
        if not name.startswith("blk."):
            out[name] = data
            continue
        _, layer, base, kind = name.split(".")
        p = f"blk.{layer}."
        if base == "attn_q":
            out[f"{p}attn_qkv.{kind}"] = np.concatenate(
                [tensors[f"{p}attn_{n}.{kind}"] for n in "qkv"]
            )
        elif base == "ffn_gate_exps":  # rows gate 0, up 0, gate 1, up 1...
            both = np.stack([data, tensors[f"{p}ffn_up_exps.{kind}"]], axis=2)  # (E, F, 2[, C])
            out[f"{p}ffn_gate_up_exps.{kind}"] = both.reshape(data.shape[0], -1, *data.shape[2:])
        elif base == "attn_sinks":
            out[p + "attn_sinks"] = data
        elif base not in ("attn_k", "attn_v", "ffn_up_exps"):
            out[f"{p}{renamed.get(base, base)}.{kind}"] = data
    return out


def test_ollamas_tensor_names_give_the_same_logits(converted, model, tmp_path):
    """Ollama's gptoss files (arch `gptoss`): fused `attn_qkv`, `attn_out`, `attn_sinks`,
    `ffn_norm`, gate and up interleaved in `ffn_gate_up_exps`, YaRN's type and the expert size
    left out. Built here from the converted file by those rules (no real one is at hand)."""
    reader, tensors = read_gguf(converted[0])
    drop = ("gpt-oss.rope.scaling.type", "gpt-oss.expert_feed_forward_length")
    write_gguf(reader, tmp_path / "ollama.gguf", "gptoss", ollama_layout(tensors), drop=drop)
    with GGUFFile.open(tmp_path / "ollama.gguf") as f:
        assert "blk.0.ffn_gate_up_exps.weight" in f.tensors and "blk.0.attn_sinks" in f.tensors
    ollama = load_model(GGUFFile.open(tmp_path / "ollama.gguf"))
    assert (run(ollama, [LONG]) - run(model, [LONG])).abs().max() < 1e-5


def openai_mxfp4(ggml: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """GGUF MXFP4 bytes (..., G * 17) as OpenAI's checkpoints store them: blocks (..., G, 16)
    with values 2i and 2i + 1 in byte i, and scales (..., G)."""
    b = torch.from_numpy(ggml.copy()).unflatten(-1, (-1, 17))
    codes = torch.cat([b[..., 1:] & 0x0F, b[..., 1:] >> 4], dim=-1)  # (..., G, 32) in order
    return codes[..., 0::2] | (codes[..., 1::2] << 4), b[..., 0].contiguous()


def test_an_mxfp4_checkpoint_converts_to_the_same_blocks(converted, tmp_path):
    """A checkpoint stored as released (experts in MXFP4 `_blocks` / `_scales`): its GGUF holds
    gguf-py's MXFP4 bytes of the same values, and transformers' own MXFP4 decoding of the
    checkpoint equals gguf-py's of the file."""
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    root, mxfp4 = converted[0].parent, gguf.GGMLQuantizationType.MXFP4
    _, tensors = read_gguf(converted[0])
    weights = load_file(root / "hf" / "model.safetensors")
    expected = {}
    for i in range(2):
        p, hf = f"blk.{i}.", f"model.layers.{i}.mlp.experts."
        q = {n: gguf.quants.quantize(tensors[f"{p}ffn_{n}_exps.weight"], mxfp4)
             for n in ("gate", "up", "down")}  # fmt: skip
        expected |= {f"{p}ffn_{n}_exps.weight": v for n, v in q.items()}
        gate_up = np.stack([q["gate"], q["up"]], axis=2).reshape(8, 64, -1)  # rows gate, up...
        for name, data in (("gate_up_proj", gate_up), ("down_proj", q["down"])):
            del weights[hf + name]
            weights[hf + name + "_blocks"], weights[hf + name + "_scales"] = openai_mxfp4(data)
    out = tmp_path / "hf"
    out.mkdir()
    save_file(weights, out / "model.safetensors")
    for f in (root / "hf").iterdir():
        if f.suffix != ".safetensors":
            (out / f.name).write_bytes(f.read_bytes())
    convert_directory(out, tmp_path / "model.gguf")
    _, got = read_gguf(tmp_path / "model.gguf")
    with GGUFFile.open(tmp_path / "model.gguf") as f:
        assert f.tensors["blk.0.ffn_gate_exps.weight"].ggml_type == GGMLType.MXFP4
    for name, data in expected.items():
        assert np.array_equal(got[name].reshape(data.shape), data), name
    hf = "model.layers.1.mlp.experts.gate_up_proj_"
    theirs = convert_moe_packed_tensors(weights[hf + "blocks"], weights[hf + "scales"],
                                        dtype=torch.float32)  # fmt: skip  # (E, C, 2F)
    up = got["blk.1.ffn_up_exps.weight"].reshape(8, 32, -1)
    ours = torch.from_numpy(gguf.quants.dequantize(up, mxfp4))
    assert torch.equal(theirs[..., 1::2], ours.mT)
