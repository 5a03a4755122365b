"""Llama (also Mistral and SmolLM): pre-norm decoder, grouped-query attention, SwiGLU MLP.

llama.cpp's converter permutes the Q and K rows of llama-family files for ggml's "normal" RoPE
(adjacent pairs), so this file rotates pairs; qwen2.py reuses it with NeoX RoPE and biases.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ember.backend.activation import gated_mlp
from ember.backend.layer import MAX_ROWS, LayerShape, NativeLayer
from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.kvcache import Cache, CausalCache
from ember.model.config import Config
from ember.model.registry import register
from ember.model.weights import Weights
from ember.nn import RoPE, Rotation, attention, rms_norm
from ember.nn.native_layers import run_native
from ember.nn.rope import RopeRows
from ember.nn.yarn import yarn_attention_factor, yarn_factors


@dataclass(frozen=True, slots=True)
class LlamaOptions:
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    value_dim: int
    ffn: int
    eps: float
    context_length: int
    rope: RoPE

    @classmethod
    def from_config(cls, c: Config, w: Weights, *, is_neox: bool) -> "LlamaOptions":
        hidden, num_heads = c.uint("embedding_length"), c.uint("attention.head_count")
        head_dim = c.uint("attention.key_length", hidden // num_heads)
        rope = llama_rope(c, w, head_dim, is_neox=is_neox)
        return cls(
            num_layers=c.uint("block_count", maximum=1024),
            hidden=hidden,
            num_heads=num_heads,
            num_kv_heads=c.uint("attention.head_count_kv", num_heads),
            head_dim=head_dim,
            value_dim=c.uint("attention.value_length", head_dim),
            ffn=c.uint("feed_forward_length"),
            eps=c.float("attention.layer_norm_rms_epsilon", 1e-5),
            context_length=c.uint("context_length", 2048, maximum=1 << 28),
            rope=rope,
        )


def llama_rope(c: Config, w: Weights, head_dim: int, *, is_neox: bool) -> RoPE:
    """RoPE as llama-family files give it: linear scaling or YaRN (Qwen 2.5's and Qwen 3's
    long-context setting, as llama.cpp applies it) by its keys, llama 3's scaling as
    per-frequency divisors in the `rope_freqs` tensor."""
    scaling = c.string("rope.scaling.type", "none")
    factor = c.float("rope.scaling.factor", 1.0)
    rope_dim = c.uint("rope.dimension_count", head_dim)
    base = c.float("rope.freq_base", 10000.0)
    if scaling == "yarn" and factor > 1.0:
        context = c.uint("context_length", 2048, maximum=1 << 28)
        original = c.uint("rope.scaling.original_context_length", context, maximum=1 << 28)
        magnitude = c.float("rope.scaling.attn_factor", yarn_attention_factor(factor))
        return RoPE(rope_dim, base, is_neox, factors=yarn_factors(rope_dim, base, factor, original),
                    magnitude=magnitude)  # fmt: skip
    scale = factor if scaling == "linear" else 1.0
    factors = w.optional("rope_freqs.weight", (rope_dim // 2,))  # llama 3.1 long-context
    return RoPE(rope_dim, base, is_neox, scale, factors)


def layer_shape(o: LlamaOptions) -> LayerShape:
    """A llama-family layer's shape for the native layer call."""
    return LayerShape(
        hidden=o.hidden, heads=o.num_heads, kv_heads=o.num_kv_heads, head_dim=o.head_dim,
        value_dim=o.value_dim, ffn=o.ffn, rope_dim=o.rope.dim, neox=o.rope.is_neox, eps=o.eps,
        scale=o.head_dim**-0.5,
    )  # fmt: skip


class Block:
    """One decoder layer, its weights named as in the GGUF (`blk.N.*`)."""

    def __init__(self, w: Weights, i: int, o: LlamaOptions) -> None:
        p, q_out = f"blk.{i}.", o.num_heads * o.head_dim
        kv_outs = [o.num_kv_heads * o.head_dim, o.num_kv_heads * o.value_dim]
        self.splits = [q_out, *kv_outs]
        self.attn_norm = w.tensor(p + "attn_norm.weight", (o.hidden,))
        self.attn_qkv = w.fused(
            [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"], self.splits, o.hidden
        )
        biases = [
            w.optional(p + f"attn_{n}.bias", (s,)) for n, s in zip("qkv", self.splits, strict=True)
        ]
        self.qkv_bias = _cat_all(biases)
        self.attn_output = w.linear(p + "attn_output.weight", o.hidden, o.num_heads * o.value_dim)
        self.ffn_norm = w.tensor(p + "ffn_norm.weight", (o.hidden,))
        self.ffn_gate_up = w.fused(
            [p + "ffn_gate.weight", p + "ffn_up.weight"], [o.ffn, o.ffn], o.hidden
        )
        self.ffn_down = w.linear(p + "ffn_down.weight", o.hidden, o.ffn)

    def native(self, o: LlamaOptions) -> NativeLayer | None:
        return NativeLayer.bind(
            layer_shape(o), attn_norm=self.attn_norm, qkv=self.attn_qkv, qkv_bias=self.qkv_bias,
            attn_output=self.attn_output, ffn_norm=self.ffn_norm, gate_up=self.ffn_gate_up,
            down=self.ffn_down,
        )  # fmt: skip

    def __call__(
        self,
        x: torch.Tensor,
        rot: Rotation,
        cache: Cache,
        o: LlamaOptions,
        outputs: torch.Tensor | None,
    ) -> torch.Tensor:
        qkv = self.attn_qkv(rms_norm(x, self.attn_norm, o.eps))
        if self.qkv_bias is not None:
            qkv = qkv + self.qkv_bias
        t, qk_size = qkv.shape[0], self.splits[0] + self.splits[1]
        qk = rot.heads_of(qkv, qk_size // o.head_dim, o.head_dim)  # q (scaled), k: (T, N, D)
        v = qkv[:, qk_size:].view(t, o.num_kv_heads, o.value_dim)
        h = attention(qk[:, : o.num_heads], qk[:, o.num_heads :], v, cache, scale=1.0)
        # dead from here: not held through the MLP (the 3B-shaped file's 512-token prompt: the
        # heap's high-water 256 -> 217 MB)
        del qkv, qk, v
        if outputs is not None:  # last layer: only the rows whose logits are wanted go on
            h, x = h[outputs], x[outputs]
        x = x + self.attn_output(h)
        del h
        normed = rms_norm(x, self.ffn_norm, o.eps)
        return x + gated_mlp(normed, self.ffn_gate_up, self.ffn_down, "silu")


class Llama:
    is_neox_rope = False

    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        w = Weights(gguf)
        o = self.options = LlamaOptions.from_config(config, w, is_neox=self.is_neox_rope)
        self.vocab_size = w.vocab_size()
        self.context_length = o.context_length
        self.token_embd = w.embedding("token_embd.weight", self.vocab_size, o.hidden)
        self.blocks = [Block(w, i, o) for i in range(o.num_layers)]
        self.output_norm = w.tensor("output_norm.weight", (o.hidden,))
        self.output = w.output_head(self.vocab_size, o.hidden)

    def make_cache(self) -> Cache:
        return CausalCache(shift=self.shift)

    def native_layers(self) -> list[NativeLayer] | None:
        """The blocks bound for the native layer call (once), or None where they cannot be."""
        if not hasattr(self, "_native"):
            self._native = _native_of(self)
        return self._native

    def shift(self, layer: int, key: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return self.options.rope.shift(key, delta)

    def forward(self, batch: Batch, cache: Cache) -> torch.Tensor:
        return self.logits(self.hidden(batch, cache))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.output(hidden)

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        return self.layers(self.token_embd.lookup(torch.tensor(batch.tokens)), batch, cache)

    def rope_positions(self, batch: Batch) -> torch.Tensor:
        """Each token's RoPE position (T,): its cache position (M-RoPE models differ)."""
        return torch.tensor(batch.positions)

    def native_rope(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The native layers' (cos, sin) tables (T, dim/2) of the batch's tokens."""
        if not hasattr(self, "_rope_rows"):
            self._rope_rows = RopeRows(self.options.rope)
        return self._rope_rows(batch.positions)

    def layers(
        self, x: torch.Tensor, batch: Batch, cache: Cache, added: Sequence[torch.Tensor] = ()
    ) -> torch.Tensor:
        """The blocks and final norm over embeddings x (T, C) of batch's tokens: a small batch
        through the native layers where they run, else through the Python blocks. added[i]
        (T, C), where given, is added to block i's output (Qwen3-VL's deepstack)."""
        o = self.options
        outputs = _rows(batch)
        if len(batch) <= MAX_ROWS and not added:
            tables = self.native_rope(batch)
            done = run_native(self.native_layers(), x, cache, lambda i: tables)
            if done is not None:
                x = done if outputs is None else done[outputs]
                return rms_norm(x, self.output_norm, o.eps)
        positions = self.rope_positions(batch)
        groups = [(o.num_heads, o.head_dim**-0.5), (o.num_kv_heads, 1.0)]
        rot = o.rope.rotation(positions, o.head_dim, groups)
        for i, block in enumerate(self.blocks):
            cache.set_layer(i)
            last = i == o.num_layers - 1
            x = with_added(block(x, rot, cache, o, outputs if last else None), added, i,
                           outputs if last else None)  # fmt: skip
        return rms_norm(x, self.output_norm, o.eps)


def _native_of(model: Llama) -> list[NativeLayer] | None:
    """Every block bound for the native layer call, or None unless every block can be (a block
    says how by a `native(options)` method; one without, e.g. a mixture of experts, cannot)."""
    binders = [getattr(b, "native", None) for b in model.blocks]
    if None in binders:
        return None
    layers = [bind(model.options) for bind in binders]  # type: ignore[misc]
    return None if None in layers else layers  # type: ignore[return-value]


def with_added(
    x: torch.Tensor, added: Sequence[torch.Tensor], i: int, rows: torch.Tensor | None
) -> torch.Tensor:
    """Layer i's output x plus added[i] where given (at `rows` where the layer kept only the
    output rows)."""
    if i >= len(added):
        return x
    return x + (added[i] if rows is None else added[i][rows])


def _rows(batch: Batch) -> torch.Tensor | None:
    """The batch's output rows; None when they are all its rows in order (nothing to pick)."""
    if batch.outputs == tuple(range(len(batch))):
        return None
    return torch.tensor(batch.outputs, dtype=torch.long)


def _cat_all(parts: list[torch.Tensor | None]) -> torch.Tensor | None:
    """The parts joined, or None unless every part is present."""
    present = [t for t in parts if t is not None]
    return torch.cat(present) if len(present) == len(parts) else None


register("llama", "mistral")(Llama)
