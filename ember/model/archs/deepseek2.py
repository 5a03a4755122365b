"""DeepSeek V2 and V3 (`deepseek2`, the name llama.cpp and Ollama give both) and GLM-4.7-Flash
(Ollama's `glm4moelite`; llama.cpp writes it as `deepseek2`): multi-head latent attention, then
a mixture of experts in every layer after the first `leading_dense_block_count`.

Attention. Queries come from `attn_q`, or low-rank from `attn_q_a`, its norm and `attn_q_b`;
each head's are `key_length - rope` dims without position and `rope` dims that RoPE rotates
(adjacent pairs: ggml's normal mode). Keys and values come from one latent: `attn_kv_a_mqa`
gives `kv_lora_rank` values, RMS-normalized, and `rope` key dims shared by every head.
- Files as Ollama's converter writes them (`attn_kv_b`) expand the latent into each head's key
  and value, and the cache holds those per head.
- Files with the split `attn_k_b` / `attn_v_b` (llama.cpp's, Ollama's glm4moelite) cache the
  latent itself as one key and value head: `attn_k_b` folds into the queries and `attn_v_b`
  applies after attention (the absorbed form, Ollama's v3.1 path). Same scores, less cache.
  A head's dims come from those tensors: the two writers swap `key_length` and its `_mla` twin.
Keys are laid out [rotated part, the rest], so that a context shift turns their first `rope`
dims. YaRN where the file says; its magnitude (1 + yarn_log_multiplier * ln factor) squared
scales the scores, as Ollama and HF's DeepSeek do.

Experts. The router's scores are sigmoids (`expert_gating_func` 2: V3, GLM) or a softmax (1, and
deepseek2 files without the key: V2, as llama.cpp reads them); ember/nn/moe.py's deepseek_top_k
picks and weighs them (ember/model/mlp.py's ScoredMixture). A shared SwiGLU expert (`*_shexp`)
is added to the routed ones."""

import math
from dataclasses import dataclass

import torch

from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.kvcache import Cache, CausalCache
from ember.model.archs.llama import _rows
from ember.model.config import Config, ModelLoadError
from ember.model.mlp import ScoredMixture, SwiGLU
from ember.model.registry import register
from ember.model.stack import DecoderStack, PreNormBlock
from ember.model.weights import Weights
from ember.nn import RoPE, attention, rms_norm
from ember.nn.yarn import yarn_factors

GATING_SOFTMAX, GATING_SIGMOID = 1, 2  # llama.cpp's expert_gating_func


@dataclass(frozen=True, slots=True)
class DeepSeek2Options:
    num_layers: int
    hidden: int
    num_heads: int
    eps: float
    context_length: int
    q_lora_rank: int  # 0: queries from attn_q
    kv_lora_rank: int
    nope: int  # a head's key dims without position
    rope_dim: int  # ... and those RoPE rotates
    value_dim: int
    is_mla: bool  # the latent cached (attn_k_b / attn_v_b), not each head's key and value
    scale: float  # of the scores
    rope: RoPE
    leading_dense: int
    num_experts: int
    num_experts_used: int
    sigmoid: bool
    is_normalized: bool
    expert_scale: float
    groups: int
    groups_used: int

    @classmethod
    def from_config(cls, c: Config, w: Weights) -> "DeepSeek2Options":
        hidden, num_heads = c.uint("embedding_length"), c.uint("attention.head_count", maximum=4096)
        rope_dim = c.uint("rope.dimension_count")
        is_mla = w.has("blk.0.attn_k_b.weight")
        if is_mla:  # (heads, lora, nope) and (heads, value, lora)
            key = w.shape("blk.0.attn_k_b.weight")[2] + rope_dim
            value = w.shape("blk.0.attn_v_b.weight")[1]
        else:
            key, value = c.uint("attention.key_length"), c.uint("attention.value_length")
        if key <= rope_dim:
            raise ModelLoadError("deepseek2: attention.key_length must exceed the RoPE dims")
        base = c.float("rope.freq_base", 10000.0)
        factors, magnitude = None, 1.0
        scaling = c.string("rope.scaling.type", "none")
        if scaling == "yarn":
            factor = c.float("rope.scaling.factor")
            original = c.uint("rope.scaling.original_context_length", maximum=1 << 28)
            factors = yarn_factors(rope_dim, base, factor, original)
            magnitude = 1.0 + c.float("rope.scaling.yarn_log_multiplier", 0.0) * math.log(factor)
        elif scaling not in ("none", ""):
            raise ModelLoadError(f"deepseek2: RoPE scaling {scaling!r} is not supported")
        num_experts = c.uint("expert_count", maximum=4096)
        is_glm = c.arch == "glm4moelite"  # Ollama's defaults for it: sigmoids, normalized
        default_gating = GATING_SIGMOID if is_glm else GATING_SOFTMAX
        gating = c.uint("expert_gating_func", default_gating, maximum=2)
        groups = c.uint("expert_group_count", 1, maximum=num_experts)
        if num_experts % groups:
            raise ModelLoadError("deepseek2: expert_count must be a multiple of its groups")
        return cls(
            num_layers=c.uint("block_count", maximum=1024),
            hidden=hidden,
            num_heads=num_heads,
            eps=c.float("attention.layer_norm_rms_epsilon", 1e-6),
            context_length=c.uint("context_length", 4096, maximum=1 << 28),
            q_lora_rank=int(c.metadata.get(f"{c.arch}.attention.q_lora_rank") or 0),  # 0: none
            kv_lora_rank=c.uint("attention.kv_lora_rank"),
            nope=key - rope_dim,
            rope_dim=rope_dim,
            value_dim=value,
            is_mla=is_mla,
            scale=magnitude * magnitude / key**0.5,
            rope=RoPE(rope_dim, base, False, factors=factors),
            leading_dense=int(c.metadata.get(f"{c.arch}.leading_dense_block_count") or 0),
            num_experts=num_experts,
            num_experts_used=c.uint("expert_used_count", maximum=num_experts),
            sigmoid=gating == GATING_SIGMOID,
            is_normalized=c.bool("expert_weights_norm", is_glm),
            expert_scale=c.float("expert_weights_scale", 1.0),
            groups=groups,
            groups_used=c.uint("expert_group_used_count", 1, maximum=groups),
        )


class LatentAttention:
    """Multi-head latent attention, in either of the files' forms (the module docstring)."""

    def __init__(self, w: Weights, p: str, o: DeepSeek2Options) -> None:
        c, h, r = o.hidden, o.num_heads, o.kv_lora_rank
        q_out = h * (o.nope + o.rope_dim)
        if o.q_lora_rank:
            self.q_a = w.linear(p + "attn_q_a.weight", o.q_lora_rank, c)
            self.q_a_norm = w.tensor(p + "attn_q_a_norm.weight", (o.q_lora_rank,))
            self.q_b = w.linear(p + "attn_q_b.weight", q_out, o.q_lora_rank)
        else:
            self.q = w.linear(p + "attn_q.weight", q_out, c)
        self.kv_a = w.linear(p + "attn_kv_a_mqa.weight", r + o.rope_dim, c)
        self.kv_a_norm = w.tensor(p + "attn_kv_a_norm.weight", (r,))
        if o.is_mla:  # one projection per head
            self.k_b = w.experts(p + "attn_k_b.weight", h, r, o.nope)
            self.v_b = w.experts(p + "attn_v_b.weight", h, o.value_dim, r)
        else:
            self.kv_b = w.linear(p + "attn_kv_b.weight", h * (o.nope + o.value_dim), r)
        self.output = w.linear(p + "attn_output.weight", c, h * o.value_dim)

    def __call__(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], cache: Cache,
        o: DeepSeek2Options,
    ) -> torch.Tensor:  # fmt: skip
        t, h = x.shape[0], o.num_heads
        q = self.q_b(rms_norm(self.q_a(x), self.q_a_norm, o.eps)) if o.q_lora_rank else self.q(x)
        q_nope, q_pe = q.unflatten(-1, (h, -1)).split([o.nope, o.rope_dim], dim=-1)
        latent, k_pe = self.kv_a(x).split([o.kv_lora_rank, o.rope_dim], dim=-1)
        latent = rms_norm(latent, self.kv_a_norm, o.eps)
        q_pe = o.rope.apply(q_pe, *rope)
        k_pe = o.rope.apply(k_pe[:, None, :], *rope)  # (T, 1, rope): every head's
        if o.is_mla:
            absorbed = torch.stack([self.k_b[i](q_nope[:, i]) for i in range(h)], dim=1)
            query = torch.cat([q_pe, absorbed], dim=-1)  # (T, H, rope + lora)
            key = torch.cat([k_pe, latent[:, None, :]], dim=-1)  # (T, 1, rope + lora)
            mixed = attention(query, key, latent[:, None, :], cache, scale=o.scale)
            mixed = mixed.view(t, h, o.kv_lora_rank)
            out = torch.cat([self.v_b[i](mixed[:, i]) for i in range(h)], dim=-1)
        else:
            k_nope, v = self.kv_b(latent).unflatten(-1, (h, -1)).split([o.nope, o.value_dim], -1)
            query = torch.cat([q_pe, q_nope], dim=-1)
            key = torch.cat([k_pe.expand(t, h, o.rope_dim), k_nope], dim=-1)
            out = attention(query, key, v.contiguous(), cache, scale=o.scale)
        return self.output(out)


class Block(PreNormBlock):
    def __init__(self, w: Weights, i: int, o: DeepSeek2Options) -> None:
        p, c = f"blk.{i}.", o.hidden
        self.attn_norm = w.tensor(p + "attn_norm.weight", (c,))
        self.attention = LatentAttention(w, p, o)
        self.ffn_norm = w.tensor(p + "ffn_norm.weight", (c,))
        if i < o.leading_dense:
            self.ffn: SwiGLU | ScoredMixture = SwiGLU(w, p, "", c)
        else:
            self.ffn = ScoredMixture(
                w, p, c, o.num_experts, o.num_experts_used, sigmoid=o.sigmoid,
                is_normalized=o.is_normalized, scale=o.expert_scale, groups=o.groups,
                groups_used=o.groups_used,
            )  # fmt: skip

    def __call__(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: Cache,
        o: DeepSeek2Options,
        outputs: torch.Tensor | None,
    ) -> torch.Tensor:
        h = self.attention(rms_norm(x, self.attn_norm, o.eps), rope, cache, o)
        return self.residual(x, h, o.eps, outputs)


@register("deepseek2", "glm4moelite")
class DeepSeek2(DecoderStack):
    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        w = Weights(gguf)
        o = self.options = DeepSeek2Options.from_config(config, w)
        self.load_stack(w, o.hidden, o.context_length, o.num_layers, lambda i: Block(w, i, o))

    def make_cache(self) -> Cache:
        return CausalCache(shift=self.shift)

    def shift(self, layer: int, key: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return self.options.rope.shift(key, delta)  # the first rope dims; the rest stay

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        o = self.options
        x = self.embed(batch)
        rope = o.rope.cos_sin(torch.tensor(batch.positions))
        outputs = _rows(batch)
        for i, block in enumerate(self.blocks):
            cache.set_layer(i)
            x = block(x, rope, cache, o, outputs if i == o.num_layers - 1 else None)
        return rms_norm(x, self.output_norm, o.eps)
