"""gpt-oss: pre-norm decoder whose even layers attend over a sliding window and odd ones over
everything, biased q/k/v/o with a learned sink logit per head (ember/nn/sinks.py), NeoX RoPE
with YaRN scaling, and in place of the MLP a biased top-k router whose chosen logits are
softmaxed, over experts with a clamped SwiGLU (ember/nn/moe.py)."""

from dataclasses import dataclass

import torch

from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.kvcache import Cache, CausalCache, WrapperCache
from ember.model.archs.llama import _rows
from ember.model.config import Config, ModelLoadError
from ember.model.registry import register
from ember.model.weights import Weights
from ember.nn import RoPE, Rotation, rms_norm
from ember.nn.moe import ClampedSwiGLUExperts, mixture, top_k_softmax
from ember.nn.sinks import sink_attention
from ember.nn.yarn import yarn_attention_factor, yarn_factors

SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0  # what llama.cpp and Ollama use for every gpt-oss


@dataclass(frozen=True, slots=True)
class GptOssOptions:
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    window: int
    context_length: int
    num_experts: int
    num_experts_used: int
    expert_ffn: int
    rope: RoPE
    rope_scale: float  # YaRN's factor on cosines and sines (1.0 without YaRN)

    @classmethod
    def from_config(cls, c: Config) -> "GptOssOptions":
        hidden, num_heads = c.uint("embedding_length"), c.uint("attention.head_count")
        head_dim = c.uint("attention.key_length", hidden // num_heads)
        base, scaling = c.float("rope.freq_base", 150000.0), c.string("rope.scaling.type", "none")
        factors, rope_scale = None, 1.0
        if scaling == "yarn":
            factor = c.float("rope.scaling.factor")
            original = c.uint("rope.scaling.original_context_length", maximum=1 << 28)
            factors = yarn_factors(head_dim, base, factor, original)
            rope_scale = yarn_attention_factor(factor)
        elif scaling != "none":
            raise ModelLoadError(f"gpt-oss: RoPE scaling {scaling!r} is not supported")
        num_experts = c.uint("expert_count", maximum=4096)
        return cls(
            num_layers=c.uint("block_count", maximum=1024),
            hidden=hidden,
            num_heads=num_heads,
            num_kv_heads=c.uint("attention.head_count_kv", num_heads),
            head_dim=head_dim,
            eps=c.float("attention.layer_norm_rms_epsilon", 1e-5),
            window=c.uint("attention.sliding_window", 128, maximum=1 << 28),
            context_length=c.uint("context_length", 131072, maximum=1 << 28),
            num_experts=num_experts,
            num_experts_used=c.uint("expert_used_count", maximum=num_experts),
            expert_ffn=c.uint("expert_feed_forward_length"),
            rope=RoPE(head_dim, base, True, factors=factors),
            rope_scale=rope_scale,
        )


class Block:
    def __init__(self, w: Weights, i: int, o: GptOssOptions) -> None:
        p, c, e, f = f"blk.{i}.", o.hidden, o.num_experts, o.expert_ffn
        self.splits = [o.num_heads * o.head_dim, *[o.num_kv_heads * o.head_dim] * 2]
        names = [p + f"attn_{n}.weight" for n in "qkv"]
        self.attn_norm = w.tensor(p + "attn_norm.weight", (c,))
        self.attn_qkv = w.fused(names, self.splits, c)
        self.qkv_bias = torch.cat(
            [w.tensor(p + f"attn_{n}.bias", (s,)) for n, s in zip("qkv", self.splits, strict=True)]
        )
        self.attn_output = w.linear(p + "attn_output.weight", c, self.splits[0])
        self.attn_output_bias = w.tensor(p + "attn_output.bias", (c,))
        self.attn_sinks = w.tensor(p + "attn_sinks.weight", (o.num_heads,))
        self.post_attention_norm = w.tensor(p + "post_attention_norm.weight", (c,))
        self.ffn_gate_inp = w.linear(p + "ffn_gate_inp.weight", e, c)
        self.ffn_gate_inp_bias = w.tensor(p + "ffn_gate_inp.bias", (e,))
        shapes = {"gate": (f, c), "up": (f, c), "down": (c, f)}
        self.experts = ClampedSwiGLUExperts(
            [w.experts(p + f"ffn_{n}_exps.weight", e, *s) for n, s in shapes.items()],
            [w.tensor(p + f"ffn_{n}_exps.bias", (e, s[0])) for n, s in shapes.items()],
            alpha=SWIGLU_ALPHA,
            limit=SWIGLU_LIMIT,
        )

    def __call__(
        self,
        x: torch.Tensor,
        rot: Rotation,
        cache: Cache,
        o: GptOssOptions,
        outputs: torch.Tensor | None,
    ) -> torch.Tensor:
        qkv = self.attn_qkv(rms_norm(x, self.attn_norm, o.eps)) + self.qkv_bias
        t, qk_size = qkv.shape[0], self.splits[0] + self.splits[1]
        qk = rot(qkv[:, :qk_size].view(t, -1, o.head_dim))  # (T, H + H_kv, D), q scaled
        v = qkv[:, qk_size:].view(t, o.num_kv_heads, o.head_dim)
        q, k = qk[:, : o.num_heads], qk[:, o.num_heads :]
        h = sink_attention(q, k, v, cache, scale=1.0, sinks=self.attn_sinks)
        if outputs is not None:
            h, x = h[outputs], x[outputs]
        x = x + self.attn_output(h) + self.attn_output_bias
        h = rms_norm(x, self.post_attention_norm, o.eps)
        routing = top_k_softmax(self.ffn_gate_inp(h) + self.ffn_gate_inp_bias, o.num_experts_used)
        return x + mixture(h, routing, self.experts)


@register("gpt-oss", "gptoss")
class GptOss:
    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        w = Weights(gguf)
        o = self.options = GptOssOptions.from_config(config)
        self.vocab_size = w.vocab_size()
        self.context_length = o.context_length
        self.token_embd = w.embedding("token_embd.weight", self.vocab_size, o.hidden)
        self.blocks = [Block(w, i, o) for i in range(o.num_layers)]
        self.output_norm = w.tensor("output_norm.weight", (o.hidden,))
        self.output = w.output_head(self.vocab_size, o.hidden)

    def make_cache(self) -> Cache:
        o = self.options
        caches = [CausalCache(window=o.window, shift=self.shift), CausalCache(shift=self.shift)]
        return WrapperCache(caches, [i % 2 for i in range(o.num_layers)])  # even layers slide

    def shift(self, layer: int, key: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return self.options.rope.shift(key, delta)

    def forward(self, batch: Batch, cache: Cache) -> torch.Tensor:
        return self.logits(self.hidden(batch, cache))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.output(hidden)

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        o = self.options
        x = self.token_embd.lookup(torch.tensor(batch.tokens))  # (T, C)
        s = o.rope_scale  # YaRN scales queries and keys alike
        groups = [(o.num_heads, o.head_dim**-0.5 * s), (o.num_kv_heads, s)]
        rot = o.rope.rotation(torch.tensor(batch.positions), o.head_dim, groups)
        outputs = _rows(batch)
        for i, block in enumerate(self.blocks):
            cache.set_layer(i)
            x = block(x, rot, cache, o, outputs if i == o.num_layers - 1 else None)
        return rms_norm(x, self.output_norm, o.eps)
