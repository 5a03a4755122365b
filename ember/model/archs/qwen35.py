"""Qwen3.5 and Qwen3-Next (text; Ollama's `qwen35`, `qwen35moe` and `qwen3next`): layers of gated
DeltaNet (linear attention) with a full-attention layer between runs of them. `attention.
head_count_kv` (an array, 0 on the DeltaNet layers; or a count and `full_attention_interval`)
says which layer is which.

A DeltaNet layer: q, k and v from `attn_qkv` through a short causal convolution and SiLU, q and
k L2-normed, each value head's decay from softplus(`ssm_alpha` x + `ssm_dt`) times `ssm_a` (the
file's -exp(A_log)) and its write strength sigmoid(`ssm_beta` x); the gated delta rule over the
sequence's state (ember/kvcache/recurrent_state.py); RMS-normed per head, times SiLU(`attn_gate` x),
then `ssm_out`. Where there are fewer key heads than value heads, value head n reads key head
n mod H_k where the file's value heads are reordered (`ssm.v_head_reordered`: Ollama's qwen35
files), else n div (H_v / H_k). Qwen3-Next's older files pack beta and alpha as `ssm_ba`.

A full-attention layer: `attn_q` gives each head's query and an output gate side by side, q and
k RMS-normed, partial NeoX RoPE (text positions: every M-RoPE section the same), the output
times sigmoid(gate). The MLP: SwiGLU, or (`expert_count`) a softmax top-k of experts plus a
shared expert gated by sigmoid(`ffn_gate_inp_shexp` x). Norm weights are stored with Qwen's +1
already added, except `ssm_norm`."""

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from ember.backend.weights import AnyLinear
from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.kvcache import Cache, CausalCache, RecurrentStateCache, WrapperCache
from ember.kvcache.recurrent_state import current_state
from ember.model.archs.llama import _rows, with_added
from ember.model.archs.qwen3vl import GridImages, GridVision, deepstack
from ember.model.archs.qwen25vl import grid_positions, mrope, place_images
from ember.model.config import Config, ModelLoadError
from ember.model.mlp import SwiGLU, routed_experts
from ember.model.registry import register
from ember.model.stack import DecoderStack
from ember.model.weights import Weights
from ember.nn import RoPE, attention, rms_norm
from ember.nn.moe import mixture, softmax_top_k

ATTENTION, DELTA = 0, 1  # the caches of WrapperCache


@dataclass(frozen=True, slots=True)
class Qwen35Options:
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    recurrent: tuple[bool, ...]
    eps: float
    context_length: int
    rope: RoPE
    attention_scale: float
    key_heads: int  # DeltaNet's
    value_heads: int
    key_dim: int
    value_dim: int
    kernel: int
    reordered: bool
    num_experts: int
    num_experts_used: int
    is_normalized: bool

    @classmethod
    def from_config(cls, c: Config) -> "Qwen35Options":
        n, hidden = c.uint("block_count", maximum=1024), c.uint("embedding_length")
        num_heads = c.uint("attention.head_count")
        kv = c.metadata.get(f"{c.arch}.attention.head_count_kv")
        if isinstance(kv, list):
            counts = c.per_layer("attention.head_count_kv", n)
            recurrent = tuple(h == 0 for h in counts)
            num_kv = max(counts)
        else:
            interval = c.uint("full_attention_interval", min(4, n), maximum=n)
            recurrent = tuple((i + 1) % interval != 0 for i in range(n))
            num_kv = c.uint("attention.head_count_kv")
        if all(recurrent) or not any(recurrent) or num_heads % num_kv:
            raise ModelLoadError(f"{c.arch}: needs both DeltaNet and attention layers")
        head_dim = c.uint("attention.key_length", hidden // num_heads)
        rope_dim = c.uint("rope.dimension_count", head_dim, maximum=head_dim)
        if c.string("rope.scaling.type", "none") not in ("none", "default"):
            raise ModelLoadError(f"{c.arch}: RoPE scaling is not supported")
        value_heads, key_heads = c.uint("ssm.time_step_rank"), c.uint("ssm.group_count")
        if value_heads % key_heads:
            raise ModelLoadError(f"{c.arch}: ssm.time_step_rank must divide by ssm.group_count")
        num_experts = c.count("expert_count", maximum=4096)
        return cls(
            num_layers=n,
            hidden=hidden,
            num_heads=num_heads,
            num_kv_heads=num_kv,
            head_dim=head_dim,
            recurrent=recurrent,
            eps=c.float("attention.layer_norm_rms_epsilon", 1e-6),
            context_length=c.uint("context_length", 262144, maximum=1 << 28),
            rope=RoPE(rope_dim, c.float("rope.freq_base", 10_000_000.0), True),
            attention_scale=c.float("attention.scale", 0.0) or head_dim**-0.5,
            key_heads=key_heads,
            value_heads=value_heads,
            key_dim=c.uint("ssm.state_size"),
            value_dim=c.uint("ssm.inner_size") // value_heads,
            kernel=c.uint("ssm.conv_kernel", 4, maximum=64),
            reordered=c.bool("ssm.v_head_reordered", c.arch in ("qwen35", "qwen35moe")),
            num_experts=num_experts,
            num_experts_used=c.uint("expert_used_count", maximum=num_experts) if num_experts else 0,
            is_normalized=c.bool("norm_top_k_prob", True),
        )


class DeltaNet:
    def __init__(self, w: Weights, p: str, o: Qwen35Options) -> None:
        c, hk, hv = o.hidden, o.key_heads, o.value_heads
        self.channels = [hk * o.key_dim, hk * o.key_dim, hv * o.value_dim]
        inner = hv * o.value_dim
        self.qkv_z = w.fused([p + "attn_qkv.weight", p + "attn_gate.weight"],
                             [sum(self.channels), inner], c)  # fmt: skip
        self.packed_ba: AnyLinear | None = None
        if w.has(p + "ssm_ba.weight"):  # Qwen3-Next's: beta then alpha, grouped by key head
            self.packed_ba = w.linear(p + "ssm_ba.weight", 2 * hv, c)
        else:
            self.beta_alpha = w.fused([p + "ssm_beta.weight", p + "ssm_alpha.weight"], [hv, hv], c)
        self.conv = w.tensor(p + "ssm_conv1d.weight", (sum(self.channels), o.kernel))
        dt = p + "ssm_dt" if w.has(p + "ssm_dt") else p + "ssm_dt.bias"
        self.dt_bias, self.a = w.tensor(dt, (hv,)), w.tensor(p + "ssm_a", (hv,))
        self.norm = w.tensor(p + "ssm_norm.weight", (o.value_dim,))
        self.out = w.linear(p + "ssm_out.weight", c, inner)

    def _beta_alpha(self, x: torch.Tensor, o: Qwen35Options) -> tuple[torch.Tensor, torch.Tensor]:
        if self.packed_ba is None:
            return self.beta_alpha(x).split(o.value_heads, dim=-1)
        grouped = self.packed_ba(x).unflatten(-1, (o.key_heads, 2, -1))  # (T, H_k, 2, r)
        return grouped[:, :, 0].flatten(1), grouped[:, :, 1].flatten(1)

    def __call__(self, x: torch.Tensor, cache: Cache, o: Qwen35Options) -> torch.Tensor:
        state = current_state(cache)
        t, inner = x.shape[0], o.value_heads * o.value_dim
        mixed = self.qkv_z(x)
        z = mixed[:, -inner:].view(t, o.value_heads, o.value_dim)
        beta, alpha = self._beta_alpha(x, o)
        decay = F.softplus(alpha + self.dt_bias) * self.a  # (T, H_v): the log of each decay
        qkv = F.silu(state.convolve(mixed[:, :-inner].contiguous(), self.conv))
        q, k, v = qkv.split(self.channels, dim=-1)
        q = F.normalize(q.view(t, o.key_heads, o.key_dim), dim=-1, eps=1e-6)
        k = F.normalize(k.view(t, o.key_heads, o.key_dim), dim=-1, eps=1e-6)
        if o.key_heads != o.value_heads:
            r = o.value_heads // o.key_heads
            q, k = (y.repeat(1, r, 1) if o.reordered else y.repeat_interleave(r, 1) for y in (q, k))
        v = v.reshape(t, o.value_heads, o.value_dim)
        h = state.recur(q * o.key_dim**-0.5, k, v, decay, torch.sigmoid(beta))
        h = rms_norm(h, self.norm, o.eps) * F.silu(z)
        return self.out(h.flatten(1))


class GatedAttention:
    def __init__(self, w: Weights, p: str, o: Qwen35Options) -> None:
        c, d = o.hidden, o.head_dim
        self.q_gate = w.linear(p + "attn_q.weight", 2 * o.num_heads * d, c)
        kv = o.num_kv_heads * d
        self.kv = w.fused([p + "attn_k.weight", p + "attn_v.weight"], [kv, kv], c)
        self.q_norm = w.tensor(p + "attn_q_norm.weight", (d,))
        self.k_norm = w.tensor(p + "attn_k_norm.weight", (d,))
        self.output = w.linear(p + "attn_output.weight", c, o.num_heads * d)

    def __call__(
        self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor], cache: Cache,
        o: Qwen35Options,
    ) -> torch.Tensor:  # fmt: skip
        d = o.head_dim
        q, gate = self.q_gate(x).unflatten(-1, (o.num_heads, 2, d)).unbind(2)
        k, v = self.kv(x).unflatten(-1, (2, o.num_kv_heads, d)).unbind(1)
        q = o.rope.apply(rms_norm(q.contiguous(), self.q_norm, o.eps), *cos_sin)
        k = o.rope.apply(rms_norm(k.contiguous(), self.k_norm, o.eps), *cos_sin)
        h = attention(q, k, v.contiguous(), cache, scale=o.attention_scale)
        return self.output(h * torch.sigmoid(gate.flatten(1)))


class SharedMixture:
    """Qwen's experts: a softmax top-k (rescaled to sum to one where `norm_top_k_prob`), plus a
    shared expert gated by sigmoid(`ffn_gate_inp_shexp` x)."""

    def __init__(self, w: Weights, p: str, o: Qwen35Options) -> None:
        c, e = o.hidden, o.num_experts
        self.router = w.linear(p + "ffn_gate_inp.weight", e, c)
        self.experts = routed_experts(w, p, e, c)
        self.shared = SwiGLU(w, p, "_shexp", c) if w.has(p + "ffn_gate_shexp.weight") else None
        gate = p + "ffn_gate_inp_shexp.weight"
        self.shared_gate = w.linear(gate, 1, c) if w.has(gate) else None
        self.k, self.is_normalized = o.num_experts_used, o.is_normalized

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        routing = softmax_top_k(self.router(x), self.k, is_normalized=self.is_normalized)
        out = mixture(x, routing, self.experts)
        if self.shared is None:
            return out
        shared = self.shared(x)
        if self.shared_gate is not None:
            shared = shared * torch.sigmoid(self.shared_gate(x))
        return out + shared


class Block:
    def __init__(self, w: Weights, i: int, o: Qwen35Options) -> None:
        p, c = f"blk.{i}.", o.hidden
        self.attn_norm = w.tensor(p + "attn_norm.weight", (c,))
        self.operator = DeltaNet(w, p, o) if o.recurrent[i] else GatedAttention(w, p, o)
        self.ffn_norm = w.tensor(p + "post_attention_norm.weight", (c,))
        self.ffn = SharedMixture(w, p, o) if o.num_experts else SwiGLU(w, p, "", c)

    def __call__(
        self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor], cache: Cache,
        o: Qwen35Options, outputs: torch.Tensor | None,
    ) -> torch.Tensor:  # fmt: skip
        normed = rms_norm(x, self.attn_norm, o.eps)
        if isinstance(self.operator, DeltaNet):
            h = self.operator(normed, cache, o)
        else:
            h = self.operator(normed, cos_sin, cache, o)
        if outputs is not None:
            h, x = h[outputs], x[outputs]
        x = x + h
        return x + self.ffn(rms_norm(x, self.ffn_norm, o.eps))


class Qwen35(DecoderStack):
    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        w = Weights(gguf)
        o = self.options = Qwen35Options.from_config(config)
        self.load_stack(w, o.hidden, o.context_length, o.num_layers, lambda i: Block(w, i, o))

    def make_cache(self) -> Cache:
        o = self.options
        caches: list[Cache] = [CausalCache(shift=self.shift), RecurrentStateCache(o.kernel)]
        return WrapperCache(caches, [DELTA if r else ATTENTION for r in o.recurrent])

    def shift(self, layer: int, key: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return self.options.rope.shift(key, delta)

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        return self.run(self.embed(batch), torch.tensor(batch.positions), batch, cache)

    def run(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        batch: Batch,
        cache: Cache,
        added: Sequence[torch.Tensor] = (),
    ) -> torch.Tensor:
        """The layers over embeddings x at RoPE positions (T,) or (3, T); added[i] is added to
        layer i's output (deepstack)."""
        o = self.options
        cos_sin = o.rope.cos_sin(positions)
        outputs = _rows(batch)
        for i, block in enumerate(self.blocks):
            cache.set_layer(i)
            rows = outputs if i == o.num_layers - 1 else None
            x = with_added(block(x, cos_sin, cache, o, rows), added, i, rows)
        return rms_norm(x, self.output_norm, o.eps)


class Qwen35VL(GridImages, Qwen35):
    """Qwen3.5 with its vision tower (Ollama's single file): Qwen3-VL's tower and image
    placement (qwen3vl.py), interleaved M-RoPE over the attention layers' partial RoPE."""

    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        super().__init__(gguf, config)
        rope = mrope(config, self.options.rope, interleaved=True, default=[11, 11, 10])
        self.options = replace(self.options, rope=rope)
        self.images = GridVision(gguf, config, self.options.hidden)

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        x = place_images(self.embed(batch), batch)
        return self.run(x, grid_positions(batch), batch, cache, deepstack(x, batch))


@register("qwen35", "qwen35moe", "qwen3next")
def qwen35(gguf: GGUFFile, config: Config) -> Qwen35:
    """Qwen35VL where the file holds a vision tower, else the text model."""
    has_tower = "v.patch_embed.weight" in gguf.tensors
    return Qwen35VL(gguf, config) if has_tower else Qwen35(gguf, config)
