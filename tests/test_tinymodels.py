"""tinymodels: the tiny GGUF files read back as llama.cpp's converter would have written them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

import tinymodels as tm  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402
from tinymodels import TinyModel  # noqa: E402
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint  # noqa: E402

from ember.gguf.reader import GGUFFile  # noqa: E402

LAYER_TENSORS = {
    "llama": {
        "attn_norm.weight": [64], "attn_q.weight": [64, 64], "attn_k.weight": [64, 32],
        "attn_v.weight": [64, 32], "attn_output.weight": [64, 64], "ffn_norm.weight": [64],
        "ffn_gate.weight": [64, 128], "ffn_up.weight": [64, 128], "ffn_down.weight": [128, 64],
    },
}
LAYER_TENSORS["qwen2"] = LAYER_TENSORS["llama"] | {
    "attn_q.bias": [64], "attn_k.bias": [32], "attn_v.bias": [32],
}
LAYER_TENSORS["gemma3"] = LAYER_TENSORS["llama"] | {
    "attn_q_norm.weight": [16], "attn_k_norm.weight": [16],
    "post_attention_norm.weight": [64], "post_ffw_norm.weight": [64],
}
NUM_LAYERS = {"llama": 2, "qwen2": 2, "gemma3": 6}
VOCAB_SIZES = {"llama": 299, "qwen2": 299, "gemma3": 397}

COMMON_KEYS = {
    "context_length": 128, "embedding_length": 64, "feed_forward_length": 128,
    "attention.head_count": 4, "attention.head_count_kv": 2,
}
MODEL_KEYS = {
    "llama": COMMON_KEYS | {"block_count": 2, "rope.freq_base": 100000.0,
                            "attention.layer_norm_rms_epsilon": np.float32(1e-5),
                            "vocab_size": 299, "rope.dimension_count": 16},
    "qwen2": COMMON_KEYS | {"block_count": 2, "rope.freq_base": 1e6,
                            "attention.layer_norm_rms_epsilon": np.float32(1e-6)},
    "gemma3": COMMON_KEYS | {"block_count": 6, "rope.freq_base": 1e6,
                             "attention.layer_norm_rms_epsilon": np.float32(1e-6),
                             "attention.key_length": 16, "attention.value_length": 16,
                             "attention.sliding_window": 8},
}
# tokenizer.* keys of the real files (SmolLM2, Qwen2.5-Coder, Gemma 3), checked against them by
# test_keys_and_tensor_names_match_the_real_file.
_GGML = ("model", "pre", "tokens", "token_type", "bos_token_id", "eos_token_id",
         "padding_token_id", "add_bos_token")
TOKENIZER_KEYS = {
    "llama": {*_GGML, "merges", "unknown_token_id", "add_space_prefix"},
    "qwen2": {*_GGML, "merges"},
    "gemma3": {*_GGML, "scores", "unknown_token_id", "add_space_prefix", "add_sep_token",
               "add_eos_token"},
}
CHAT_TEMPLATE = {"llama": True, "qwen2": True, "gemma3": False}
# (model, pre, bos, eos, add_bos) as in the real files.
TOKENIZERS = {
    "llama": ("gpt2", "smollm", 1, 2, False),
    "qwen2": ("gpt2", "qwen2", 296, 298, False),
    "gemma3": ("llama", "default", 2, 1, True),
}


def fields(path: Path) -> dict[str, Any]:
    reader = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def raw_tensors(path: Path) -> dict[str, gguf.ReaderTensor]:
    return {t.name: t for t in gguf.GGUFReader(str(path)).tensors}


@pytest.mark.parametrize("arch", tm.ARCHS)
def test_tensor_names_and_shapes_are_the_converters(
    tiny_models: dict[str, TinyModel], arch: str
) -> None:
    tensors = raw_tensors(tiny_models[arch].path)
    expected = {"token_embd.weight": [64, VOCAB_SIZES[arch]], "output_norm.weight": [64]}
    if arch == "qwen2":
        expected["output.weight"] = [64, VOCAB_SIZES[arch]]  # untied, as Qwen2.5-Coder's file
    for i in range(NUM_LAYERS[arch]):
        expected |= {f"blk.{i}.{name}": shape for name, shape in LAYER_TENSORS[arch].items()}
    assert {n: t.shape.tolist() for n, t in tensors.items()} == expected
    assert {t.tensor_type for t in tensors.values()} == {QT.F32}


@pytest.mark.parametrize("arch", tm.ARCHS)
def test_model_metadata_keys_and_values(tiny_models: dict[str, TinyModel], arch: str) -> None:
    meta = fields(tiny_models[arch].path)
    assert meta["general.architecture"] == arch
    assert meta["general.file_type"] == 0
    found = {k.removeprefix(f"{arch}."): v for k, v in meta.items() if k.startswith(f"{arch}.")}
    assert found == pytest.approx(MODEL_KEYS[arch])
    assert found.keys() == MODEL_KEYS[arch].keys()


@pytest.mark.parametrize("arch", tm.ARCHS)
def test_tokenizer_metadata(tiny_models: dict[str, TinyModel], arch: str) -> None:
    meta = fields(tiny_models[arch].path)
    model, pre, bos, eos, add_bos = TOKENIZERS[arch]
    assert meta["tokenizer.ggml.model"] == model
    assert meta["tokenizer.ggml.pre"] == pre
    assert (meta["tokenizer.ggml.bos_token_id"], meta["tokenizer.ggml.eos_token_id"]) == (bos, eos)
    assert meta["tokenizer.ggml.add_bos_token"] is add_bos
    assert len(meta["tokenizer.ggml.tokens"]) == VOCAB_SIZES[arch]
    assert len(meta["tokenizer.ggml.token_type"]) == VOCAB_SIZES[arch]
    keys = {k.removeprefix("tokenizer.ggml.") for k in meta if k.startswith("tokenizer.ggml.")}
    assert keys == TOKENIZER_KEYS[arch]
    assert ("tokenizer.chat_template" in meta) is CHAT_TEMPLATE[arch]  # Gemma's file has none


@pytest.mark.parametrize("arch", tm.ARCHS)
def test_hf_gguf_loader_reads_back_exactly_the_hf_weights(
    tiny_models: dict[str, TinyModel], arch: str
) -> None:
    """transformers' own GGUF loader (it undoes llama.cpp's permute and +1) is the oracle."""
    tiny = tiny_models[arch]
    loaded = load_gguf_checkpoint(str(tiny.path), return_tensors=True, model_to_load=tiny.hf)
    state = tiny.hf.state_dict()
    names = set(state) - ({"lm_head.weight"} if arch != "qwen2" else set())
    assert set(loaded["tensors"]) == names
    for name in names:
        assert torch.equal(loaded["tensors"][name], state[name]), name
    cfg = loaded["config"]
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "tie_word_embeddings"):
        assert cfg[key] == getattr(tiny.hf.config, key), key


def test_unpermuting_the_llama_file_gives_back_hf_q_and_k(
    tiny_models: dict[str, TinyModel],
) -> None:
    tiny = tiny_models["llama"]
    tensors = tm.read_gguf_tensors(tiny.path)
    attn = tiny.hf.model.layers[1].self_attn
    for short, proj, num_heads in [("attn_q", attn.q_proj, 4), ("attn_k", attn.k_proj, 2)]:
        stored = tensors[f"blk.1.{short}.weight"]
        hf = proj.weight.detach().numpy()
        assert not np.array_equal(stored, hf)
        np.testing.assert_array_equal(tm.unpermute_qk(stored, num_heads), hf)
        np.testing.assert_array_equal(tm.permute_qk(hf, num_heads), stored)
    # qwen2 and gemma3 keep HF's row order (NeoX RoPE in ggml).
    qwen = tiny_models["qwen2"]
    np.testing.assert_array_equal(
        tm.read_gguf_tensors(qwen.path)["blk.0.attn_q.weight"],
        qwen.hf.model.layers[0].self_attn.q_proj.weight.detach().numpy(),
    )


def rope(x: torch.Tensor, pos: int, *, pairs: str, base: float = 10000.0) -> torch.Tensor:
    """Rotate one head (D,): `neox` pairs i with i + D/2 (HF), `normal` pairs 2i with 2i+1."""
    half = x.shape[0] // 2
    angle = pos * base ** (-torch.arange(half, dtype=torch.float64) * 2 / x.shape[0])
    cos, sin = torch.cos(angle), torch.sin(angle)
    if pairs == "neox":
        a, b = x[:half], x[half:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos])
    a, b = x[0::2], x[1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=1).reshape(-1)


def test_permuted_rows_turn_neox_rope_into_ggml_normal_rope() -> None:
    """Why llama files are permuted: rope_normal(P q) == P rope_neox(q) for every position."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(2 * 8, 5, generator=gen, dtype=torch.float64)  # 2 heads of dim 8
    x = torch.randn(5, generator=gen, dtype=torch.float64)
    w_file = torch.from_numpy(tm.permute_qk(w.numpy(), 2))
    for pos in (0, 1, 7, 100):
        for head in range(2):
            rows = slice(8 * head, 8 * head + 8)
            hf = rope(w[rows] @ x, pos, pairs="neox")
            ggml = rope(w_file[rows] @ x, pos, pairs="normal")
            permuted_hf = torch.from_numpy(tm.permute_qk(hf.reshape(8, 1).numpy(), 1)).reshape(8)
            torch.testing.assert_close(ggml, permuted_hf, rtol=0, atol=1e-12)


def test_gemma3_norms_are_stored_with_one_added(tiny_models: dict[str, TinyModel]) -> None:
    tiny = tiny_models["gemma3"]
    tensors = tm.read_gguf_tensors(tiny.path)
    layer = tiny.hf.model.layers[5]
    pairs = {
        "blk.5.attn_norm.weight": layer.input_layernorm,
        "blk.5.post_attention_norm.weight": layer.post_attention_layernorm,
        "blk.5.ffn_norm.weight": layer.pre_feedforward_layernorm,
        "blk.5.post_ffw_norm.weight": layer.post_feedforward_layernorm,
        "blk.5.attn_q_norm.weight": layer.self_attn.q_norm,
        "blk.5.attn_k_norm.weight": layer.self_attn.k_norm,
        "output_norm.weight": tiny.hf.model.norm,
    }
    for name, module in pairs.items():
        hf = module.weight.detach().numpy()
        assert np.abs(hf).max() < 0.6  # HF's weight is near 0, the file's near 1
        np.testing.assert_array_equal(tensors[name], hf + np.float32(1), err_msg=name)


def test_gemma3_has_sliding_and_global_layers(tiny_models: dict[str, TinyModel]) -> None:
    cfg = tiny_models["gemma3"].hf.config
    assert cfg.layer_types == ["sliding_attention"] * 5 + ["full_attention"]
    assert cfg.sliding_window == 8
    assert cfg.query_pre_attn_scalar == 16  # scale 1/sqrt(head_dim), as llama.cpp
    assert cfg.rope_parameters["sliding_attention"]["rope_theta"] == 10000.0


def test_same_seed_same_model_other_seed_other_model(tmp_path: Path) -> None:
    a = tm.write_tiny_gguf("qwen2", tmp_path / "a.gguf", seed=3)
    b = tm.write_tiny_gguf("qwen2", tmp_path / "b.gguf", seed=3)
    c = tm.write_tiny_gguf("qwen2", tmp_path / "c.gguf", seed=4)
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    ids = [5, 80, 200, 17]
    assert torch.equal(tm.hf_logits(a, ids), tm.hf_logits(b, ids))
    assert not torch.equal(tm.hf_logits(a, ids), tm.hf_logits(c, ids))


# Rows of 256 so K-quants apply; attn_output's rows are n_head*head_dim = 64 long: fallback.
K_SIZES = {"hidden_size": 256, "intermediate_size": 512}
QUANT_CASES = {
    # type: (relative RMS error bound vs the F32 weights, attn_output's type)
    "F16": (1e-3, "F16"),
    "BF16": (5e-3, "BF16"),
    "Q8_0": (0.01, "Q8_0"),
    "Q6_K": (0.03, "Q8_0"),
    "Q5_0": (0.05, "Q5_0"),
    "Q4_0": (0.12, "Q4_0"),
    "Q4_1": (0.12, "Q4_1"),
    "Q4_K": (0.12, "Q5_0"),
}


@pytest.mark.parametrize("ggml_type", QUANT_CASES)
def test_quantized_file_holds_the_weights_the_hf_model_holds(
    tmp_path: Path, ggml_type: str
) -> None:
    bound, attn_output_type = QUANT_CASES[ggml_type]
    path = tmp_path / f"{ggml_type}.gguf"
    model = tm.write_tiny_gguf("llama", path, ggml_type=ggml_type, **K_SIZES)
    types = {n: t.tensor_type.name for n, t in raw_tensors(path).items()}
    for name, qtype in types.items():
        if name.endswith("norm.weight"):
            assert qtype == "F32", name
        else:
            assert qtype == (attn_output_type if "attn_output" in name else ggml_type), name
    assert fields(path)["general.file_type"] == tm.FILE_TYPES[QT[ggml_type]]
    # The returned model holds exactly the dequantized file ...
    loaded = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)
    for name, value in loaded["tensors"].items():
        assert torch.equal(value, model.state_dict()[name]), name
    # ... which is close to the float32 weights of the same seed.
    exact = tm.build_hf_model("llama", tm.tiny_vocab("llama"), seed=0, **K_SIZES).state_dict()
    for name, value in model.state_dict().items():
        err = (value - exact[name]).pow(2).mean().sqrt() / exact[name].pow(2).mean().sqrt()
        assert err < bound, (name, float(err))


def test_tensor_types_override_by_pattern(tmp_path: Path) -> None:
    path = tmp_path / "mixed.gguf"
    tm.write_tiny_gguf(
        "qwen2", path, ggml_type="Q4_0",
        tensor_types={"token_embd.weight": "Q8_0", "*.ffn_down.weight": "Q5_0"},
    )
    types = {n: t.tensor_type.name for n, t in raw_tensors(path).items()}
    assert types["token_embd.weight"] == "Q8_0"
    assert types["blk.1.ffn_down.weight"] == "Q5_0"
    assert types["blk.1.ffn_up.weight"] == "Q4_0"
    assert types["output.weight"] == "Q4_0"
    assert types["blk.1.attn_q.bias"] == "F32"


@pytest.mark.parametrize(("qtype", "bound"), [(QT.Q4_K, 0.1), (QT.Q6_K, 0.03)])
def test_k_quant_encoder_round_trips_through_gguf_dequantize(qtype: QT, bound: float) -> None:
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((6, 512)).astype(np.float32)
    rows[1] *= 1e-3  # small scales
    rows[2] = np.abs(rows[2])  # no negative values: min 0
    rows[3] = -np.abs(rows[3]) * 40  # large and negative
    rows[4] = 0.0
    rows[5, :256] = 0.25  # constant block
    raw = tm.quantize(rows, qtype)
    assert raw.dtype == np.uint8
    assert raw.shape == (6, 2 * gguf.GGML_QUANT_SIZES[qtype][1])
    back = tm.dequantize(raw, qtype)
    np.testing.assert_array_equal(back[4], 0.0)
    np.testing.assert_allclose(back[5, :256], 0.25, rtol=2e-3)
    for row, got in zip(rows[:4], back[:4], strict=True):
        assert np.sqrt(np.mean((got - row) ** 2) / np.mean(row**2)) < bound


def test_bpe_vocab_has_gpt2_byte_order_and_valid_merges() -> None:
    qwen = tm.bpe_vocab("qwen2")
    assert qwen.tokens[:4] == ["!", '"', "#", "$"]
    assert (qwen.tokens[220], qwen.tokens[198], qwen.tokens[255]) == ("Ġ", "Ċ", "Ń")  # GPT-2 ids
    llama = tm.bpe_vocab("llama")
    assert llama.tokens[:4] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "!"]
    assert len(set(llama.tokens)) == len(llama.tokens) == 299
    for line in llama.merges:
        left, right = line.split(" ")
        assert {left, right, left + right} <= set(llama.tokens), line
    assert [llama.token_types[i] for i in (0, 2, 3, 298)] == [3, 3, 1, 1]


def test_spm_vocab_layout() -> None:
    vocab = tm.spm_vocab()
    assert vocab.tokens[:6] == ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>",
                                "<end_of_turn>"]
    assert vocab.tokens[6] == "<0x00>" and vocab.tokens[261] == "<0xFF>"
    assert set(vocab.token_types[6:262]) == {6}  # BYTE
    assert vocab.scores is not None
    assert vocab.scores[262:265] == [0.0, -1.0, -2.0]  # "▁", "!", '"'
    assert vocab.tokens[262] == "▁"


@pytest.mark.parametrize(
    ("arch", "expected"),
    [
        ("llama", ["The", "Ġsky", "Ġis", "Ġblue", "Ġbecause", "Ġn", "a", "Ã", "¯", "v", "e"]),
        ("qwen2", ["The", "Ġsky", "Ġis", "Ġblue", "Ġbecause", "Ġn", "a", "Ã", "¯", "v", "e"]),
        ("gemma3", ["The", "▁sky", "▁is", "▁blue", "▁because", "▁n", "a", "<0xC3>", "<0xAF>", "v",
                    "e"]),
    ],
)
def test_hf_tokenizer_loads_the_tiny_vocabulary(
    tiny_models: dict[str, TinyModel], arch: str, expected: list[str]
) -> None:
    from transformers import AutoTokenizer

    path = tiny_models[arch].path
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    text = "The sky is blue because naïve"
    assert tok.tokenize(text) == expected
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text


def _shape_of_names(names: list[str]) -> set[str]:
    return {re.sub(r"^blk\.\d+\.", "blk.N.", n) for n in names}


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize(
    ("arch", "fixture"), [("llama", "smollm2_path"), ("qwen2", "qwen2_path"),
                          ("gemma3", "gemma3_path")]
)
def test_keys_and_tensor_names_match_the_real_file(
    tiny_models: dict[str, TinyModel], arch: str, fixture: str, request: pytest.FixtureRequest
) -> None:
    """The tables above are the real files' (read with Ember's reader: gguf's GGUFReader takes
    20 s on a 262k-token vocabulary)."""
    with GGUFFile.open(request.getfixturevalue(fixture)) as real:
        fields, tensor_names = real.metadata, list(real.tensors)
        first = list(fields["tokenizer.ggml.tokens"][:300])
    tiny = gguf.GGUFReader(str(tiny_models[arch].path))
    found = {k.removeprefix(f"{arch}.") for k in fields if k.startswith(f"{arch}.")}
    assert found == MODEL_KEYS[arch].keys()
    found = {k.removeprefix("tokenizer.ggml.") for k in fields if k.startswith("tokenizer.ggml.")}
    assert found == TOKENIZER_KEYS[arch]
    assert ("tokenizer.chat_template" in fields) is CHAT_TEMPLATE[arch]
    assert _shape_of_names([t.name for t in tiny.tensors]) == _shape_of_names(tensor_names)
    if fields["tokenizer.ggml.model"] == "gpt2":
        # byte tokens in GPT-2's order (SmolLM2 lacks a few, as 0xC0)
        byte_tokens = [t for t in first if len(t) == 1]
        assert len(byte_tokens) > 200
        assert byte_tokens == [c for c in tm.bytes_to_unicode().values() if c in byte_tokens]
