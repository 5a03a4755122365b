"""LFM2 (Liquid's hybrid): a pre-norm decoder whose layers are either grouped-query attention
(QK-norm over each head, NeoX RoPE) or a gated short convolution, each followed by a SwiGLU MLP.
Which is which: `attention.head_count_kv`, an array with 0 on the convolution layers (llama.cpp's
and Ollama's files).

The short convolution (`shortconv`): `in_proj` gives B, C and x; B * x goes through a depthwise
causal convolution of `shortconv.l_cache` taps over the sequence; C gates its output, then
`out_proj`. Its state, the last inputs of each sequence, is kept by ember/kvcache/conv_state.py,
beside the attention layers' KV cache. The final norm is `token_embd_norm` (llama.cpp's name;
`output_norm` too), the head tied to the embeddings unless the file has `output`.

LFM2-MoE (`lfm2moe`): after `leading_dense_block_count` dense layers the MLP is a mixture of
experts without a shared one: sigmoid scores, the top k chosen with `exp_probs_b` added,
normalized (`expert_weights_norm`) and scaled (ember/model/mlp.py's ScoredMixture)."""

from dataclasses import dataclass

import torch

from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.kvcache import Cache, CausalCache, ConvStateCache, WrapperCache
from ember.model.archs.llama import _rows
from ember.model.config import Config, ModelLoadError
from ember.model.mlp import ScoredMixture, SwiGLU
from ember.model.registry import register
from ember.model.stack import DecoderStack, PreNormBlock
from ember.model.weights import Weights
from ember.nn import RoPE, attention, rms_norm

ATTENTION, CONVOLUTION = 0, 1  # the caches of WrapperCache


@dataclass(frozen=True, slots=True)
class Lfm2Options:
    num_layers: int
    hidden: int
    num_heads: tuple[int, ...]
    num_kv_heads: tuple[int, ...]  # 0: a convolution layer
    head_dim: int
    eps: float
    context_length: int
    kernel: int
    rope: RoPE
    num_experts: int  # 0: dense MLPs only
    num_experts_used: int
    leading_dense: int
    sigmoid: bool
    is_normalized: bool
    expert_scale: float

    @classmethod
    def from_config(cls, c: Config) -> "Lfm2Options":
        hidden, num_layers = c.uint("embedding_length"), c.uint("block_count", maximum=1024)
        num_heads = c.per_layer("attention.head_count", num_layers)
        num_kv_heads = c.per_layer("attention.head_count_kv", num_layers)
        attention_layers = [i for i, kv in enumerate(num_kv_heads) if kv]
        if any(num_heads[i] % num_kv_heads[i] for i in attention_layers):
            raise ModelLoadError("lfm2: head_count must be a multiple of head_count_kv")
        heads = max(num_heads)
        head_dim = c.uint("attention.key_length", hidden // heads if heads else 1)
        base = c.float("rope.freq_base", 1e6)
        num_experts = c.uint("expert_count", maximum=4096) if c.metadata.get(
            f"{c.arch}.expert_count") else 0  # fmt: skip
        return cls(
            num_layers=num_layers,
            hidden=hidden,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            eps=c.float("attention.layer_norm_rms_epsilon", 1e-5),
            context_length=c.uint("context_length", 128000, maximum=1 << 28),
            kernel=c.uint("shortconv.l_cache", 3, maximum=64),
            rope=RoPE(c.uint("rope.dimension_count", head_dim), base, True),
            num_experts=num_experts,
            num_experts_used=c.uint("expert_used_count", maximum=num_experts) if num_experts else 0,
            leading_dense=int(c.metadata.get(f"{c.arch}.leading_dense_block_count") or 0),
            sigmoid=c.uint("expert_gating_func", 2, maximum=2) == 2,  # LFM2-MoE's own router
            is_normalized=c.bool("expert_weights_norm", True),
            expert_scale=c.float("expert_weights_scale", 1.0),
        )

    def is_attention(self, layer: int) -> bool:
        return self.num_kv_heads[layer] > 0


class Attention:
    def __init__(self, w: Weights, p: str, i: int, o: Lfm2Options) -> None:
        c, d = o.hidden, o.head_dim
        self.heads, self.kv_heads = o.num_heads[i], o.num_kv_heads[i]
        self.splits = [self.heads * d, self.kv_heads * d, self.kv_heads * d]
        self.qkv = w.fused([p + f"attn_{n}.weight" for n in "qkv"], self.splits, c)
        self.q_norm = w.tensor(p + "attn_q_norm.weight", (d,))
        self.k_norm = w.tensor(p + "attn_k_norm.weight", (d,))
        self.output = w.linear(p + "attn_output.weight", c, self.splits[0])

    def __call__(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: Cache,
        o: Lfm2Options,
    ) -> torch.Tensor:  # fmt: skip
        q, k, v = self.qkv(x).split(self.splits, dim=-1)
        q = rms_norm(q.unflatten(-1, (self.heads, o.head_dim)), self.q_norm, o.eps)
        k = rms_norm(k.unflatten(-1, (self.kv_heads, o.head_dim)), self.k_norm, o.eps)
        q, k = o.rope.apply(q, *rope), o.rope.apply(k, *rope)
        v = v.unflatten(-1, (self.kv_heads, o.head_dim))
        return self.output(attention(q, k, v, cache, scale=o.head_dim**-0.5))


class ShortConv:
    def __init__(self, w: Weights, p: str, o: Lfm2Options) -> None:
        c = o.hidden
        self.in_proj = w.linear(p + "shortconv.in_proj.weight", 3 * c, c)
        self.conv = w.tensor(p + "shortconv.conv.weight", (c, o.kernel))
        self.out_proj = w.linear(p + "shortconv.out_proj.weight", c, c)

    def __call__(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: Cache,
        o: Lfm2Options,
    ) -> torch.Tensor:  # fmt: skip
        b, gate, u = self.in_proj(x).chunk(3, dim=-1)
        state = cache.current if isinstance(cache, WrapperCache) else cache
        if not isinstance(state, ConvStateCache):
            raise TypeError("lfm2's convolution layers need their ConvStateCache")
        return self.out_proj(gate * state.convolve(b * u, self.conv))


class Block(PreNormBlock):
    def __init__(self, w: Weights, i: int, o: Lfm2Options) -> None:
        p, c = f"blk.{i}.", o.hidden
        self.attn_norm = w.tensor(p + "attn_norm.weight", (c,))
        self.operator = Attention(w, p, i, o) if o.is_attention(i) else ShortConv(w, p, o)
        self.ffn_norm = w.tensor(p + "ffn_norm.weight", (c,))
        if not o.num_experts or i < o.leading_dense:
            self.ffn: SwiGLU | ScoredMixture = SwiGLU(w, p, "", c)
        else:
            self.ffn = ScoredMixture(
                w, p, c, o.num_experts, o.num_experts_used, sigmoid=o.sigmoid,
                is_normalized=o.is_normalized, scale=o.expert_scale,
            )  # fmt: skip

    def __call__(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: Cache,
        o: Lfm2Options,
        outputs: torch.Tensor | None,
    ) -> torch.Tensor:
        h = self.operator(rms_norm(x, self.attn_norm, o.eps), rope, cache, o)
        return self.residual(x, h, o.eps, outputs)


@register("lfm2", "lfm2moe")
class Lfm2(DecoderStack):
    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        w = Weights(gguf)
        o = self.options = Lfm2Options.from_config(config)
        norm = "token_embd_norm.weight" if w.has("token_embd_norm.weight") else "output_norm.weight"
        self.load_stack(
            w, o.hidden, o.context_length, o.num_layers, lambda i: Block(w, i, o), norm
        )

    def make_cache(self) -> Cache:
        o = self.options
        caches: list[Cache] = [CausalCache(shift=self.shift), ConvStateCache(o.kernel)]
        types = [ATTENTION if o.is_attention(i) else CONVOLUTION for i in range(o.num_layers)]
        return WrapperCache(caches, types)

    def shift(self, layer: int, key: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return self.options.rope.shift(key, delta)

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        o = self.options
        x = self.embed(batch)
        rope = o.rope.cos_sin(torch.tensor(batch.positions))
        outputs = _rows(batch)
        for i, block in enumerate(self.blocks):
            cache.set_layer(i)
            x = block(x, rope, cache, o, outputs if i == o.num_layers - 1 else None)
        return rms_norm(x, self.output_norm, o.eps)

