"""Qwen3 MoE converted from a tiny random-weight HF Qwen3MoeForCausalLM (8 experts, top-2):
llama.cpp's names and 3-D expert stacks, logits equal to HF's, decode equal to a prefill, a
batch equal to its sequences alone, tokens spread over the experts with only the routed ones
read, and Q8_0 expert stacks (gguf-py's quantizer) against HF on gguf-py's dequantized weights."""

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from hf_families import convert_family, save_family
from test_dense_families import OTHER, PROMPT, run, run_both
from tinymodels import hf_logits

from ember.batch import Batch
from ember.convert import convert_directory
from ember.gguf import GGMLType, GGUFFile
from ember.model import forward, load_model
from ember.model.archs.qwen3moe import Qwen3Moe

EXPERTS, USED, EXPERT_FFN, HIDDEN = 8, 2, 32, 64


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return convert_family("qwen3moe", tmp_path_factory.mktemp("qwen3moe"))


@pytest.fixture(scope="module")
def model(converted) -> Qwen3Moe:
    loaded = load_model(GGUFFile.open(converted[0]))
    assert isinstance(loaded, Qwen3Moe)
    return loaded


def test_the_file_carries_llama_cpp_keys_and_stacked_experts(converted):
    with GGUFFile.open(converted[0]) as f:
        meta, tensors = f.metadata, f.tensors
        assert meta["general.architecture"] == "qwen3moe"
        assert meta["qwen3moe.expert_count"] == EXPERTS
        assert meta["qwen3moe.expert_used_count"] == USED
        assert meta["qwen3moe.expert_feed_forward_length"] == EXPERT_FFN
        assert meta["qwen3moe.expert_weights_norm"] is True
        assert tensors["blk.1.ffn_gate_inp.weight"].shape == (EXPERTS, HIDDEN)
        assert tensors["blk.1.ffn_gate_exps.weight"].shape == (EXPERTS, EXPERT_FFN, HIDDEN)
        assert tensors["blk.1.ffn_up_exps.weight"].shape == (EXPERTS, EXPERT_FFN, HIDDEN)
        assert tensors["blk.1.ffn_down_exps.weight"].shape == (EXPERTS, HIDDEN, EXPERT_FFN)
        assert "blk.0.ffn_gate.weight" not in tensors
        down = torch.from_numpy(np.array(f.raw("blk.0.ffn_down_exps.weight"))).view(torch.float32)
    hf_down = converted[1].model.layers[0].mlp.experts.down_proj  # (E, C, F)
    assert torch.equal(down.view(EXPERTS, HIDDEN, EXPERT_FFN)[3], hf_down[3].detach())


def test_logits_equal_transformers(converted, model):
    assert (run(model, [PROMPT]) - hf_logits(converted[1], PROMPT)).abs().max() < 1e-4


def test_unnormalized_routing_weights_equal_transformers(tmp_path):
    """norm_topk_prob false (transformers' default): the top-k softmax weights as they are."""
    hf = save_family("qwen3moe", tmp_path / "hf", num_hidden_layers=1, norm_topk_prob=False)
    convert_directory(tmp_path / "hf", tmp_path / "model.gguf")
    loaded = load_model(GGUFFile.open(tmp_path / "model.gguf"))
    assert loaded.moe_options.is_normalized is False  # type: ignore[attr-defined]
    assert (run(loaded, [PROMPT]) - hf_logits(hf, PROMPT)).abs().max() < 1e-4


def test_incremental_decode_equals_prefill(model):
    full = run(model, [PROMPT])
    assert (run(model, [PROMPT[:5]] + [[t] for t in PROMPT[5:]]) - full).abs().max() < 1e-4


def test_two_sequences_in_one_batch_equal_each_alone(converted, model):
    both = run_both(model)
    alone = torch.cat([run(model, [PROMPT]), run(model, [OTHER])])
    assert (both - alone).abs().max() < 1e-4
    hf = torch.cat([hf_logits(converted[1], PROMPT), hf_logits(converted[1], OTHER)])
    assert (both - hf).abs().max() < 1e-4


class Spy:
    """An expert list that records which experts' weights are used and over how many rows."""

    def __init__(self, linears, calls: list[tuple[int, int]]) -> None:
        self.linears, self.calls = linears, calls

    def __getitem__(self, expert: int):
        def call(x: torch.Tensor) -> torch.Tensor:
            self.calls.append((expert, x.shape[0]))
            return self.linears[expert](x)

        return call


def spy_on_experts(experts) -> list[list[tuple[int, int]]]:
    """Per MoE layer (its SwiGLUExperts), the (expert, rows) of each call of its gate
    projections."""
    calls: list[list[tuple[int, int]]] = []
    for layer in experts:
        calls.append([])
        layer.gate = Spy(layer.gate, calls[-1])
    return calls


def check_routing(model, calls: list[list[tuple[int, int]]]) -> None:
    """A batch of two sequences spreads over the experts, one call per used expert; decoding
    one token calls only its USED experts, on one row each."""
    run_both(model)
    for layer in calls:
        experts = [e for e, _ in layer]
        assert len(set(experts)) >= 4  # the tokens route to different experts
        assert len(experts) == len(set(experts))  # one call per used expert, all its rows
        assert sum(n for _, n in layer) == (len(PROMPT) + len(OTHER)) * USED
    cache = model.make_cache()
    cache.init(max_sequences=1, capacity=64, max_batch=64)
    forward(model, cache, Batch.single(PROMPT, 0))
    for layer in calls:
        layer.clear()
    forward(model, cache, Batch.single([77], len(PROMPT)))
    assert [sorted(n for _, n in layer) for layer in calls] == [[1] * USED] * len(calls)


def test_a_batch_spreads_over_the_experts_and_decode_reads_only_the_routed_ones(converted):
    model = load_model(GGUFFile.open(converted[0]))
    check_routing(model, spy_on_experts(block.experts for block in model.blocks))


def quantize_experts(source: Path, out: Path) -> dict[str, np.ndarray]:
    """A copy of `source` whose expert stacks are Q8_0 (gguf-py's quantizer); returns the
    stacks as gguf-py dequantizes them."""
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(out, "qwen3moe")
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        writer.add_key_value(field.name, field.contents(), field.types[0], field.types[-1])
    dequantized = {}
    for t in reader.tensors:
        data = np.array(t.data)
        shape = tuple(int(n) for n in reversed(t.shape))
        if "_exps." in t.name:
            q = gguf.quants.quantize(data.reshape(shape), gguf.GGMLQuantizationType.Q8_0)
            dequantized[t.name] = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(t.name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(t.name, data.reshape(shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dequantized


def test_q8_0_expert_stacks_equal_transformers_on_the_dequantized_weights(converted, tmp_path):
    path, hf = converted
    dequantized = quantize_experts(path, tmp_path / "q8_0.gguf")
    with GGUFFile.open(tmp_path / "q8_0.gguf") as f:
        assert f.tensors["blk.0.ffn_up_exps.weight"].ggml_type == GGMLType.Q8_0
    quantized = run(load_model(GGUFFile.open(tmp_path / "q8_0.gguf")), [PROMPT])
    reference = hf_logits(with_experts(hf, dequantized), PROMPT)
    # the native kernels round activations to 8 bits too: 6e-4 here, logits spanning 32
    assert (quantized - reference).abs().max() < 5e-3


def test_embers_quantizer_keeps_the_router_and_quantizes_the_expert_stacks(converted, tmp_path):
    """`ember create --quantize q8_0` on the file: routers stay F32 (llama.cpp's rule), expert
    stacks become Q8_0 and load. A token whose top-2 flips under rounding changes a lot, so
    most rows, not all, stay close."""
    from ember.store.quantize import quantize

    out = tmp_path / "q8_0.gguf"
    with out.open("wb") as f:
        for _ in quantize(converted[0], f, "Q8_0"):  # type: ignore[arg-type]
            pass
    with GGUFFile.open(out) as g:
        assert g.tensors["blk.0.ffn_gate_inp.weight"].ggml_type == GGMLType.F32
        assert g.tensors["blk.0.ffn_down_exps.weight"].ggml_type == GGMLType.Q8_0
    full, quantized = hf_logits(converted[1], PROMPT), run(load_model(GGUFFile.open(out)), [PROMPT])
    row_errors = (quantized - full).abs().max(dim=1).values
    assert row_errors.median() < 0.02 * (full.max() - full.min())


def with_experts(hf, stacks: dict[str, np.ndarray]):
    """A copy of the HF model whose expert weights are `stacks` (GGUF names)."""
    import copy

    model = copy.deepcopy(hf)
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            gate, up, down = (torch.from_numpy(stacks[f"blk.{i}.ffn_{n}_exps.weight"].copy())
                              for n in ("gate", "up", "down"))  # fmt: skip
            layer.mlp.experts.gate_up_proj.copy_(torch.cat([gate, up], dim=1))
            layer.mlp.experts.down_proj.copy_(down)
    return model


def test_a_missing_expert_or_a_dense_layer_is_refused_before_writing(tmp_path):
    import json

    from safetensors.torch import load_file, save_file

    from ember.convert import ConvertError

    save_family("qwen3moe", tmp_path, num_hidden_layers=1)
    weights = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in weights.items() if ".experts.7.up_proj" not in k},
              tmp_path / "model.safetensors")  # fmt: skip
    with pytest.raises(ConvertError, match=r"ffn_up_exps\.weight' stacks 8 tensors"):
        convert_directory(tmp_path, tmp_path / "out.gguf")
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"mlp_only_layers": [0]}))
    with pytest.raises(ConvertError, match="dense layers"):
        convert_directory(tmp_path, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()
