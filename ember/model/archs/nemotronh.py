"""Nemotron-H (text; Ollama's and llama.cpp's `nemotron_h`, and `nemotron_h_moe`): a stack whose
every layer is one mixer after an RMS norm, added to the residual: Mamba 2, attention without
positions (NoPE), or an MLP of squared ReLUs (dense, or a mixture: sigmoid scores chosen with
`exp_probs_b`, normalized and scaled, experts optionally in a latent space, plus a shared
expert). `attention.head_count_kv` and `feed_forward_length` (arrays) tell them apart: both 0 is
Mamba 2, only the first an MLP, only the second attention.

Mamba 2: `ssm_in` gives the gate z, x B C and dt; x B C pass a short causal convolution (with
its bias) and SiLU; per head dt = softplus(dt + `ssm_dt.bias`), the state decays by exp(dt A)
(`ssm_a` holds A) and takes in dt x B^T, the output is its C product plus `ssm_d` x; then
times SiLU(z), RMS-normed per group of heads, and `ssm_out`. Its state lives in
ember/kvcache/recurrent_state.py, as Qwen3.5's DeltaNet's (Mamba 2's scan is the delta rule
without the delta)."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ember.backend.weights import AnyLinear
from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.kvcache import Cache, CausalCache, RecurrentStateCache, WrapperCache
from ember.kvcache.recurrent_state import current_state
from ember.model.archs.llama import _rows
from ember.model.config import Config, ModelLoadError
from ember.model.registry import register
from ember.model.stack import DecoderStack
from ember.model.weights import Weights
from ember.nn import attention, rms_norm
from ember.nn.moe import deepseek_top_k, mixture

ATTENTION, MAMBA = 0, 1  # the caches of WrapperCache
MIXERS = ("mamba", "attention", "mlp")


@dataclass(frozen=True, slots=True)
class NemotronHOptions:
    num_layers: int
    hidden: int
    mixers: tuple[str, ...]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    attention_scale: float
    eps: float
    context_length: int
    kernel: int
    inner: int  # Mamba 2's heads x head size
    state: int  # its state size (B's and C's)
    heads: int
    groups: int
    num_experts: int
    num_experts_used: int
    is_normalized: bool
    expert_scale: float
    expert_groups: int
    expert_groups_used: int

    @classmethod
    def from_config(cls, c: Config) -> "NemotronHOptions":
        n, hidden = c.uint("block_count", maximum=1024), c.uint("embedding_length")
        kv = _counts(c, "attention.head_count_kv", n)
        ffn = _counts(c, "feed_forward_length", n)
        mixers = tuple("mamba" if not k and not f else "attention" if not f else "mlp"
                       for k, f in zip(kv, ffn, strict=True))  # fmt: skip
        num_heads = max(_counts(c, "attention.head_count", n))
        num_kv = max(kv)
        if "attention" in mixers and (not num_heads or not num_kv or num_heads % num_kv):
            raise ModelLoadError(f"{c.arch}: attention layers need head counts")
        head_dim = c.uint("attention.key_length", hidden // max(num_heads, 1))
        heads, groups = c.uint("ssm.time_step_rank"), c.uint("ssm.group_count")
        if heads % groups:
            raise ModelLoadError(f"{c.arch}: ssm.time_step_rank must divide by ssm.group_count")
        num_experts = c.count("expert_count", maximum=4096)
        groups_of = c.metadata.get(f"{c.arch}.expert_group_count") or 1
        return cls(
            num_layers=n,
            hidden=hidden,
            mixers=mixers,
            num_heads=num_heads,
            num_kv_heads=num_kv,
            head_dim=head_dim,
            attention_scale=c.float("attention.scale", 0.0) or head_dim**-0.5,
            eps=c.float("attention.layer_norm_rms_epsilon", 1e-5),
            context_length=c.uint("context_length", 8192, maximum=1 << 28),
            kernel=c.uint("ssm.conv_kernel", 4, maximum=64),
            inner=c.uint("ssm.inner_size"),
            state=c.uint("ssm.state_size"),
            heads=heads,
            groups=groups,
            num_experts=num_experts,
            num_experts_used=c.uint("expert_used_count", maximum=num_experts) if num_experts else 0,
            is_normalized=c.bool("expert_weights_norm", False),
            expert_scale=c.float("expert_weights_scale", 1.0),
            expert_groups=int(groups_of),
            expert_groups_used=int(c.metadata.get(f"{c.arch}.expert_group_used_count") or 1),
        )


def _counts(c: Config, key: str, n: int) -> tuple[int, ...]:
    """A per-layer count that may be 0 (an array), or one for all layers (absent: 0)."""
    value = c.metadata.get(f"{c.arch}.{key}")
    if value is None:
        return (0,) * n
    return c.per_layer(key, n)


class Mamba2:
    def __init__(self, w: Weights, p: str, o: NemotronHOptions) -> None:
        c, h = o.hidden, o.heads
        self.channels = o.inner + 2 * o.groups * o.state  # x, B and C
        self.ssm_in = w.linear(p + "ssm_in.weight", o.inner + self.channels + h, c)
        self.conv = w.tensor(p + "ssm_conv1d.weight", (self.channels, o.kernel))
        self.conv_bias = w.optional(p + "ssm_conv1d.bias", (self.channels,))
        self.dt_bias = w.tensor(p + "ssm_dt.bias", (h,))
        self.a = w.tensor(p + "ssm_a", (h,))
        self.d = w.tensor(p + "ssm_d", (h,))
        self.norm = w.tensor(p + "ssm_norm.weight", (o.inner,)).view(o.groups, -1)
        self.out = w.linear(p + "ssm_out.weight", c, o.inner)

    def __call__(self, x: torch.Tensor, cache: Cache, o: NemotronHOptions) -> torch.Tensor:
        state, t = current_state(cache), x.shape[0]
        z, xbc, dt = self.ssm_in(x).split([o.inner, self.channels, o.heads], dim=-1)
        xbc = state.convolve(xbc.contiguous(), self.conv)
        if self.conv_bias is not None:
            xbc = xbc + self.conv_bias
        xs, b, c = F.silu(xbc).split([o.inner, o.groups * o.state, o.groups * o.state], dim=-1)
        dt = F.softplus(dt + self.dt_bias)  # (T, H)
        xs = xs.reshape(t, o.heads, -1)
        per_group = o.heads // o.groups
        b, c = (y.reshape(t, o.groups, o.state).repeat_interleave(per_group, 1) for y in (b, c))
        y = state.recur(c, b, xs, dt * self.a, dt, delta=False) + xs * self.d[:, None]
        gated = (y.flatten(1) * F.silu(z)).view(t, o.groups, -1)
        return self.out((rms_norm(gated, None, o.eps) * self.norm).flatten(1))


class Attention:
    def __init__(self, w: Weights, p: str, o: NemotronHOptions) -> None:
        c, d = o.hidden, o.head_dim
        q, kv = o.num_heads * d, o.num_kv_heads * d
        self.qkv = w.fused([p + f"attn_{n}.weight" for n in "qkv"], [q, kv, kv], c)
        self.output = w.linear(p + "attn_output.weight", c, q)
        self.splits = [q, kv, kv]

    def __call__(self, x: torch.Tensor, cache: Cache, o: NemotronHOptions) -> torch.Tensor:
        q, k, v = self.qkv(x).split(self.splits, dim=-1)
        d = o.head_dim
        h = attention(q.unflatten(-1, (-1, d)), k.unflatten(-1, (-1, d)),
                      v.unflatten(-1, (-1, d)), cache, scale=o.attention_scale)  # fmt: skip
        return self.output(h)


def relu2(up: AnyLinear, down: AnyLinear, x: torch.Tensor) -> torch.Tensor:
    return down(F.relu(up(x)).square())


class Relu2Experts:
    def __init__(self, up: list[AnyLinear], down: list[AnyLinear]) -> None:
        self.up, self.down = up, down

    def __call__(self, expert: int, x: torch.Tensor) -> torch.Tensor:
        return relu2(self.up[expert], self.down[expert], x)


class Mixture:
    """Sigmoid scores chosen with `exp_probs_b` (in groups where the file has them), normalized
    and scaled; squared-ReLU experts, in a latent space where `ffn_latent_in` is; a shared
    expert."""

    def __init__(self, w: Weights, p: str, o: NemotronHOptions) -> None:
        c, e = o.hidden, o.num_experts
        self.router = w.linear(p + "ffn_gate_inp.weight", e, c)
        self.bias = w.optional(p + "exp_probs_b.bias", (e,))
        latent = w.has(p + "ffn_latent_in.weight")
        self.latent_in = w.linear(p + "ffn_latent_in.weight", w.shape(
            p + "ffn_latent_in.weight")[0], c) if latent else None  # fmt: skip
        width = w.shape(p + "ffn_up_exps.weight")[2]
        self.latent_out = w.linear(p + "ffn_latent_out.weight", c, width) if latent else None
        f = w.shape(p + "ffn_up_exps.weight")[1]
        self.experts = Relu2Experts(w.experts(p + "ffn_up_exps.weight", e, f, width),
                                    w.experts(p + "ffn_down_exps.weight", e, width, f))  # fmt: skip
        sf = w.shape(p + "ffn_up_shexp.weight")[0] if w.has(p + "ffn_up_shexp.weight") else 0
        self.shared = (w.linear(p + "ffn_up_shexp.weight", sf, c),
                       w.linear(p + "ffn_down_shexp.weight", c, sf)) if sf else None  # fmt: skip
        self.o = o

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        o = self.o
        routing = deepseek_top_k(
            self.router(x), o.num_experts_used, sigmoid=True, bias=self.bias,
            groups=o.expert_groups, groups_used=o.expert_groups_used,
            is_normalized=o.is_normalized, scale=o.expert_scale,
        )  # fmt: skip
        inner = x if self.latent_in is None else self.latent_in(x)
        out = mixture(inner, routing, self.experts)
        if self.latent_out is not None:
            out = self.latent_out(out)
        return out if self.shared is None else out + relu2(*self.shared, x)


class Block:
    def __init__(self, w: Weights, i: int, o: NemotronHOptions) -> None:
        p = f"blk.{i}."
        self.norm = w.tensor(p + "attn_norm.weight", (o.hidden,))
        self.kind = o.mixers[i]
        if self.kind == "mamba":
            self.mamba = Mamba2(w, p, o)
        elif self.kind == "attention":
            self.attention = Attention(w, p, o)
        elif w.has(p + "ffn_gate_inp.weight"):  # (a mixture model may keep some MLPs dense)
            self.moe: Mixture | None = Mixture(w, p, o)
        else:
            self.moe = None
            f = w.shape(p + "ffn_up.weight")[0]
            self.up = w.linear(p + "ffn_up.weight", f, o.hidden)
            self.down = w.linear(p + "ffn_down.weight", o.hidden, f)

    def __call__(
        self, x: torch.Tensor, cache: Cache, o: NemotronHOptions, outputs: torch.Tensor | None
    ) -> torch.Tensor:
        h = rms_norm(x, self.norm, o.eps)
        if self.kind == "mamba":
            h = self.mamba(h, cache, o)
        elif self.kind == "attention":
            h = self.attention(h, cache, o)
        else:
            h = relu2(self.up, self.down, h) if self.moe is None else self.moe(h)
        if outputs is not None:
            h, x = h[outputs], x[outputs]
        return x + h


@register("nemotron_h", "nemotron_h_moe")
class NemotronH(DecoderStack):
    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        w = Weights(gguf)
        o = self.options = NemotronHOptions.from_config(config)
        self.load_stack(w, o.hidden, o.context_length, o.num_layers, lambda i: Block(w, i, o))

    def make_cache(self) -> Cache:
        caches: list[Cache] = [CausalCache(shift=self.shift), RecurrentStateCache(
            self.options.kernel)]  # fmt: skip
        return WrapperCache(caches, [MAMBA if m == "mamba" else ATTENTION
                                     for m in self.options.mixers])  # fmt: skip

    def shift(self, layer: int, key: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return key  # no positions in the keys

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        o = self.options
        x = self.embed(batch)
        outputs = _rows(batch)
        for i, block in enumerate(self.blocks):
            cache.set_layer(i)
            x = block(x, cache, o, outputs if i == o.num_layers - 1 else None)
        return rms_norm(x, self.output_norm, o.eps)
