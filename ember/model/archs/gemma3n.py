"""Gemma 3n (text; Ollama's `gemma3n`): Gemma 4's attention (normed q, k and bare-normed v, no
scale; the last `attention.shared_kv_layers` layers read the keys of the last earlier layer of
their type) and per-layer embeddings, inside AltUp: the hidden state is `altup.num_inputs`
streams (the embeddings, and their projections by `altup_proj` rescaled to the embeddings'
magnitude). Each layer predicts every stream as a mix of all (`altup_predict_coef` of a tanh
router over the active stream), runs attention and MLP on the active one with LAuReL (a
low-rank `laurel_l`/`laurel_r` path beside attention, the sum scaled by 1/sqrt(2)), corrects
every stream by the innovation (`altup_correct_coef` + 1), and adds the per-layer input, gated
from the corrected active stream, to the others. The first layers' MLP gates are sparsified
(`activation_sparsity_scale`: the gate minus mean + scale std, ReLU'd). At the end the other
streams are projected back (`altup_unembd_proj`, rescaled) and all are averaged."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.kvcache import Cache
from ember.model.archs.gemma4 import (
    FULL,
    SLIDING,
    Attention,
    PerLayerInputs,
    SlidingGemma,
    shared_kv_donors,
)
from ember.model.archs.llama import _rows
from ember.model.config import Config, ModelLoadError
from ember.model.registry import register
from ember.model.weights import Weights
from ember.nn import RoPE, rms_norm


@dataclass(frozen=True, slots=True)
class Gemma3nOptions:
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    sliding: tuple[bool, ...]
    donors: dict[int, int]
    eps: float
    window: int
    context_length: int
    local_rope: RoPE
    rope: RoPE
    per_layer_dim: int
    streams: int  # AltUp's
    active: int  # the stream the layers run on
    correct_scale: bool
    sparsity: tuple[float, ...]  # each layer's MLP gate cutoff in standard deviations, or 0
    final_softcap: float  # 0: none (Ollama's files have none; transformers' configs say 30)

    @classmethod
    def from_config(cls, c: Config) -> "Gemma3nOptions":
        n, hidden = c.uint("block_count", maximum=1024), c.uint("embedding_length")
        num_heads = c.uint("attention.head_count")
        head_dim = c.uint("attention.key_length", hidden // num_heads)
        sliding = c.bools("attention.sliding_window_pattern", n) or (False,) * n
        shared = c.count("attention.shared_kv_layers", maximum=n - 1)
        scale = c.metadata.get(f"{c.arch}.activation_sparsity_scale") or [0.0] * n
        if not isinstance(scale, list) or len(scale) != n:
            raise ModelLoadError("gemma3n: activation_sparsity_scale must give each layer's")
        streams = c.uint("altup.num_inputs", 4, maximum=64)
        active = c.metadata.get(f"{c.arch}.altup.active_idx") or 0
        if not isinstance(active, int) or not 0 <= active < streams:
            raise ModelLoadError("gemma3n: altup.active_idx must name one of its streams")
        return cls(
            num_layers=n,
            hidden=hidden,
            num_heads=num_heads,
            num_kv_heads=c.uint("attention.head_count_kv", num_heads),
            head_dim=head_dim,
            sliding=sliding,
            donors=shared_kv_donors(sliding, shared),
            eps=c.float("attention.layer_norm_rms_epsilon", 1e-6),
            window=c.uint("attention.sliding_window", 512, maximum=1 << 28),
            context_length=c.uint("context_length", 32768, maximum=1 << 28),
            local_rope=RoPE(head_dim, c.float("rope.freq_base_local", 10_000.0), True),
            rope=RoPE(head_dim, c.float("rope.freq_base", 1_000_000.0), True),
            per_layer_dim=c.uint("embedding_length_per_layer_input"),
            streams=streams,
            active=active,
            correct_scale=c.bool("altup.correct_scale", True),
            sparsity=tuple(float(v) for v in scale),
            final_softcap=c.float("final_logit_softcapping", 0.0),
        )

    def layer_rope(self, i: int) -> RoPE:
        return self.local_rope if self.sliding[i] else self.rope


def rescaled(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """x with each row's root mean square made target's (rows' RMS (T, 1))."""
    magnitude = x.square().mean(-1, keepdim=True).clamp(min=1e-5).sqrt()
    return x * (target / magnitude)


class AltUp:
    def __init__(self, w: Weights, p: str, o: Gemma3nOptions) -> None:
        n, c = o.streams, o.hidden
        self.router = w.linear(p + "altup_router.weight", n, c)
        self.router_norm = w.tensor(p + "altup_router_norm.weight", (c,))
        self.predict_coef = w.linear(p + "altup_predict_coef.weight", n * n, n)
        self.correct_coef = w.linear(p + "altup_correct_coef.weight", n, n)
        self.correct_scale = w.tensor(p + "altup_correct_scale.weight", (c,))
        self.streams, self.active, self.hidden, self.eps = n, o.active, c, o.eps

    def _modalities(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.router(rms_norm(x, self.router_norm, self.eps) / self.hidden))

    def predict(self, h: torch.Tensor) -> torch.Tensor:
        """h (N, T, C) -> each stream plus its mix of all: coefficients (T, N, N) by token."""
        coef = self.predict_coef(self._modalities(h[self.active])).unflatten(-1, (self.streams, -1))
        return h + torch.einsum("tij,jtc->itc", coef, h)

    def correct(self, predicted: torch.Tensor, activated: torch.Tensor) -> torch.Tensor:
        innovation = activated - predicted[self.active]  # (T, C)
        coef = self.correct_coef(self._modalities(activated)) + 1.0  # (T, N)
        return predicted + coef.t()[:, :, None] * innovation


class Block:
    def __init__(self, w: Weights, i: int, o: Gemma3nOptions) -> None:
        p, c = f"blk.{i}.", o.hidden
        self.altup = AltUp(w, p, o)
        self.attn_norm = w.tensor(p + "attn_norm.weight", (c,))
        self.laurel_l = w.linear(p + "laurel_l.weight", w.shape(p + "laurel_l.weight")[0], c)
        self.laurel_r = w.linear(p + "laurel_r.weight", c, w.shape(p + "laurel_l.weight")[0])
        self.laurel_norm = w.tensor(p + "laurel_post_norm.weight", (c,))
        self.attention = Attention(
            w, p, c, o.num_heads, o.num_kv_heads, o.head_dim, o.donors.get(i)
        )
        self.post_attention_norm = w.tensor(p + "post_attention_norm.weight", (c,))
        self.ffn_norm = w.tensor(p + "ffn_norm.weight", (c,))
        self.ffn = w.shape(p + "ffn_gate.weight")[0]
        self.gate_up = w.fused([p + "ffn_gate.weight", p + "ffn_up.weight"], [self.ffn] * 2, c)
        self.down = w.linear(p + "ffn_down.weight", c, self.ffn)
        self.post_ffw_norm = w.tensor(p + "post_ffw_norm.weight", (c,))
        self.inp_gate = w.linear(p + "inp_gate.weight", o.per_layer_dim, c)
        self.proj = w.linear(p + "proj.weight", c, o.per_layer_dim)
        self.post_norm = w.tensor(p + "post_norm.weight", (c,))
        self.sparsity = o.sparsity[i]

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).split(self.ffn, dim=-1)
        if self.sparsity > 0:  # only the gates past mean + k std pass (less the cutoff)
            std, mean = torch.std_mean(gate, dim=-1, keepdim=True, correction=0)
            gate = F.relu(gate - (mean + std * self.sparsity))
        return self.down(F.gelu(gate, approximate="tanh") * up)

    def __call__(
        self, h: torch.Tensor, per_layer: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor], rope: RoPE, cache: Cache, o: Gemma3nOptions,
    ) -> torch.Tensor:  # fmt: skip
        predicted = self.altup.predict(h)
        active = predicted[o.active]
        normed = rms_norm(active, self.attn_norm, o.eps)
        laurel = normed + rms_norm(self.laurel_r(self.laurel_l(normed)), self.laurel_norm, o.eps)
        attn = self.attention(normed, cos_sin, rope, cache, o.eps)
        x = (active + rms_norm(attn, self.post_attention_norm, o.eps) + laurel) * 2**-0.5
        x = x + rms_norm(self.mlp(rms_norm(x, self.ffn_norm, o.eps)), self.post_ffw_norm, o.eps)
        corrected = self.altup.correct(predicted, x)
        first = corrected[o.active]
        if o.correct_scale:
            first = first * self.altup.correct_scale
        gated = F.gelu(self.inp_gate(first), approximate="tanh") * per_layer
        added = rms_norm(self.proj(gated), self.post_norm, o.eps)
        others = torch.arange(o.streams) != o.active
        corrected[others] = corrected[others] + added
        return corrected


@register("gemma3n")
class Gemma3n(SlidingGemma):
    options: Gemma3nOptions

    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        w = Weights(gguf)
        o = self.options = Gemma3nOptions.from_config(config)
        self.load_stack(w, o.hidden, o.context_length, o.num_layers, lambda i: Block(w, i, o))
        self.per_layer = PerLayerInputs(w, o.num_layers, o.per_layer_dim, o.hidden, o.eps)
        c, extra = o.hidden, o.streams - 1
        self.altup_proj = w.tensor("altup_proj.weight", (extra, c, c))
        self.altup_unembd = w.tensor("altup_unembd_proj.weight", (extra, c, c))

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        o = self.options
        tokens = torch.tensor(batch.tokens)
        x = self.token_embd.lookup(tokens) * o.hidden**0.5
        per_layer = self.per_layer(tokens, x)
        target = x.square().mean(-1, keepdim=True).sqrt()
        h = torch.stack([x, *(rescaled(x @ p.t(), target) for p in self.altup_proj)])
        positions = torch.tensor(batch.positions)
        tables = {SLIDING: o.local_rope.cos_sin(positions), FULL: o.rope.cos_sin(positions)}
        for i, block in enumerate(self.blocks):
            cache.set_layer(i)
            table = tables[SLIDING if o.sliding[i] else FULL]
            h = block(h, per_layer[:, i], table, o.layer_rope(i), cache, o)
        rows = _rows(batch)
        if rows is not None:
            h = h[:, rows]
        target = h[0].square().mean(-1, keepdim=True).sqrt()
        back = [rescaled(s @ p.t(), target) for s, p in zip(h[1:], self.altup_unembd, strict=True)]
        return rms_norm(torch.stack([h[0], *back]).mean(0), self.output_norm, o.eps)
