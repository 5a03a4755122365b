"""Gemma 3 (text): sliding-window layers with a local RoPE base, a global layer every sixth,
q/k norms, post-norms around attention and MLP, GELU-tanh MLP, embeddings scaled by sqrt(hidden).

The GGUF's norm weights already include Gemma's +1, so they are used as plain RMSNorm weights.
"""

from dataclasses import dataclass

import torch

from ember.backend.activation import gated_mlp
from ember.backend.layer import ACT_GELU_TANH, MAX_ROWS, LayerShape, NativeLayer
from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.kvcache import Cache, CausalCache, WrapperCache
from ember.model.config import Config
from ember.model.registry import register
from ember.model.weights import Weights
from ember.nn import RoPE, Rotation, attention, rms_norm
from ember.nn.native_layers import run_native
from ember.nn.rope import RopeRows

SLIDING, GLOBAL = 0, 1
LOCAL_ROPE_BASE = 10_000.0  # not in the file: Gemma 3's default
GLOBAL_EVERY = 6  # layers with (i + 1) % 6 == 0 attend globally (not in the file either)


@dataclass(frozen=True, slots=True)
class Gemma3Options:
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
    local_rope: RoPE
    global_rope: RoPE

    @classmethod
    def from_config(cls, c: Config) -> "Gemma3Options":
        hidden, num_heads = c.uint("embedding_length"), c.uint("attention.head_count")
        num_layers, head_dim = c.uint("block_count", maximum=1024), c.uint("attention.key_length")
        # Gemma 3 27B (62 layers) scales queries by hidden/heads instead of the head size.
        query_dim = hidden // num_heads if num_layers == 62 else head_dim
        scale = c.float("rope.scaling.factor", 1.0)
        local_base = c.float("rope.freq_base_swa", LOCAL_ROPE_BASE)  # llama.cpp's gemma-embedding
        return cls(
            num_layers=num_layers,
            hidden=hidden,
            num_heads=num_heads,
            num_kv_heads=c.uint("attention.head_count_kv", num_heads),
            head_dim=head_dim,
            ffn=c.uint("feed_forward_length"),
            eps=c.float("attention.layer_norm_rms_epsilon", 1e-6),
            window=c.uint("attention.sliding_window", 4096, maximum=1 << 28),
            context_length=c.uint("context_length", 32768, maximum=1 << 28),
            query_scale=query_dim**-0.5,
            local_rope=RoPE(head_dim, c.float("rope.local.freq_base", local_base), True),
            global_rope=RoPE(head_dim, c.float("rope.freq_base", 1_000_000.0), True, scale),
        )

    def layer_type(self, i: int) -> int:
        return GLOBAL if (i + 1) % GLOBAL_EVERY == 0 else SLIDING


class Block:
    def __init__(self, w: Weights, i: int, o: Gemma3Options) -> None:
        p = f"blk.{i}."
        self.is_global = o.layer_type(i) == GLOBAL
        self.splits = [o.num_heads * o.head_dim, *[o.num_kv_heads * o.head_dim] * 2]
        self.attn_norm = w.tensor(p + "attn_norm.weight", (o.hidden,))
        self.attn_qkv = w.fused(
            [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"], self.splits, o.hidden
        )
        self.qk_norms = (  # the q heads' norm weight, the k heads'
            w.tensor(p + "attn_q_norm.weight", (o.head_dim,)),
            w.tensor(p + "attn_k_norm.weight", (o.head_dim,)),
        )
        self.attn_output = w.linear(p + "attn_output.weight", o.hidden, o.num_heads * o.head_dim)
        self.post_attention_norm = w.tensor(p + "post_attention_norm.weight", (o.hidden,))
        self.ffn_norm = w.tensor(p + "ffn_norm.weight", (o.hidden,))
        self.ffn_gate_up = w.fused(
            [p + "ffn_gate.weight", p + "ffn_up.weight"], [o.ffn, o.ffn], o.hidden
        )
        self.ffn_down = w.linear(p + "ffn_down.weight", o.hidden, o.ffn)
        self.post_ffw_norm = w.tensor(p + "post_ffw_norm.weight", (o.hidden,))

    def native(self, o: Gemma3Options) -> NativeLayer | None:
        shape = LayerShape(
            hidden=o.hidden, heads=o.num_heads, kv_heads=o.num_kv_heads, head_dim=o.head_dim,
            value_dim=o.head_dim, ffn=o.ffn, rope_dim=o.head_dim, neox=True, eps=o.eps,
            scale=o.query_scale, act=ACT_GELU_TANH,
        )  # fmt: skip
        return NativeLayer.bind(
            shape, attn_norm=self.attn_norm, qkv=self.attn_qkv, attn_output=self.attn_output,
            q_norm=self.qk_norms[0], k_norm=self.qk_norms[1],
            post_attn_norm=self.post_attention_norm, ffn_norm=self.ffn_norm,
            gate_up=self.ffn_gate_up, down=self.ffn_down, post_ffn_norm=self.post_ffw_norm,
        )  # fmt: skip

    def __call__(
        self,
        x: torch.Tensor,
        rots: dict[int, Rotation],
        cache: Cache,
        o: Gemma3Options,
        outputs: torch.Tensor | None,
    ) -> torch.Tensor:
        qkv = self.attn_qkv(rms_norm(x, self.attn_norm, o.eps))
        t, qk_size = qkv.shape[0], self.splits[0] + self.splits[1]
        qk = rots[GLOBAL if self.is_global else SLIDING].heads_of(
            qkv, qk_size // o.head_dim, o.head_dim, self.qk_norms, o.eps
        )  # normalised, rotated, q scaled
        v = qkv[:, qk_size:].view(t, o.num_kv_heads, o.head_dim)
        h = attention(qk[:, : o.num_heads], qk[:, o.num_heads :], v, cache, scale=1.0)
        del qkv, qk, v  # dead from here: not held through the MLP (as llama.Block)
        if outputs is not None:
            h, x = h[outputs], x[outputs]
        x = x + rms_norm(self.attn_output(h), self.post_attention_norm, o.eps)
        del h
        normed = rms_norm(x, self.ffn_norm, o.eps)
        mlp = gated_mlp(normed, self.ffn_gate_up, self.ffn_down, "gelu_tanh")
        return x + rms_norm(mlp, self.post_ffw_norm, o.eps)


@register("gemma3")
class Gemma3:
    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        w = Weights(gguf)
        o = self.options = Gemma3Options.from_config(config)
        self.vocab_size = w.vocab_size()
        self.context_length = o.context_length
        self.token_embd = w.embedding("token_embd.weight", self.vocab_size, o.hidden)
        self.blocks = [Block(w, i, o) for i in range(o.num_layers)]
        self.output_norm = w.tensor("output_norm.weight", (o.hidden,))
        self.output = w.output_head(self.vocab_size, o.hidden)

    def make_cache(self) -> Cache:
        caches = [
            CausalCache(window=self.options.window, shift=self.shift),
            CausalCache(shift=self.shift),
        ]
        return WrapperCache(
            caches, [self.options.layer_type(i) for i in range(self.options.num_layers)]
        )

    def shift(self, layer: int, key: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        o = self.options
        rope = o.global_rope if o.layer_type(layer) == GLOBAL else o.local_rope
        return rope.shift(key, delta)

    def forward(self, batch: Batch, cache: Cache) -> torch.Tensor:
        return self.logits(self.hidden(batch, cache))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.output(hidden)

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        o = self.options
        x = self.token_embd.lookup(torch.tensor(batch.tokens)) * o.hidden**0.5  # (T, C)
        return self.layers(x, batch, cache)

    def native_layers(self) -> list[NativeLayer] | None:
        """The blocks bound for the native layer call (once), or None where they cannot be."""
        if not hasattr(self, "_native"):
            layers = [b.native(self.options) for b in self.blocks]
            self._native = None if None in layers else layers
        return self._native  # type: ignore[return-value]

    def layers(self, x: torch.Tensor, batch: Batch, cache: Cache) -> torch.Tensor:
        """The blocks and final norm over embeddings x (T, C) of batch's tokens: a small batch
        through the native layers where they run, else through the Python blocks."""
        o = self.options
        if len(batch) <= MAX_ROWS:
            if not hasattr(self, "_rope_rows"):
                self._rope_rows = RopeRows(o.local_rope), RopeRows(o.global_rope)
            local, world = (rows(batch.positions) for rows in self._rope_rows)
            kinds = [o.layer_type(i) for i in range(o.num_layers)]
            done = run_native(
                self.native_layers(), x, cache, lambda i: world if kinds[i] == GLOBAL else local
            )
            if done is not None:
                rows = _rows(batch)
                return rms_norm(done if rows is None else done[rows], self.output_norm, o.eps)
        positions = torch.tensor(batch.positions)
        groups = [(o.num_heads, o.query_scale), (o.num_kv_heads, 1.0)]
        rots = {
            SLIDING: o.local_rope.rotation(positions, o.head_dim, groups),
            GLOBAL: o.global_rope.rotation(positions, o.head_dim, groups),
        }
        outputs = _rows(batch)
        for i, block in enumerate(self.blocks):
            cache.set_layer(i)
            x = block(x, rots, cache, o, outputs if i == o.num_layers - 1 else None)
        return rms_norm(x, self.output_norm, o.eps)


def _rows(batch: Batch) -> torch.Tensor | None:
    """The batch's output rows; None when they are all its rows in order (nothing to pick)."""
    if batch.outputs == tuple(range(len(batch))):
        return None
    return torch.tensor(batch.outputs, dtype=torch.long)
