"""Granite (3.x dense): the llama decoder with four multipliers, from the file's keys as
llama.cpp writes them: embeddings times `embedding_scale`, each residual branch times
`residual_scale`, attention scores times `attention.scale` (instead of 1/sqrt(head size)),
logits divided by `logit_scale`."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.kvcache import Cache
from ember.model.archs.llama import Llama, LlamaOptions
from ember.model.config import Config
from ember.model.registry import register
from ember.model.weights import Weights
from ember.nn import attention, rms_norm


@dataclass(frozen=True, slots=True)
class Multipliers:
    embedding: float
    residual: float
    attention: float
    logits: float  # a divisor

    @classmethod
    def from_config(cls, c: Config, head_dim: int) -> "Multipliers":
        return cls(
            embedding=c.float("embedding_scale", 1.0),
            residual=c.float("residual_scale", 1.0),
            attention=c.float("attention.scale", head_dim**-0.5),
            logits=c.float("logit_scale", 1.0),
        )


class GraniteBlock:
    def __init__(self, w: Weights, i: int, o: LlamaOptions, m: Multipliers) -> None:
        p, q_out = f"blk.{i}.", o.num_heads * o.head_dim
        self.m = m
        self.splits = [q_out, o.num_kv_heads * o.head_dim, o.num_kv_heads * o.value_dim]
        self.attn_norm = w.tensor(p + "attn_norm.weight", (o.hidden,))
        self.attn_qkv = w.fused(
            [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"], self.splits, o.hidden
        )
        self.attn_output = w.linear(p + "attn_output.weight", o.hidden, o.num_heads * o.value_dim)
        self.ffn_norm = w.tensor(p + "ffn_norm.weight", (o.hidden,))
        self.ffn_gate_up = w.fused(
            [p + "ffn_gate.weight", p + "ffn_up.weight"], [o.ffn, o.ffn], o.hidden
        )
        self.ffn_down = w.linear(p + "ffn_down.weight", o.hidden, o.ffn)

    def __call__(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, ...],
        cache: Cache,
        o: LlamaOptions,
        outputs: torch.Tensor | None,
    ) -> torch.Tensor:
        q, k, v = self.attn_qkv(rms_norm(x, self.attn_norm, o.eps)).split(self.splits, dim=-1)
        q = o.rope.apply(q.unflatten(-1, (o.num_heads, o.head_dim)), *rope)
        k = o.rope.apply(k.unflatten(-1, (o.num_kv_heads, o.head_dim)), *rope)
        v = v.unflatten(-1, (o.num_kv_heads, o.value_dim))
        h = attention(q, k, v, cache, scale=self.m.attention)
        if outputs is not None:
            h, x = h[outputs], x[outputs]
        x = x + self.attn_output(h) * self.m.residual
        gate, up = self.ffn_gate_up(rms_norm(x, self.ffn_norm, o.eps)).chunk(2, dim=-1)
        return x + self.ffn_down(F.silu(gate) * up) * self.m.residual


@register("granite")
class Granite(Llama):
    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        w = Weights(gguf)
        o = self.options = LlamaOptions.from_config(config, w, is_neox=False)
        m = self.multipliers = Multipliers.from_config(config, o.head_dim)
        self.vocab_size = w.vocab_size()
        self.context_length = o.context_length
        self.token_embd = w.embedding("token_embd.weight", self.vocab_size, o.hidden)
        self.blocks = [GraniteBlock(w, i, o, m) for i in range(o.num_layers)]  # type: ignore[misc]
        self.output_norm = w.tensor("output_norm.weight", (o.hidden,))
        self.output = w.output_head(self.vocab_size, o.hidden)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.output(hidden) / self.multipliers.logits

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        o = self.options
        x = self.token_embd.lookup(torch.tensor(batch.tokens)) * self.multipliers.embedding
        rope = o.rope.cos_sin(torch.tensor(batch.positions))
        outputs = torch.tensor(batch.outputs, dtype=torch.long)
        for i, block in enumerate(self.blocks):
            cache.set_layer(i)
            x = block(x, rope, cache, o, outputs if i == o.num_layers - 1 else None)  # type: ignore[arg-type]  # GraniteBlocks
        return rms_norm(x, self.output_norm, o.eps)
