"""nomic-bert (nomic-embed-text v1.5's architecture) converted from a NomicBertModel folder:
transformers has no NomicBert class, so a tiny random-weight checkpoint in its tensor names is
checked against an independent float32 forward written from nomic's modeling_hf_nomic_bert.py
(rotary NeoX halves, fused Wqkv, post-LayerNorm, fc11 * silu(fc12)); the same batched as one by
one, and embeddings through the runner's engine are the normalized mean."""

from pathlib import Path

import pytest
import torch
from bert_dirs import SENTENCES, VOCAB
from embed_dirs import EPS, save_tiny_nomic
from embed_dirs import nomic_reference as reference
from encoders import embed, ember_hidden

from ember.convert import ConvertError, convert_directory
from ember.gguf import GGUFFile
from ember.model import load_model
from ember.runner.engine import Engine
from ember.server.model import read_facts
from ember.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[dict[str, torch.Tensor], Path]:
    root = tmp_path_factory.mktemp("nomic")
    weights = save_tiny_nomic(root / "hf")
    convert_directory(root / "hf", root / "model.gguf")
    return weights, root / "model.gguf"


def test_metadata_as_llama_cpp_writes_it(tiny) -> None:
    gguf = GGUFFile.open(tiny[1])
    md = gguf.metadata
    assert md["general.architecture"] == "nomic-bert"
    assert {k: md[k] for k in md if k.startswith("nomic-bert.")} == {
        "nomic-bert.block_count": 2, "nomic-bert.context_length": 64,
        "nomic-bert.embedding_length": 32, "nomic-bert.feed_forward_length": 256,
        "nomic-bert.attention.head_count": 4, "nomic-bert.attention.causal": False,
        "nomic-bert.attention.layer_norm_epsilon": pytest.approx(EPS),
        "nomic-bert.rope.freq_base": 1000.0, "nomic-bert.pooling_type": 1,
    }  # fmt: skip
    facts = read_facts(tiny[1])  # what the server serves it as: an embedding model only
    assert facts.is_embedding and not facts.is_rerank
    assert md["tokenizer.ggml.model"] == "bert" and md["tokenizer.ggml.token_type_count"] == 2
    assert len(md["tokenizer.ggml.tokens"]) == -(-len(VOCAB) // 8) * 8
    layer = ["attn_qkv.weight", "attn_output.weight", "attn_output_norm.weight",
             "attn_output_norm.bias", "ffn_up.weight", "ffn_gate.weight", "ffn_down.weight",
             "layer_output_norm.weight", "layer_output_norm.bias"]  # fmt: skip
    top = {"token_embd.weight", "token_types.weight", "token_embd_norm.weight"}
    expected = top | {"token_embd_norm.bias"} | {f"blk.{i}.{n}" for i in range(2) for n in layer}
    assert set(gguf.tensors) == expected


def test_hidden_states_equal_the_reference_batched_or_alone(tiny) -> None:
    weights, path = tiny
    model = load_model(GGUFFile.open(path))
    seqs = [[2, 10, 20, 30, 3], [2, 57, 84, 85, 9, 11, 40, 41, 42, 1, 3], [2, 3]]
    together = ember_hidden(model, seqs)
    for ids, rows in zip(seqs, together, strict=True):
        expected = reference(weights, ids)
        assert torch.allclose(rows, expected, atol=1e-4), (rows - expected).abs().max()
        (alone,) = ember_hidden(model, [ids])
        assert torch.allclose(alone, rows, atol=1e-5)


def test_engine_embeddings_are_the_normalized_mean(tiny) -> None:
    weights, path = tiny
    gguf = GGUFFile.open(path)
    model, tokenizer = load_model(gguf), Tokenizer.from_metadata(gguf.metadata)
    texts = SENTENCES[:8]
    engine = Engine(model, tokenizer, num_parallel=4, num_ctx=64, num_batch=32)
    try:
        together = embed(engine, tokenizer, texts)
        alone = [embed(engine, tokenizer, [t])[0] for t in texts[:3]]
    finally:
        engine.close()
    for text, vector in zip(texts, together, strict=True):
        expected = reference(weights, tokenizer.encode(text)).mean(dim=0)
        assert torch.allclose(torch.tensor(vector), expected / expected.norm(), atol=1e-5), text
    for a, b in zip(together, alone, strict=False):
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5


@pytest.mark.parametrize(
    ("key", "value"),
    [("prenorm", True), ("qkv_proj_bias", True), ("rotary_emb_fraction", 0.5),
     ("rotary_emb_interleaved", True), ("activation_function", "gelu"),
     ("moe_every_n_layers", 2)],
)  # fmt: skip
def test_variants_the_forward_does_not_follow_are_refused(tmp_path, key, value) -> None:
    save_tiny_nomic(tmp_path / "hf", **{key: value})
    with pytest.raises(ConvertError, match=key):
        convert_directory(tmp_path / "hf", tmp_path / "model.gguf")
