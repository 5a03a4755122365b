"""OLMo 2 and OLMo 3: no pre-norms; RMSNorms after attention and after the MLP (on the branch,
before the residual add), QK-norm over the whole q and k projections (all heads at once) before
NeoX RoPE, SwiGLU MLP. OLMo 3 adds sliding-window layers (`attention.sliding_window_pattern`,
three of four) and YaRN on its full-attention layers only, as Ollama's olmo3 and llama.cpp's olmo2
(which holds OLMo 3 files under this name) run them."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.kvcache import Cache, CausalCache, WrapperCache
from ember.model.config import Config, ModelLoadError
from ember.model.registry import register
from ember.model.weights import Weights
from ember.nn import RoPE, attention, rms_norm
from ember.nn.yarn import yarn_attention_factor, yarn_factors

SLIDING, FULL = 0, 1  # the caches of WrapperCache
DEFAULT_PATTERN = 4  # with a window and no pattern: layer i slides unless (i + 1) % 4 == 0 (HF's)


@dataclass(frozen=True, slots=True)
class Olmo2Options:
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn: int
    eps: float
    context_length: int
    rope: RoPE  # full-attention layers (YaRN where the file scales RoPE)
    rope_scale: float  # YaRN's factor on the full layers' cosines and sines (1.0 without it)
    local_rope: RoPE  # sliding-window layers: never scaled
    window: int  # 0: no sliding-window layers
    sliding: tuple[bool, ...]  # per layer

    @classmethod
    def from_config(cls, c: Config) -> "Olmo2Options":
        hidden, num_heads = c.uint("embedding_length"), c.uint("attention.head_count")
        head_dim = c.uint("attention.key_length", hidden // num_heads)
        num_layers = c.uint("block_count", maximum=1024)
        base = c.float("rope.freq_base", 10000.0)
        scaling = c.string("rope.scaling.type", "none")
        factors, rope_scale = None, 1.0
        if scaling == "yarn":
            factor = c.float("rope.scaling.factor")
            original = c.uint("rope.scaling.original_context_length", maximum=1 << 28)
            factors = yarn_factors(head_dim, base, factor, original)
            rope_scale = c.float("rope.scaling.attn_factor", yarn_attention_factor(factor))
        elif scaling != "none":
            raise ModelLoadError(f"olmo: RoPE scaling {scaling!r} is not supported")
        window = c.uint("attention.sliding_window", 0, maximum=1 << 28)  # 0: none
        pattern = c.bools("attention.sliding_window_pattern", num_layers)
        if pattern is None:
            pattern = tuple((i + 1) % DEFAULT_PATTERN != 0 for i in range(num_layers))
        return cls(
            num_layers=num_layers,
            hidden=hidden,
            num_heads=num_heads,
            num_kv_heads=c.uint("attention.head_count_kv", num_heads),
            head_dim=head_dim,
            ffn=c.uint("feed_forward_length"),
            eps=c.float("attention.layer_norm_rms_epsilon", 1e-6),
            context_length=c.uint("context_length", 4096, maximum=1 << 28),
            rope=RoPE(head_dim, base, True, factors=factors),
            rope_scale=rope_scale,
            local_rope=RoPE(head_dim, base, True),
            window=window,
            sliding=pattern if window else (False,) * num_layers,
        )

    def layer_rope(self, i: int) -> RoPE:
        return self.local_rope if self.sliding[i] else self.rope


class Block:
    def __init__(self, w: Weights, i: int, o: Olmo2Options) -> None:
        p, q_out, kv_out = f"blk.{i}.", o.num_heads * o.head_dim, o.num_kv_heads * o.head_dim
        self.splits = [q_out, kv_out, kv_out]
        self.attn_qkv = w.fused(
            [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"], self.splits, o.hidden
        )
        self.attn_q_norm = w.tensor(p + "attn_q_norm.weight", (q_out,))
        self.attn_k_norm = w.tensor(p + "attn_k_norm.weight", (kv_out,))
        self.attn_output = w.linear(p + "attn_output.weight", o.hidden, q_out)
        self.post_attention_norm = w.tensor(p + "post_attention_norm.weight", (o.hidden,))
        self.ffn_gate_up = w.fused(
            [p + "ffn_gate.weight", p + "ffn_up.weight"], [o.ffn, o.ffn], o.hidden
        )
        self.ffn_down = w.linear(p + "ffn_down.weight", o.hidden, o.ffn)
        self.post_ffw_norm = w.tensor(p + "post_ffw_norm.weight", (o.hidden,))

    def __call__(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        cache: Cache,
        o: Olmo2Options,
        outputs: torch.Tensor | None,
    ) -> torch.Tensor:
        """rope: this layer's cosines and sines (YaRN's scale folded in); the rotation itself
        is the same NeoX one for either kind of layer."""
        q, k, v = self.attn_qkv(x).split(self.splits, dim=-1)
        q = rms_norm(q, self.attn_q_norm, o.eps).unflatten(-1, (o.num_heads, o.head_dim))
        k = rms_norm(k, self.attn_k_norm, o.eps).unflatten(-1, (o.num_kv_heads, o.head_dim))
        q, k = o.rope.apply(q, *rope), o.rope.apply(k, *rope)
        v = v.unflatten(-1, (o.num_kv_heads, o.head_dim))
        h = attention(q, k, v, cache, scale=o.head_dim**-0.5)
        if outputs is not None:
            h, x = h[outputs], x[outputs]
        x = x + rms_norm(self.attn_output(h), self.post_attention_norm, o.eps)
        gate, up = self.ffn_gate_up(x).chunk(2, dim=-1)
        return x + rms_norm(self.ffn_down(F.silu(gate) * up), self.post_ffw_norm, o.eps)


@register("olmo2", "olmo3")
class Olmo2:
    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        w = Weights(gguf)
        o = self.options = Olmo2Options.from_config(config)
        self.vocab_size = w.vocab_size()
        self.context_length = o.context_length
        self.token_embd = w.embedding("token_embd.weight", self.vocab_size, o.hidden)
        self.blocks = [Block(w, i, o) for i in range(o.num_layers)]
        self.output_norm = w.tensor("output_norm.weight", (o.hidden,))
        self.output = w.output_head(self.vocab_size, o.hidden)

    def make_cache(self) -> Cache:
        o = self.options
        if not o.window:
            return CausalCache(shift=self.shift)
        caches = [CausalCache(window=o.window, shift=self.shift), CausalCache(shift=self.shift)]
        return WrapperCache(caches, [SLIDING if s else FULL for s in o.sliding])

    def shift(self, layer: int, key: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return self.options.layer_rope(layer).shift(key, delta)

    def forward(self, batch: Batch, cache: Cache) -> torch.Tensor:
        return self.logits(self.hidden(batch, cache))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.output(hidden)

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        o = self.options
        x = self.token_embd.lookup(torch.tensor(batch.tokens))  # (T, C)
        positions = torch.tensor(batch.positions)
        cos, sin = o.rope.cos_sin(positions)
        full = (cos * o.rope_scale, sin * o.rope_scale) if o.rope_scale != 1.0 else (cos, sin)
        local = o.local_rope.cos_sin(positions) if any(o.sliding) else full
        outputs = torch.tensor(batch.outputs, dtype=torch.long)
        for i, block in enumerate(self.blocks):
            cache.set_layer(i)
            rope = local if o.sliding[i] else full
            x = block(x, rope, cache, o, outputs if i == o.num_layers - 1 else None)
        return rms_norm(x, self.output_norm, o.eps)
