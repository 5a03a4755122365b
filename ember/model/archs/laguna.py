"""Laguna (Poolside's; Ollama's `laguna`): a pre-norm decoder of grouped-query attention with
QK-norm, each layer's own count of query heads (`attention.head_count`, an array), the output of
each head gated by softplus(`attn_g` x) (`attention.gating_type` 1), sliding-window layers
(`attention.sliding_window_pattern`) with their own RoPE (`rope.swa.*`) beside full layers whose
RoPE may take YaRN, both NeoX over the first `dimension_count` dims of a head; the MLPs after
the dense layers (`leading_dense_block_count`, `dense_layers`) are mixtures of experts: sigmoid
scores, the top k chosen with `exp_probs_b`, normalized and scaled, plus a shared expert.

Where the keys leave a choice, Ollama's reading: no attention sinks, QK-norm required, every
`decoder_sparse_step`-th layer a mixture. YaRN multiplies the full layers' cosines and sines by
`rope.scaling.attn_factor` (0.1 ln factor + 1 without it) as HF's Laguna does."""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.kvcache import Cache, CausalCache, WrapperCache
from ember.model.archs.llama import _rows
from ember.model.config import Config, ModelLoadError
from ember.model.mlp import ScoredMixture, SwiGLU
from ember.model.registry import register
from ember.model.stack import DecoderStack, PreNormBlock
from ember.model.weights import Weights
from ember.nn import RoPE, attention, rms_norm
from ember.nn.yarn import yarn_factors

SLIDING, FULL = 0, 1  # the caches of WrapperCache


@dataclass(frozen=True, slots=True)
class LagunaOptions:
    num_layers: int
    hidden: int
    num_heads: tuple[int, ...]
    num_kv_heads: int
    head_dim: int
    eps: float
    context_length: int
    window: int
    sliding: tuple[bool, ...]
    rope: RoPE  # full layers
    rope_scale: float  # YaRN's factor on the full layers' cosines and sines
    local_rope: RoPE  # sliding-window layers
    moe: tuple[bool, ...]  # which layers' MLPs are mixtures
    num_experts: int
    num_experts_used: int
    is_normalized: bool
    expert_scale: float

    @classmethod
    def from_config(cls, c: Config) -> "LagunaOptions":
        if c.bool("attention.sink_enabled", False):
            raise ModelLoadError("laguna: attention sinks are not supported")
        per_head = c.uint("attention.gating_type", 1, maximum=8) == 1
        if not per_head or not c.bool("attention.qk_norm", True):
            raise ModelLoadError("laguna: only per-head gating and QK-norm are supported")
        if c.uint("expert_gating_func", 2, maximum=8) != 2:
            raise ModelLoadError("laguna: only sigmoid expert gating is supported")
        num_layers, hidden = c.uint("block_count", maximum=1024), c.uint("embedding_length")
        head_dim = c.uint("attention.key_length")
        num_kv_heads = c.uint("attention.head_count_kv")
        num_heads = c.per_layer("attention.head_count", num_layers)
        if any(not h or h % num_kv_heads for h in num_heads):
            raise ModelLoadError("laguna: each layer's head_count must divide by head_count_kv")
        sliding = c.bools("attention.sliding_window_pattern", num_layers) or (False,) * num_layers
        num_experts = c.count("expert_count", maximum=4096)
        dense = set(c.metadata.get(f"{c.arch}.dense_layers") or ())
        dense |= set(range(int(c.metadata.get(f"{c.arch}.leading_dense_block_count") or 0)))
        step = c.uint("decoder_sparse_step", 1, maximum=1024)
        moe = tuple(bool(num_experts) and i not in dense and (i + 1) % step == 0
                    for i in range(num_layers))  # fmt: skip
        rope, rope_scale = _full_rope(c, head_dim)
        return cls(
            num_layers=num_layers,
            hidden=hidden,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            eps=c.float("attention.layer_norm_rms_epsilon", 1e-6),
            context_length=c.uint("context_length", 131072, maximum=1 << 28),
            window=c.uint("attention.sliding_window", 512, maximum=1 << 28),
            sliding=sliding,
            rope=rope,
            rope_scale=rope_scale,
            local_rope=_sliding_rope(c, head_dim),
            moe=moe,
            num_experts=num_experts,
            num_experts_used=c.uint("expert_used_count", maximum=num_experts) if num_experts else 0,
            is_normalized=c.bool("expert_weights_norm", True),
            expert_scale=c.float("expert_weights_scale", 1.0),
        )

    def layer_rope(self, i: int) -> RoPE:
        return self.local_rope if self.sliding[i] else self.rope


def _sliding_rope(c: Config, head_dim: int) -> RoPE:
    dim, base = c.uint("rope.swa.dimension_count", head_dim), c.float("rope.swa.freq_base", 1e4)
    return RoPE(dim, base, True, scale=c.float("rope.swa.scaling.factor", 1.0))


def _full_rope(c: Config, head_dim: int) -> tuple[RoPE, float]:
    dim, base = c.uint("rope.dimension_count", head_dim), c.float("rope.freq_base", 500000.0)
    factor = c.float("rope.scaling.factor", 1.0)
    kind = c.string("rope.scaling.type", "yarn" if factor > 1.0 else "none")
    if kind == "none" or factor <= 1.0:
        return RoPE(dim, base, True), 1.0
    if kind != "yarn":
        raise ModelLoadError(f"laguna: RoPE scaling {kind!r} is not supported")
    original = c.uint("rope.scaling.original_context_length", 4096, maximum=1 << 28)
    fast, slow = c.float("rope.scaling.beta_fast", 64.0), c.float("rope.scaling.beta_slow", 1.0)
    factors = yarn_factors(dim, base, factor, original, beta_fast=fast, beta_slow=slow)
    scale = c.float("rope.scaling.attn_factor", 0.0) or 0.1 * math.log(factor) + 1.0
    return RoPE(dim, base, True, factors=factors), scale


class GatedAttention:
    def __init__(self, w: Weights, p: str, i: int, o: LagunaOptions) -> None:
        c, d = o.hidden, o.head_dim
        self.heads = o.num_heads[i]
        self.splits = [self.heads * d, o.num_kv_heads * d, o.num_kv_heads * d]
        self.qkv = w.fused([p + f"attn_{n}.weight" for n in "qkv"], self.splits, c)
        self.gate = w.linear(p + "attn_g.weight", self.heads, c)
        self.q_norm = w.tensor(p + "attn_q_norm.weight", (d,))
        self.k_norm = w.tensor(p + "attn_k_norm.weight", (d,))
        self.output = w.linear(p + "attn_output.weight", c, self.splits[0])

    def __call__(
        self, x: torch.Tensor, rope: RoPE, cos_sin: tuple[torch.Tensor, torch.Tensor],
        cache: Cache, o: LagunaOptions,
    ) -> torch.Tensor:  # fmt: skip
        q, k, v = self.qkv(x).split(self.splits, dim=-1)
        q = rms_norm(q.unflatten(-1, (self.heads, o.head_dim)), self.q_norm, o.eps)
        k = rms_norm(k.unflatten(-1, (o.num_kv_heads, o.head_dim)), self.k_norm, o.eps)
        q, k = rope.apply(q, *cos_sin), rope.apply(k, *cos_sin)
        v = v.unflatten(-1, (o.num_kv_heads, o.head_dim))
        h = attention(q, k, v, cache, scale=o.head_dim**-0.5).unflatten(-1, (self.heads, -1))
        return self.output((h * F.softplus(self.gate(x))[..., None]).flatten(-2))


class Block(PreNormBlock):
    def __init__(self, w: Weights, i: int, o: LagunaOptions) -> None:
        p, c = f"blk.{i}.", o.hidden
        self.attn_norm = w.tensor(p + "attn_norm.weight", (c,))
        self.attention = GatedAttention(w, p, i, o)
        self.ffn_norm = w.tensor(p + "ffn_norm.weight", (c,))
        if o.moe[i]:
            self.ffn: SwiGLU | ScoredMixture = ScoredMixture(
                w, p, c, o.num_experts, o.num_experts_used, sigmoid=True,
                is_normalized=o.is_normalized, scale=o.expert_scale,
            )  # fmt: skip
        else:
            self.ffn = SwiGLU(w, p, "", c)

    def __call__(
        self,
        x: torch.Tensor,
        rope: RoPE,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        cache: Cache,
        o: LagunaOptions,
        outputs: torch.Tensor | None,
    ) -> torch.Tensor:
        h = self.attention(rms_norm(x, self.attn_norm, o.eps), rope, cos_sin, cache, o)
        return self.residual(x, h, o.eps, outputs)


@register("laguna")
class Laguna(DecoderStack):
    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        w = Weights(gguf)
        o = self.options = LagunaOptions.from_config(config)
        self.load_stack(w, o.hidden, o.context_length, o.num_layers, lambda i: Block(w, i, o))

    def make_cache(self) -> Cache:
        o = self.options
        if not any(o.sliding):
            return CausalCache(shift=self.shift)
        caches = [CausalCache(window=o.window, shift=self.shift), CausalCache(shift=self.shift)]
        return WrapperCache(caches, [SLIDING if s else FULL for s in o.sliding])

    def shift(self, layer: int, key: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return self.options.layer_rope(layer).shift(key, delta)

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        o = self.options
        x = self.embed(batch)
        positions = torch.tensor(batch.positions)
        cos, sin = o.rope.cos_sin(positions)
        full = (cos * o.rope_scale, sin * o.rope_scale)
        local = o.local_rope.cos_sin(positions)
        outputs = _rows(batch)
        for i, block in enumerate(self.blocks):
            cache.set_layer(i)
            rope, cos_sin = (o.local_rope, local) if o.sliding[i] else (o.rope, full)
            x = block(x, rope, cos_sin, cache, o, outputs if i == o.num_layers - 1 else None)
        return rms_norm(x, self.output_norm, o.eps)
