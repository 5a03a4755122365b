"""Gemma 2: sliding-window attention on even layers and global on odd ones, attention scores
and final logits softcapped, post-norms around attention and MLP, GELU-tanh MLP, embeddings
scaled by sqrt(hidden), NeoX RoPE. The GGUF's norm weights already include Gemma's +1."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.kvcache import Cache, CausalCache, WrapperCache
from ember.model.config import Config
from ember.model.registry import register
from ember.model.weights import Weights
from ember.nn import RoPE, attention, rms_norm
from ember.nn.softcap import softcap, softcap_attention

SLIDING, GLOBAL = 0, 1
LARGE_LAYERS = 46  # Gemma 2 27B scales queries by hidden/heads instead of the head size


@dataclass(frozen=True, slots=True)
class Gemma2Options:
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn: int
    eps: float
    window: int
    context_length: int
    query_scale: float
    attn_softcap: float  # 0: none
    final_softcap: float  # 0: none
    rope: RoPE

    @classmethod
    def from_config(cls, c: Config) -> "Gemma2Options":
        hidden, num_heads = c.uint("embedding_length"), c.uint("attention.head_count")
        num_layers = c.uint("block_count", maximum=1024)
        head_dim = c.uint("attention.key_length", hidden // num_heads)
        query_dim = hidden // num_heads if num_layers == LARGE_LAYERS else head_dim
        return cls(
            num_layers=num_layers,
            hidden=hidden,
            num_heads=num_heads,
            num_kv_heads=c.uint("attention.head_count_kv", num_heads),
            head_dim=head_dim,
            ffn=c.uint("feed_forward_length"),
            eps=c.float("attention.layer_norm_rms_epsilon", 1e-6),
            window=c.uint("attention.sliding_window", 4096, maximum=1 << 28),
            context_length=c.uint("context_length", 8192, maximum=1 << 28),
            query_scale=query_dim**-0.5,
            attn_softcap=c.float("attn_logit_softcapping", 0.0),
            final_softcap=c.float("final_logit_softcapping", 0.0),
            rope=RoPE(head_dim, c.float("rope.freq_base", 10000.0), True),
        )

    @staticmethod
    def layer_type(i: int) -> int:
        return SLIDING if i % 2 == 0 else GLOBAL


class Block:
    def __init__(self, w: Weights, i: int, o: Gemma2Options) -> None:
        p = f"blk.{i}."
        self.splits = [o.num_heads * o.head_dim, *[o.num_kv_heads * o.head_dim] * 2]
        self.attn_norm = w.tensor(p + "attn_norm.weight", (o.hidden,))
        self.attn_qkv = w.fused(
            [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"], self.splits, o.hidden
        )
        self.attn_output = w.linear(p + "attn_output.weight", o.hidden, o.num_heads * o.head_dim)
        self.post_attention_norm = w.tensor(p + "post_attention_norm.weight", (o.hidden,))
        self.ffn_norm = w.tensor(p + "ffn_norm.weight", (o.hidden,))
        self.ffn_gate_up = w.fused(
            [p + "ffn_gate.weight", p + "ffn_up.weight"], [o.ffn, o.ffn], o.hidden
        )
        self.ffn_down = w.linear(p + "ffn_down.weight", o.hidden, o.ffn)
        self.post_ffw_norm = w.tensor(p + "post_ffw_norm.weight", (o.hidden,))

    def __call__(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: Cache,
        o: Gemma2Options,
        outputs: torch.Tensor | None,
    ) -> torch.Tensor:
        q, k, v = self.attn_qkv(rms_norm(x, self.attn_norm, o.eps)).split(self.splits, dim=-1)
        q = o.rope.apply(q.unflatten(-1, (o.num_heads, o.head_dim)), *rope)
        k = o.rope.apply(k.unflatten(-1, (o.num_kv_heads, o.head_dim)), *rope)
        v = v.unflatten(-1, (o.num_kv_heads, o.head_dim))
        if o.attn_softcap:
            h = softcap_attention(q, k, v, cache, scale=o.query_scale, cap=o.attn_softcap)
        else:
            h = attention(q, k, v, cache, scale=o.query_scale)
        if outputs is not None:
            h, x = h[outputs], x[outputs]
        x = x + rms_norm(self.attn_output(h), self.post_attention_norm, o.eps)
        gate, up = self.ffn_gate_up(rms_norm(x, self.ffn_norm, o.eps)).chunk(2, dim=-1)
        mlp = self.ffn_down(F.gelu(gate, approximate="tanh") * up)
        return x + rms_norm(mlp, self.post_ffw_norm, o.eps)


@register("gemma2")
class Gemma2:
    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        w = Weights(gguf)
        o = self.options = Gemma2Options.from_config(config)
        self.vocab_size = w.vocab_size()
        self.context_length = o.context_length
        self.token_embd = w.embedding("token_embd.weight", self.vocab_size, o.hidden)
        self.blocks = [Block(w, i, o) for i in range(o.num_layers)]
        self.output_norm = w.tensor("output_norm.weight", (o.hidden,))
        self.output = w.output_head(self.vocab_size, o.hidden)

    def make_cache(self) -> Cache:
        o = self.options
        caches = [CausalCache(window=o.window, shift=self.shift), CausalCache(shift=self.shift)]
        return WrapperCache(caches, [o.layer_type(i) for i in range(o.num_layers)])

    def shift(self, layer: int, key: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return self.options.rope.shift(key, delta)

    def forward(self, batch: Batch, cache: Cache) -> torch.Tensor:
        return self.logits(self.hidden(batch, cache))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.output(hidden)
        cap = self.options.final_softcap
        return softcap(logits, cap) if cap else logits

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        o = self.options
        x = self.token_embd.lookup(torch.tensor(batch.tokens)) * o.hidden**0.5  # (T, C)
        rope = o.rope.cos_sin(torch.tensor(batch.positions))
        outputs = torch.tensor(batch.outputs, dtype=torch.long)
        for i, block in enumerate(self.blocks):
            cache.set_layer(i)
            x = block(x, rope, cache, o, outputs if i == o.num_layers - 1 else None)
        return rms_norm(x, self.output_norm, o.eps)
