"""Qwen3 (dense): the qwen2 layout without q/k/v biases, with an RMSNorm over each head of the
queries and keys before NeoX RoPE (QK-norm); the head size comes from `attention.key_length`.
A Qwen3-Reranker (`qwen3.pooling_type` rank) scores a prompt by p("yes") against "no" at its
last token."""

import torch

from ember.backend.activation import gated_mlp
from ember.backend.layer import NativeLayer
from ember.gguf import GGUFFile
from ember.kvcache import Cache
from ember.model.archs.llama import Llama, LlamaOptions, layer_shape
from ember.model.config import Config, ModelLoadError
from ember.model.registry import register
from ember.model.weights import Weights
from ember.nn import Rotation, attention, rms_norm
from ember.pooling import POOLING_LAST, POOLING_RANK


class Qwen3Attention:
    """The attention half of a qwen3 layer (QK-norm), which qwen3moe shares."""

    def __init__(self, w: Weights, i: int, o: LlamaOptions) -> None:
        p, q_out, kv_out = f"blk.{i}.", o.num_heads * o.head_dim, o.num_kv_heads * o.head_dim
        self.splits = [q_out, kv_out, o.num_kv_heads * o.value_dim]
        self.attn_norm = w.tensor(p + "attn_norm.weight", (o.hidden,))
        self.attn_qkv = w.fused(
            [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"], self.splits, o.hidden
        )
        self.attn_q_norm = w.tensor(p + "attn_q_norm.weight", (o.head_dim,))
        self.attn_k_norm = w.tensor(p + "attn_k_norm.weight", (o.head_dim,))
        self.attn_output = w.linear(p + "attn_output.weight", o.hidden, o.num_heads * o.value_dim)
        self.ffn_norm = w.tensor(p + "ffn_norm.weight", (o.hidden,))

    def attend(
        self,
        x: torch.Tensor,
        rot: Rotation,
        cache: Cache,
        o: LlamaOptions,
        outputs: torch.Tensor | None,
    ) -> torch.Tensor:
        """x (T, C) plus its attention output (only the `outputs` rows where given)."""
        q, k, v = self.attn_qkv(rms_norm(x, self.attn_norm, o.eps)).split(self.splits, dim=-1)
        q = rms_norm(q.unflatten(-1, (o.num_heads, o.head_dim)), self.attn_q_norm, o.eps)
        k = rms_norm(k.unflatten(-1, (o.num_kv_heads, o.head_dim)), self.attn_k_norm, o.eps)
        qk = rot(torch.cat([q, k], dim=1))  # Llama.hidden's rotation: q heads scaled, then k
        v = v.unflatten(-1, (o.num_kv_heads, o.value_dim))
        h = attention(qk[:, : o.num_heads], qk[:, o.num_heads :], v, cache, scale=1.0)
        if outputs is not None:
            h, x = h[outputs], x[outputs]
        return x + self.attn_output(h)


class Qwen3Block(Qwen3Attention):
    def __init__(self, w: Weights, i: int, o: LlamaOptions) -> None:
        super().__init__(w, i, o)
        p = f"blk.{i}."
        self.ffn_gate_up = w.fused(
            [p + "ffn_gate.weight", p + "ffn_up.weight"], [o.ffn, o.ffn], o.hidden
        )
        self.ffn_down = w.linear(p + "ffn_down.weight", o.hidden, o.ffn)

    def native(self, o: LlamaOptions) -> NativeLayer | None:
        return NativeLayer.bind(
            layer_shape(o), attn_norm=self.attn_norm, qkv=self.attn_qkv, q_norm=self.attn_q_norm,
            k_norm=self.attn_k_norm, attn_output=self.attn_output, ffn_norm=self.ffn_norm,
            gate_up=self.ffn_gate_up, down=self.ffn_down,
        )  # fmt: skip

    def __call__(
        self,
        x: torch.Tensor,
        rot: Rotation,
        cache: Cache,
        o: LlamaOptions,
        outputs: torch.Tensor | None,
    ) -> torch.Tensor:
        x = self.attend(x, rot, cache, o, outputs)
        normed = rms_norm(x, self.ffn_norm, o.eps)
        return x + gated_mlp(normed, self.ffn_gate_up, self.ffn_down, "silu")


class Qwen3(Llama):
    is_neox_rope = True

    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        w = Weights(gguf)
        o = self.options = LlamaOptions.from_config(config, w, is_neox=True)
        self.vocab_size = w.vocab_size()
        self.context_length = o.context_length
        self.token_embd = w.embedding("token_embd.weight", self.vocab_size, o.hidden)
        self.blocks = [self.make_block(w, i, o) for i in range(o.num_layers)]  # type: ignore[misc]
        self.output_norm = w.tensor("output_norm.weight", (o.hidden,))
        self.output = w.output_head(self.vocab_size, o.hidden)

    def make_block(self, w: Weights, i: int, o: LlamaOptions) -> Qwen3Attention:
        return Qwen3Block(w, i, o)


class Qwen3Ranker(Qwen3):
    """Qwen3-Reranker: the runner pools the last token of `rerank_prompt`; its score is the
    softmax over the logits of the two label tokens ("yes", "no"), p(yes)."""

    pooling_type = POOLING_LAST

    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        super().__init__(gguf, config)
        labels = config.metadata.get("qwen3.classifier.output_labels")
        tokens = config.metadata.get("tokenizer.ggml.tokens") or []
        ids = {t: i for i, t in enumerate(tokens) if t in ("yes", "no")}
        if labels != ["yes", "no"] or len(ids) != 2:
            raise ModelLoadError('a Qwen3 reranker needs the labels and tokens "yes" and "no"')
        self.label_ids = [ids["yes"], ids["no"]]
        template = config.metadata.get("tokenizer.chat_template.rerank")
        if not isinstance(template, str) or "{query}" not in template:
            raise ModelLoadError("a Qwen3 reranker needs tokenizer.chat_template.rerank")
        self.template = template

    def rerank_prompt(self, query: str, document: str) -> str:
        # filled piece by piece: braces in the query must not reach the document's placeholder
        head, _, tail = self.template.partition("{query}")
        return head + query + tail.replace("{document}", document, 1)

    def score(self, pooled: torch.Tensor) -> torch.Tensor:
        """(n, C) last-token states -> (n,) p(yes) over {yes, no}."""
        return torch.softmax(self.logits(pooled)[:, self.label_ids], dim=-1)[:, 0]


@register("qwen3")
def qwen3(gguf: GGUFFile, config: Config) -> Qwen3:
    """A Qwen3 file's model: its reranker where its pooling type says rank."""
    if config.metadata.get(f"{config.arch}.pooling_type") == POOLING_RANK:
        return Qwen3Ranker(gguf, config)
    return Qwen3(gguf, config)
