"""Tiny random-weight embedding model folders for the tests: a NomicBertModel checkpoint (with
an independent float32 forward written from nomic's modeling_hf_nomic_bert.py, as transformers
has no NomicBert class) and an EmbeddingGemma sentence-transformers folder."""

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from bert_dirs import VOCAB, save_pooling, save_tokenizer
from hf_dirs import _save_sentencepiece
from safetensors.torch import save_file
from tinymodels import hf_config, randomize, spm_vocab

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


def nomic_reference(w: dict[str, torch.Tensor], ids: list[int]) -> torch.Tensor:
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


GEMMA_HIDDEN, DENSE = 64, 96


def save_tiny_embeddinggemma(out: Path) -> tuple[object, list[torch.Tensor]]:
    """The folder (config.json, model.safetensors, tokenizer.model, modules.json, 1_Pooling,
    2_Dense, 3_Dense, 4_Normalize); returns the HF model and the Dense weights."""
    from transformers import Gemma3TextModel

    vocab = spm_vocab()
    config = hf_config("gemma3", vocab, use_bidirectional_attention=True)
    config._attn_implementation = "eager"  # type: ignore[attr-defined]
    model = Gemma3TextModel(config).float().eval()
    randomize(model, "gemma3", seed=0)
    model.save_pretrained(out)
    _save_sentencepiece(vocab, out)
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config | {"add_eos_token": True}))
    kinds = ["Transformer", "Pooling", "Dense", "Dense", "Normalize"]
    paths = ["", "1_Pooling", "2_Dense", "3_Dense", "4_Normalize"]
    modules = [{"idx": i, "name": str(i), "path": p, "type": f"sentence_transformers.models.{k}"}
               for i, (k, p) in enumerate(zip(kinds, paths, strict=True))]  # fmt: skip
    (out / "modules.json").write_text(json.dumps(modules))
    (out / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": GEMMA_HIDDEN, "pooling_mode_mean_tokens": True}
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    gen = torch.Generator().manual_seed(1)
    dense = []
    for folder, (n_in, n_out) in (
        ("2_Dense", (GEMMA_HIDDEN, DENSE)),
        ("3_Dense", (DENSE, GEMMA_HIDDEN)),
    ):
        (out / folder).mkdir()
        weight = torch.randn(n_out, n_in, generator=gen) / n_in**0.5
        save_file({"linear.weight": weight}, str(out / folder / "model.safetensors"))
        spec = {"in_features": n_in, "out_features": n_out, "bias": False,
                "activation_function": "torch.nn.modules.linear.Identity"}  # fmt: skip
        (out / folder / "config.json").write_text(json.dumps(spec))
        dense.append(weight)
    return model, dense
