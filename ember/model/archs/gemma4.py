"""Gemma 4 (text; Ollama's `gemma4`): Gemma 3's sandwich of norms around attention and a GELU MLP,
with each layer type's own heads: sliding-window layers of `key_length_swa` dims and their RoPE
base (`rope.freq_base_swa`), full layers of `key_length` dims, their own count of KV heads where
the file gives one per layer, and proportional RoPE (`rope_freqs`: the pairs past the rotated
quarter get a divisor of 1e30, so they pass through). Queries and keys are RMS-normed with weights,
values without; the attention takes no scale. Where a full layer has no `attn_v`, its values are
its raw keys. The last `attention.shared_kv_layers` layers compute no keys: each reads those of
the last earlier layer of its type. Per-layer embeddings (`embedding_length_per_layer_input`): a
second table and a projection of the embeddings give each layer a small input, gated into the
residual after the MLP. Mixture layers run a dense MLP and a routed one side by side. Each layer
ends scaled by `layer_output_scale`, and the logits may be softcapped."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from ember.backend.activation import gated_mlp
from ember.backend.weights import AnyLinear
from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.kvcache import Cache, CausalCache, WrapperCache
from ember.model.archs.llama import _rows
from ember.model.config import Config, ModelLoadError
from ember.model.stack import DecoderStack
from ember.model.weights import Weights
from ember.nn import RoPE, rms_norm
from ember.nn.attention import attend, attention
from ember.nn.moe import Routing, mixture
from ember.nn.softcap import softcap

SLIDING, FULL = 0, 1  # the caches of WrapperCache


@dataclass(frozen=True, slots=True)
class Gemma4Options:
    num_layers: int
    hidden: int
    num_heads: int
    kv_heads: tuple[int, ...]  # each layer's
    head_dims: tuple[int, ...]  # each layer's (sliding: key_length_swa, full: key_length)
    sliding: tuple[bool, ...]
    donors: dict[int, int]  # shared layer -> the layer whose keys and values it reads
    eps: float
    window: int
    context_length: int
    local_rope: RoPE
    rope: RoPE
    per_layer_dim: int  # 0: no per-layer embeddings
    num_experts: int
    num_experts_used: int
    final_softcap: float

    @classmethod
    def from_config(cls, c: Config, rope_freqs: torch.Tensor | None) -> "Gemma4Options":
        n, hidden = c.uint("block_count", maximum=1024), c.uint("embedding_length")
        full_dim = c.uint("attention.key_length", 512)
        swa_dim = c.uint("attention.key_length_swa", 256)
        sliding = c.bools("attention.sliding_window_pattern", n) or (False,) * n
        kv = c.per_layer("attention.head_count_kv", n)
        if (global_kv := c.uint("attention.global_head_count_kv", 0)) and not isinstance(
            c.metadata.get(f"{c.arch}.attention.head_count_kv"), list
        ):  # fmt: skip
            kv = tuple(h if s else global_kv for h, s in zip(kv, sliding, strict=True))
        num_experts = c.count("expert_count", maximum=4096)
        return cls(
            num_layers=n,
            hidden=hidden,
            num_heads=c.uint("attention.head_count"),
            kv_heads=kv,
            head_dims=tuple(swa_dim if s else full_dim for s in sliding),
            sliding=sliding,
            donors=shared_kv_donors(sliding, c.count("attention.shared_kv_layers", maximum=n - 1)),
            eps=c.float("attention.layer_norm_rms_epsilon", 1e-6),
            window=c.uint("attention.sliding_window", 512, maximum=1 << 28),
            context_length=c.uint("context_length", 131072, maximum=1 << 28),
            local_rope=RoPE(swa_dim, _local_base(c), True),
            rope=_full_rope(c, full_dim, rope_freqs),
            per_layer_dim=c.count("embedding_length_per_layer_input", maximum=1 << 16),
            num_experts=num_experts,
            num_experts_used=c.uint("expert_used_count", maximum=num_experts) if num_experts else 0,
            final_softcap=c.float("final_logit_softcapping", 0.0),
        )

    def layer_rope(self, i: int) -> RoPE:
        return self.local_rope if self.sliding[i] else self.rope


def _local_base(c: Config) -> float:
    return c.float("rope.freq_base_swa", 0.0) or c.float("rope.local.freq_base", 10_000.0)


def _full_rope(c: Config, head_dim: int, rope_freqs: torch.Tensor | None) -> RoPE:
    """The full layers' RoPE: over the whole head with `rope_freqs`' divisors (proportional:
    Ollama's files), else over `rope.dimension_count` dims, as Ollama reads a file without them."""
    base = c.float("rope.freq_base", 1_000_000.0)
    if rope_freqs is not None:
        if rope_freqs.shape != (head_dim // 2,):
            raise ModelLoadError(f"gemma4: rope_freqs must hold {head_dim // 2} values")
        return RoPE(head_dim, base, True, factors=rope_freqs)
    return RoPE(c.uint("rope.dimension_count", head_dim, maximum=head_dim), base, True)


def shared_kv_donors(sliding: Sequence[bool], shared: int) -> dict[int, int]:
    """Each of the last `shared` layers -> the last earlier unshared layer of its type."""
    first = len(sliding) - shared
    donors = {}
    for i in range(first, len(sliding)):
        earlier = [j for j in range(first) if sliding[j] == sliding[i]]
        if not earlier:
            raise ModelLoadError(f"shared KV layer {i} has no earlier layer of its type")
        donors[i] = earlier[-1]
    return donors


class Attention:
    """Gemma 3n's and 4's: RMS-normed queries and keys (weighted) and values (bare), no scale;
    a layer with a donor computes no keys and attends over the donor layer's."""

    def __init__(
        self, w: Weights, p: str, hidden: int, heads: int, kv_heads: int, head_dim: int,
        donor: int | None,
    ) -> None:  # fmt: skip
        c, d, h_kv = hidden, head_dim, kv_heads
        self.heads, self.kv_heads, self.head_dim, self.donor = heads, h_kv, d, donor
        self.q = w.linear(p + "attn_q.weight", heads * d, c)
        self.q_norm = w.tensor(p + "attn_q_norm.weight", (d,))
        self.output = w.linear(p + "attn_output.weight", c, heads * d)
        self.kv: AnyLinear | None = None
        if self.donor is None:
            self.has_v = w.has(p + "attn_v.weight")  # without: the values are the raw keys
            names = [p + "attn_k.weight"] + ([p + "attn_v.weight"] if self.has_v else [])
            self.kv = w.fused(names, [h_kv * d] * len(names), c)
            self.k_norm = w.tensor(p + "attn_k_norm.weight", (d,))

    def __call__(
        self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor], rope: RoPE,
        cache: Cache, eps: float,
    ) -> torch.Tensor:  # fmt: skip
        d = self.head_dim
        q = rms_norm(self.q(x).unflatten(-1, (self.heads, d)), self.q_norm, eps)
        q = rope.apply(q, *cos_sin)
        if self.kv is None:
            cache.set_layer(self.donor)  # type: ignore[arg-type]
            h = attend(q, cache, scale=1.0)
        else:
            kv = self.kv(x).unflatten(-1, (-1, d))
            k = kv[:, : self.kv_heads]
            v = kv[:, self.kv_heads :] if self.has_v else k
            k = rope.apply(rms_norm(k, self.k_norm, eps), *cos_sin)
            h = attention(q, k, rms_norm(v.contiguous(), None, eps), cache, scale=1.0)
        return self.output(h)


class GeluExperts:
    """Gemma 4's experts: down(gelu_tanh(gate) * up), gate and up one stack [gate | up] (or
    llama.cpp's two), each expert's output times its `ffn_down_exps.scale`."""

    def __init__(self, w: Weights, p: str, num_experts: int, hidden: int) -> None:
        e, c = num_experts, hidden
        if w.has(p + "ffn_gate_up_exps.weight"):
            self.ffn = w.shape(p + "ffn_gate_up_exps.weight")[1] // 2
            self.gate_up: list[AnyLinear] | None = w.experts(
                p + "ffn_gate_up_exps.weight", e, 2 * self.ffn, c
            )
        else:
            self.ffn = w.shape(p + "ffn_gate_exps.weight")[1]
            self.gate_up = None
            self.gate = w.experts(p + "ffn_gate_exps.weight", e, self.ffn, c)
            self.up = w.experts(p + "ffn_up_exps.weight", e, self.ffn, c)
        self.down = w.experts(p + "ffn_down_exps.weight", e, c, self.ffn)
        scale = p + "ffn_down_exps.scale"
        if not w.has(scale):
            scale = p + "ffn_gate_inp.per_expert_scale"
        self.scale = w.optional(scale, (e,))

    def __call__(self, expert: int, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None:
            gate, up = self.gate_up[expert](x).split(self.ffn, dim=-1)
        else:
            gate, up = self.gate[expert](x), self.up[expert](x)
        out = self.down[expert](F.gelu(gate, approximate="tanh") * up)
        return out if self.scale is None else out * self.scale[expert]


class Router:
    """Softmax over the experts of the bare-normed x times `scale` / sqrt(hidden); the top k,
    their weights rescaled to sum to one."""

    def __init__(self, w: Weights, p: str, o: Gemma4Options) -> None:
        self.proj = w.linear(p + "ffn_gate_inp.weight", o.num_experts, o.hidden)
        self.scale = w.tensor(p + "ffn_gate_inp.scale", (o.hidden,)) * o.hidden**-0.5
        self.k, self.eps = o.num_experts_used, o.eps

    def __call__(self, x: torch.Tensor) -> Routing:
        scores = torch.softmax(self.proj(rms_norm(x, None, self.eps) * self.scale), dim=-1)
        weights, experts = torch.topk(scores, self.k, dim=-1)
        return Routing(experts, weights / weights.sum(dim=-1, keepdim=True))


class Block:
    def __init__(self, w: Weights, i: int, o: Gemma4Options) -> None:
        p, c = f"blk.{i}.", o.hidden
        self.attn_norm = w.tensor(p + "attn_norm.weight", (c,))
        self.attention = Attention(
            w, p, c, o.num_heads, o.kv_heads[i], o.head_dims[i], o.donors.get(i)
        )
        self.post_attention_norm = w.tensor(p + "post_attention_norm.weight", (c,))
        self.ffn_norm = w.tensor(p + "ffn_norm.weight", (c,))
        ffn = w.shape(p + "ffn_gate.weight")[0]
        self.gate_up = w.fused([p + "ffn_gate.weight", p + "ffn_up.weight"], [ffn, ffn], c)
        self.down = w.linear(p + "ffn_down.weight", c, ffn)
        self.post_ffw_norm = w.tensor(p + "post_ffw_norm.weight", (c,))
        self.router = Router(w, p, o) if w.has(p + "ffn_gate_inp.weight") else None
        if self.router is not None:
            self.experts = GeluExperts(w, p, o.num_experts, c)
            self.post_ffw_norm_1 = w.tensor(p + "post_ffw_norm_1.weight", (c,))
            self.pre_ffw_norm_2 = w.tensor(p + "pre_ffw_norm_2.weight", (c,))
            self.post_ffw_norm_2 = w.tensor(p + "post_ffw_norm_2.weight", (c,))
        self.inp_gate: AnyLinear | None = None
        if o.per_layer_dim:
            self.inp_gate = w.linear(p + "inp_gate.weight", o.per_layer_dim, c)
            self.proj = w.linear(p + "proj.weight", c, o.per_layer_dim)
            self.post_norm = w.tensor(p + "post_norm.weight", (c,))
        scalar = p + "layer_output_scale.weight"
        self.out_scale = w.optional(scalar if w.has(scalar) else p + "layer_scalar", (1,))

    def __call__(
        self, x: torch.Tensor, per_layer: torch.Tensor | None,
        cos_sin: tuple[torch.Tensor, torch.Tensor], rope: RoPE, cache: Cache, eps: float,
        outputs: torch.Tensor | None,
    ) -> torch.Tensor:  # fmt: skip
        h = self.attention(rms_norm(x, self.attn_norm, eps), cos_sin, rope, cache, eps)
        if outputs is not None:
            h, x = h[outputs], x[outputs]
            per_layer = None if per_layer is None else per_layer[outputs]
        x = x + rms_norm(h, self.post_attention_norm, eps)
        del h
        mlp = gated_mlp(rms_norm(x, self.ffn_norm, eps), self.gate_up, self.down, "gelu_tanh")
        if self.router is not None:
            routed = mixture(rms_norm(x, self.pre_ffw_norm_2, eps), self.router(x), self.experts)
            mlp = rms_norm(mlp, self.post_ffw_norm_1, eps) + rms_norm(
                routed, self.post_ffw_norm_2, eps
            )
        x = x + rms_norm(mlp, self.post_ffw_norm, eps)
        if self.inp_gate is not None and per_layer is not None:
            gated = F.gelu(self.inp_gate(x), approximate="tanh") * per_layer
            x = x + rms_norm(self.proj(gated), self.post_norm, eps)
        return x if self.out_scale is None else x * self.out_scale


class PerLayerInputs:
    """Gemma 3n's and 4's per-layer embeddings: each layer's input (T, L, P) from the token's row
    of a second table (tokens past it read row 0, as transformers) and the embeddings projected,
    normed, summed and scaled by 1/sqrt(2)."""

    def __init__(self, w: Weights, layers: int, dim: int, hidden: int, eps: float) -> None:
        name, size = "per_layer_token_embd.weight", layers * dim
        self.rows = w.shape(name)[0]
        self.table = w.embedding(name, self.rows, size)
        self.proj = w.linear("per_layer_model_proj.weight", size, hidden)
        self.norm = w.tensor("per_layer_proj_norm.weight", (dim,))
        self.layers, self.dim, self.hidden, self.eps = layers, dim, hidden, eps

    def __call__(self, tokens: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        shape = (x.shape[0], self.layers, self.dim)
        ids = torch.where(tokens < self.rows, tokens, 0)
        own = self.table.lookup(ids).view(shape) * self.dim**0.5
        projected = (self.proj(x) * self.hidden**-0.5).view(shape)
        return (rms_norm(projected, self.norm, self.eps) + own) * 2**-0.5


class SlidingLayout(Protocol):
    @property
    def window(self) -> int: ...
    @property
    def sliding(self) -> tuple[bool, ...]: ...
    @property
    def final_softcap(self) -> float: ...
    def layer_rope(self, i: int) -> RoPE: ...


class SlidingGemma(DecoderStack):
    """Gemma 3n's and 4's stack: sliding-window and full layers in two caches, each type's RoPE
    for a shift, the logits softcapped where the file says."""

    options: SlidingLayout

    def make_cache(self) -> Cache:
        o = self.options
        caches = [CausalCache(window=o.window, shift=self.shift), CausalCache(shift=self.shift)]
        return WrapperCache(caches, [SLIDING if s else FULL for s in o.sliding])

    def shift(self, layer: int, key: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return self.options.layer_rope(layer).shift(key, delta)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.output(hidden)
        cap = self.options.final_softcap
        return softcap(logits, cap) if cap else logits


class Gemma4(SlidingGemma):
    options: Gemma4Options

    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        w = Weights(gguf)
        freqs = w.tensor("rope_freqs.weight", w.shape("rope_freqs.weight")) if w.has(
            "rope_freqs.weight") else None  # fmt: skip
        o = self.options = Gemma4Options.from_config(config, freqs)
        self.load_stack(w, o.hidden, o.context_length, o.num_layers, lambda i: Block(w, i, o))
        self.per_layer = PerLayerInputs(w, o.num_layers, o.per_layer_dim, o.hidden, o.eps) if (
            o.per_layer_dim) else None  # fmt: skip

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        tokens = torch.tensor(batch.tokens)
        x = self.token_embd.lookup(tokens) * self.options.hidden**0.5
        return self.run(tokens, x, batch, cache)

    def run(
        self, tokens: torch.Tensor, x: torch.Tensor, batch: Batch, cache: Cache
    ) -> torch.Tensor:
        """The layers over the batch's scaled embeddings x (T, C) of tokens (T,)."""
        o = self.options
        per_layer = None if self.per_layer is None else self.per_layer(tokens, x)
        positions = torch.tensor(batch.positions)
        tables = {SLIDING: o.local_rope.cos_sin(positions), FULL: o.rope.cos_sin(positions)}
        outputs = _rows(batch)
        for i, block in enumerate(self.blocks):
            cache.set_layer(i)
            kind = SLIDING if o.sliding[i] else FULL
            x = block(
                x, None if per_layer is None else per_layer[:, i], tables[kind],
                o.layer_rope(i), cache, o.eps, outputs if i == o.num_layers - 1 else None,
            )  # fmt: skip
        return rms_norm(x, self.output_norm, o.eps)
