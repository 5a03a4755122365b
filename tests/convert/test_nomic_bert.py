"""nomic-bert (nomic-embed-text v1.5's architecture) converted from a NomicBertModel folder:
transformers has no NomicBert class, so a tiny random-weight checkpoint in its tensor names is
checked against an independent float32 forward written from nomic's modeling_hf_nomic_bert.py
(rotary NeoX halves, fused Wqkv, post-LayerNorm, fc11 * silu(fc12)); the same batched as one by
one, and embeddings through the runner's engine are the normalized mean."""

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from bert_dirs import SENTENCES, VOCAB, save_pooling, save_tokenizer
from encoders import embed, ember_hidden
from safetensors.torch import save_file

from ember.convert import ConvertError, convert_directory
from ember.gguf import GGUFFile
from ember.model import load_model
from ember.runner.engine import Engine
from ember.tokenizer import Tokenizer

HIDDEN, HEADS, LAYERS, FFN, BASE, EPS = 32, 4, 2, 256, 1000.0, 1e-12
CONFIG = {
    "architectures": ["NomicBertModel"], "model_type": "nomic_bert",
    "activation_function": "swiglu", "causal": False, "prenorm": False,
    "n_embd": HIDDEN, "n_head": HEADS, "n_layer": LAYERS, "n_inner": FFN, "n_positions": 8192,
    "max_trained_positions": 64, "layer_norm_epsilon": EPS, "rotary_emb_base": BASE,
    "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False, "rotary_emb_scale_base": None,
    "rotary_scaling_factor": None, "qkv_proj_bias": False, "mlp_fc1_bias": False,
    "mlp_fc2_bias": False, "type_vocab_size": 2, "vocab_size": len(VOCAB),
    "pad_vocab_size_multiple": 8, "use_rms_norm": False,
}  # fmt: skip


def save_tiny_nomic(out: Path, **config: object) -> dict[str, torch.Tensor]:
    """A 2-layer NomicBertModel checkpoint, every weight random, with BERT's WordPiece tokenizer
    and sentence-transformers' Pooling (mean) and Normalize modules; returns its weights."""
    gen = torch.Generator().manual_seed(0)
    vocab = -(-len(VOCAB) // 8) * 8  # padded to pad_vocab_size_multiple, as nomic's are

    def rand(*shape: int, scale: float = 0.3, mean: float = 0.0) -> torch.Tensor:
        return mean + scale * torch.randn(shape, generator=gen)

    weights = {
        "embeddings.word_embeddings.weight": rand(vocab, HIDDEN),
        "embeddings.token_type_embeddings.weight": rand(2, HIDDEN),
        "emb_ln.weight": rand(HIDDEN, scale=0.2, mean=1.0), "emb_ln.bias": rand(HIDDEN),
    }  # fmt: skip
    for i in range(LAYERS):
        p = f"encoder.layers.{i}."
        weights |= {
            p + "attn.Wqkv.weight": rand(3 * HIDDEN, HIDDEN),
            p + "attn.out_proj.weight": rand(HIDDEN, HIDDEN),
            p + "mlp.fc11.weight": rand(FFN, HIDDEN, scale=0.2),
            p + "mlp.fc12.weight": rand(FFN, HIDDEN, scale=0.2),
            p + "mlp.fc2.weight": rand(HIDDEN, FFN, scale=0.1),
        }
        for norm in ("norm1", "norm2"):
            weights |= {p + f"{norm}.weight": rand(HIDDEN, scale=0.2, mean=1.0)}
            weights |= {p + f"{norm}.bias": rand(HIDDEN)}
    out.mkdir(parents=True)
    save_file(weights, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(CONFIG | config))
    save_tokenizer(out)
    save_pooling(out, "mean", dim=HIDDEN, extra=("Normalize",))
    return weights


def reference(w: dict[str, torch.Tensor], ids: list[int]) -> torch.Tensor:
    """NomicBertModel's last hidden state (T, C) for one input, token type 0, in float32."""
    t, d = len(ids), HIDDEN // HEADS
    x = (
        w["embeddings.word_embeddings.weight"][ids]
        + w["embeddings.token_type_embeddings.weight"][0]
    )
    x = F.layer_norm(x, (HIDDEN,), w["emb_ln.weight"], w["emb_ln.bias"], EPS)
    inv_freq = 1.0 / BASE ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    freqs = torch.outer(torch.arange(t, dtype=torch.float32), inv_freq)
    cos, sin = (torch.cat((f, f), -1)[:, None, :] for f in (freqs.cos(), freqs.sin()))

    def rotary(v: torch.Tensor) -> torch.Tensor:  # rotate_half, not interleaved
        v1, v2 = v.chunk(2, dim=-1)
        return v * cos + torch.cat((-v2, v1), dim=-1) * sin

    for i in range(LAYERS):
        p = f"encoder.layers.{i}."
        q, k, v = (x @ w[p + "attn.Wqkv.weight"].T).view(t, 3, HEADS, d).unbind(1)
        scores = torch.einsum("thd,shd->hts", rotary(q), rotary(k)) / d**0.5
        attn = torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(t, HIDDEN)
        x = F.layer_norm(x + attn @ w[p + "attn.out_proj.weight"].T, (HIDDEN,),
                         w[p + "norm1.weight"], w[p + "norm1.bias"], EPS)  # fmt: skip
        up, gate = x @ w[p + "mlp.fc11.weight"].T, x @ w[p + "mlp.fc12.weight"].T
        mlp = (up * F.silu(gate)) @ w[p + "mlp.fc2.weight"].T
        x = F.layer_norm(x + mlp, (HIDDEN,), w[p + "norm2.weight"], w[p + "norm2.bias"], EPS)
    return x


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
