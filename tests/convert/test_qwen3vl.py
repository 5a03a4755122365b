"""Qwen3-VL's text: a tiny random-weight HF Qwen3VLForConditionalGeneration converted to
Ollama's `qwen3vl` gives HF's logits for a text prompt (its interleaved M-RoPE sections all at
the text position), with its tower and without (a text-only file serves as Qwen3); a Qwen3 MoE
file read as `qwen3vlmoe` gives the `qwen3moe` logits. Images: test_qwen3vl_vision.py."""

import pytest
import torch

pytest.importorskip("transformers")

from gguf_copy import read_gguf, write_gguf
from hf_families import convert_family, convert_multimodal
from test_dense_families import OTHER, PROMPT, run, stepped_error

from ember.gguf import GGUFFile
from ember.model import load_model

LONG = PROMPT + OTHER + PROMPT  # 51 tokens


def test_the_text_of_qwen3_vl_equals_transformers(tmp_path):
    text = {
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                            "mrope_section": [2, 3, 3], "mrope_interleaved": True},
    }  # fmt: skip
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
              "out_hidden_size": 64, "deepstack_visual_indexes": [0]}  # fmt: skip
    path, hf = convert_multimodal(tmp_path, "Qwen3VL", text, vision)
    with GGUFFile.open(path) as f:
        assert f.metadata["general.architecture"] == "qwen3vl"
        assert f.metadata["qwen3vl.rope.mrope_section"] == [2, 3, 3]
        assert "v.deepstack_merger.0.linear_fc2.weight" in f.tensors
    reader, tensors = read_gguf(path)
    text = {name: t for name, t in tensors.items() if not name.startswith("v.")}
    write_gguf(reader, tmp_path / "text.gguf", "qwen3vl", text, prefix="qwen3vl.")
    with torch.no_grad():
        expected = hf(input_ids=torch.tensor([LONG]), use_cache=False).logits[0].float()
    for file in (path, tmp_path / "text.gguf"):
        assert stepped_error(load_model(GGUFFile.open(file)), expected, LONG) < 1e-4


def test_a_qwen3_vl_moe_file_reads_as_qwen3_moe(tmp_path):
    path, _ = convert_family("qwen3moe", tmp_path / "moe")
    reader, tensors = read_gguf(path)
    write_gguf(reader, tmp_path / "vl.gguf", "qwen3vlmoe", tensors, prefix="qwen3moe.")
    moe, vl = (load_model(GGUFFile.open(p)) for p in (path, tmp_path / "vl.gguf"))
    assert torch.equal(run(moe, [LONG]), run(vl, [LONG]))
