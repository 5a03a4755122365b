"""Phi-3 (and Phi-4-mini): the llama decoder with fused tensors, `attn_qkv` (q, k, v rows) and
`ffn_up` (gate then up rows); NeoX RoPE over the first `rope.dimension_count` dimensions of each
head, LongRoPE's per-frequency factors and attention factor, an optional sliding window on every
layer.

LongRoPE has two factor sets: the short ones, for contexts within the original training length,
and the long ones beyond it. The keys in the cache are rotated once, so one set serves a whole
cache: as llama.cpp's (Ollama runs phi3 there), the long factors where a sequence's context
(the cache's capacity, num_ctx) is larger than the original context, else the short ones.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.kvcache import Cache, CausalCache
from ember.model.config import Config
from ember.model.registry import register
from ember.model.weights import Weights
from ember.nn import RoPE, attention, rms_norm


@dataclass(frozen=True, slots=True)
class Phi3Options:
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn: int
    eps: float
    window: int  # 0: none
    context_length: int
    attn_factor: float  # LongRoPE's: scales the rotated dimensions of q and k
    rope: RoPE  # with LongRoPE's short factors
    long_rope: RoPE | None  # with its long factors (None: the file has none)
    original_context: int  # the context the short factors serve

    def rope_for(self, cache: Cache) -> RoPE:
        """The RoPE of a cache: the long factors past the original context, as llama.cpp."""
        capacity = getattr(cache, "capacity", 0)
        if self.long_rope is not None and capacity > self.original_context:
            return self.long_rope
        return self.rope

    @classmethod
    def from_config(cls, c: Config, w: Weights) -> "Phi3Options":
        hidden, num_heads = c.uint("embedding_length"), c.uint("attention.head_count")
        head_dim = c.uint("attention.key_length", hidden // num_heads)
        rope_dim = c.uint("rope.dimension_count", head_dim)
        short, long = (w.optional(f"rope_factors_{kind}.weight", (rope_dim // 2,))
                       for kind in ("short", "long"))  # fmt: skip
        base = c.float("rope.freq_base", 10000.0)
        context = c.uint("context_length", 4096, maximum=1 << 28)
        return cls(
            num_layers=c.uint("block_count", maximum=1024),
            hidden=hidden,
            num_heads=num_heads,
            num_kv_heads=c.uint("attention.head_count_kv", num_heads),
            head_dim=head_dim,
            ffn=c.uint("feed_forward_length"),
            eps=c.float("attention.layer_norm_rms_epsilon", 1e-5),
            window=c.uint("attention.sliding_window", 0, maximum=1 << 28),
            context_length=context,
            attn_factor=c.float("rope.scaling.attn_factor", 1.0),
            rope=RoPE(rope_dim, base, True, 1.0, short),
            long_rope=None if long is None else RoPE(rope_dim, base, True, 1.0, long),
            original_context=c.uint(
                "rope.scaling.original_context_length", context, maximum=1 << 28
            ),
        )


class Block:
    def __init__(self, w: Weights, i: int, o: Phi3Options) -> None:
        p, q_out, kv_out = f"blk.{i}.", o.num_heads * o.head_dim, o.num_kv_heads * o.head_dim
        self.splits = [q_out, kv_out, kv_out]
        self.attn_norm = w.tensor(p + "attn_norm.weight", (o.hidden,))
        self.attn_qkv = w.linear(p + "attn_qkv.weight", q_out + 2 * kv_out, o.hidden)
        self.attn_output = w.linear(p + "attn_output.weight", o.hidden, q_out)
        self.ffn_norm = w.tensor(p + "ffn_norm.weight", (o.hidden,))
        self.ffn_up = w.linear(p + "ffn_up.weight", 2 * o.ffn, o.hidden)  # gate rows, up rows
        self.ffn_down = w.linear(p + "ffn_down.weight", o.hidden, o.ffn)

    def __call__(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: Cache,
        o: Phi3Options,
        outputs: torch.Tensor | None,
    ) -> torch.Tensor:
        q, k, v = self.attn_qkv(rms_norm(x, self.attn_norm, o.eps)).split(self.splits, dim=-1)
        q = o.rope.apply(q.unflatten(-1, (o.num_heads, o.head_dim)), *rope)  # (either set's
        k = o.rope.apply(k.unflatten(-1, (o.num_kv_heads, o.head_dim)), *rope)  # angles)
        v = v.unflatten(-1, (o.num_kv_heads, o.head_dim))
        h = attention(q, k, v, cache, scale=o.head_dim**-0.5)
        if outputs is not None:
            h, x = h[outputs], x[outputs]
        x = x + self.attn_output(h)
        gate, up = self.ffn_up(rms_norm(x, self.ffn_norm, o.eps)).chunk(2, dim=-1)
        return x + self.ffn_down(F.silu(gate) * up)


@register("phi3")
class Phi3:
    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        w = Weights(gguf)
        o = self.options = Phi3Options.from_config(config, w)
        self.vocab_size = w.vocab_size()
        self.context_length = o.context_length
        self.token_embd = w.embedding("token_embd.weight", self.vocab_size, o.hidden)
        self.blocks = [Block(w, i, o) for i in range(o.num_layers)]
        self.output_norm = w.tensor("output_norm.weight", (o.hidden,))
        self.output = w.output_head(self.vocab_size, o.hidden)

    def make_cache(self) -> Cache:
        def shift(layer: int, key: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
            return self.options.rope_for(cache).shift(key, delta)

        cache = CausalCache(window=self.options.window or None, shift=shift)
        return cache

    def forward(self, batch: Batch, cache: Cache) -> torch.Tensor:
        return self.logits(self.hidden(batch, cache))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.output(hidden)

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        o = self.options
        x = self.token_embd.lookup(torch.tensor(batch.tokens))  # (T, C)
        cos, sin = o.rope_for(cache).cos_sin(torch.tensor(batch.positions))
        rope = (cos * o.attn_factor, sin * o.attn_factor)  # a shift re-rotates without it
        outputs = torch.tensor(batch.outputs, dtype=torch.long)
        for i, block in enumerate(self.blocks):
            cache.set_layer(i)
            x = block(x, rope, cache, o, outputs if i == o.num_layers - 1 else None)
        return rms_norm(x, self.output_norm, o.eps)
