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
from ember.nn.moe import (
    ClampedSwiGLUExperts,
    GateUp,
    InterleavedGateUp,
    SeparateGateUp,
    mixture,
    top_k_softmax,
)
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
    def from_config(cls, c: Config, w: Weights) -> "GptOssOptions":
        hidden, num_heads = c.uint("embedding_length"), c.uint("attention.head_count")
        head_dim = c.uint("attention.key_length", hidden // num_heads)
        base = c.float("rope.freq_base", 150000.0)
        # Ollama's gptoss files give YaRN's factor without naming the type
        factor = c.float("rope.scaling.factor", 1.0)
        scaling = c.string("rope.scaling.type", "yarn" if factor > 1.0 else "none")
        factors, rope_scale = None, 1.0
        if scaling == "yarn":
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
            expert_ffn=c.uint(
                "expert_feed_forward_length", w.shape("blk.0.ffn_down_exps.weight")[-1]
            ),
            rope=RoPE(head_dim, base, True, factors=factors),
            rope_scale=rope_scale,
        )


class Block:
    """One layer, from llama.cpp's tensor names or Ollama's (fused `attn_qkv`, `attn_out`,
    `attn_sinks`, `ffn_norm`, interleaved `ffn_gate_up_exps`)."""

    def __init__(self, w: Weights, i: int, o: GptOssOptions) -> None:
        p, c = f"blk.{i}.", o.hidden
        self.splits = [o.num_heads * o.head_dim, *[o.num_kv_heads * o.head_dim] * 2]
        self.attn_norm = w.tensor(p + "attn_norm.weight", (c,))
        if w.has(p + "attn_qkv.weight"):
            self.attn_qkv = w.linear(p + "attn_qkv.weight", sum(self.splits), c)
            self.qkv_bias = w.tensor(p + "attn_qkv.bias", (sum(self.splits),))
        else:
            names = [p + f"attn_{n}.weight" for n in "qkv"]
            self.attn_qkv = w.fused(names, self.splits, c)
            biases = zip("qkv", self.splits, strict=True)
            self.qkv_bias = torch.cat([w.tensor(p + f"attn_{n}.bias", (s,)) for n, s in biases])
        out = p + ("attn_out" if w.has(p + "attn_out.weight") else "attn_output")
        self.attn_output = w.linear(out + ".weight", c, self.splits[0])
        self.attn_output_bias = w.tensor(out + ".bias", (c,))
        sinks = p + ("attn_sinks" if w.has(p + "attn_sinks") else "attn_sinks.weight")
        self.attn_sinks = w.tensor(sinks, (o.num_heads,))
        norm = p + ("ffn_norm" if w.has(p + "ffn_norm.weight") else "post_attention_norm")
        self.post_attention_norm = w.tensor(norm + ".weight", (c,))
        self.ffn_gate_inp = w.linear(p + "ffn_gate_inp.weight", o.num_experts, c)
        self.ffn_gate_inp_bias = w.tensor(p + "ffn_gate_inp.bias", (o.num_experts,))
        self.experts = ClampedSwiGLUExperts(
            _gate_up(w, p, o),
            w.experts(p + "ffn_down_exps.weight", o.num_experts, c, o.expert_ffn),
            w.tensor(p + "ffn_down_exps.bias", (o.num_experts, c)),
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


def _gate_up(w: Weights, p: str, o: GptOssOptions) -> GateUp:
    e, f, c = o.num_experts, o.expert_ffn, o.hidden
    if w.has(p + "ffn_gate_up_exps.weight"):
        fused = w.experts(p + "ffn_gate_up_exps.weight", e, 2 * f, c)
        return InterleavedGateUp(fused, w.tensor(p + "ffn_gate_up_exps.bias", (e, 2 * f)))
    gate, up = (w.experts(p + f"ffn_{n}_exps.weight", e, f, c) for n in ("gate", "up"))
    gate_bias, up_bias = (w.tensor(p + f"ffn_{n}_exps.bias", (e, f)) for n in ("gate", "up"))
    return SeparateGateUp(gate, up, gate_bias, up_bias)


@register("gpt-oss", "gptoss")
class GptOss:
    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        w = Weights(gguf)
        o = self.options = GptOssOptions.from_config(config, w)
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
