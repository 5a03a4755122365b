"""Llama 4 (text): a pre-norm decoder whose every n-th layer (`no_rope_interval`, 4) attends
over everything without RoPE, its queries scaled up with the position (temperature tuning),
while the others rotate adjacent pairs, RMS-normalize q and k without a weight (QK-norm) and
attend within chunks of `attention.chunk_size` tokens. Every `interleave_moe_layer_step`-th
layer's MLP is a mixture: a shared SwiGLU expert plus top-k experts, chosen by a sigmoid
router whose weights scale each expert's input (ember/nn/moe.py); the rest are dense SwiGLU.

Keys: llama.cpp's and Ollama's. Feed-forward sizes come from the tensors, since the two
converters write `feed_forward_length` differently (llama.cpp: the dense MLP's; Ollama: the
experts')."""

from dataclasses import dataclass

import torch

from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.kvcache import Cache, CausalCache, WrapperCache
from ember.model.archs.llama import _rows, llama_rope
from ember.model.config import Config
from ember.model.mlp import SwiGLU, routed_experts
from ember.model.registry import register
from ember.model.weights import Weights
from ember.nn import RoPE, Rotation, attention, rms_norm
from ember.nn.moe import mixture, sigmoid_top_k

MAVERICK_EXPERTS = 128  # llama.cpp turns QK-norm off for this model (no `use_qk_norm` key)


@dataclass(frozen=True, slots=True)
class Llama4Options:
    num_layers: int
    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    context_length: int
    rope: RoPE
    chunk: int  # RoPE layers attend within chunks of this many positions
    no_rope_interval: int  # layers n-1, 2n-1, ... have no RoPE and attend over everything
    moe_interval: int  # layers n-1, 2n-1, ... are mixtures of experts
    num_experts: int
    num_experts_used: int
    use_qk_norm: bool
    use_temperature: bool  # NoPE layers scale queries by 1 + scale * log1p(floor((p+1)/floor))
    temperature_scale: float
    temperature_floor: float

    @classmethod
    def from_config(cls, c: Config, w: Weights) -> "Llama4Options":
        hidden, num_heads = c.uint("embedding_length"), c.uint("attention.head_count")
        head_dim = c.uint("attention.key_length", c.uint("attention.head_dim", hidden // num_heads))
        num_experts = c.uint("expert_count", maximum=4096)
        return cls(
            num_layers=c.uint("block_count", maximum=1024),
            hidden=hidden,
            num_heads=num_heads,
            num_kv_heads=c.uint("attention.head_count_kv", num_heads),
            head_dim=head_dim,
            eps=c.float("attention.layer_norm_rms_epsilon", 1e-5),
            context_length=c.uint("context_length", 131072, maximum=1 << 28),
            rope=llama_rope(c, w, head_dim, is_neox=False),
            chunk=c.uint("attention.chunk_size", 8192, maximum=1 << 28),
            no_rope_interval=c.uint("no_rope_interval", 4, maximum=1024),
            moe_interval=c.uint("interleave_moe_layer_step", 1, maximum=1024),
            num_experts=num_experts,
            num_experts_used=c.uint("expert_used_count", maximum=num_experts),
            use_qk_norm=c.bool("use_qk_norm", num_experts != MAVERICK_EXPERTS),
            use_temperature=c.bool("attention.temperature_tuning", True),
            temperature_scale=c.float("attention.scale", 0.1),
            temperature_floor=c.float("attention.floor_scale", 8192.0),
        )

    def uses_rope(self, layer: int) -> bool:
        return (layer + 1) % self.no_rope_interval != 0

    def is_moe(self, layer: int) -> bool:
        return (layer + 1) % self.moe_interval == 0

    def temperatures(self, positions: torch.Tensor) -> torch.Tensor:
        """The NoPE layers' query scales (T,) at positions (T,), in float32 as HF computes."""
        steps = torch.floor((positions.float() + 1.0) / self.temperature_floor)
        return torch.log1p(steps) * self.temperature_scale + 1.0


class Mixture:
    """A shared expert plus the router's top-k experts, their inputs scaled by its sigmoids."""

    def __init__(self, w: Weights, prefix: str, o: Llama4Options) -> None:
        p, e, c = prefix, o.num_experts, o.hidden
        self.num_experts_used = o.num_experts_used
        self.ffn_gate_inp = w.linear(p + "ffn_gate_inp.weight", e, c)
        self.shared = SwiGLU(w, p, "_shexp", c)
        self.experts = routed_experts(w, p, e, c)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        routing = sigmoid_top_k(self.ffn_gate_inp(x), self.num_experts_used)
        return self.shared(x) + mixture(x, routing, self.experts, weights_inputs=True)


class Block:
    """One layer, its weights named as in the GGUF (`blk.N.*`)."""

    def __init__(self, w: Weights, i: int, o: Llama4Options) -> None:
        p, c = f"blk.{i}.", o.hidden
        self.uses_rope = o.uses_rope(i)
        self.splits = [o.num_heads * o.head_dim, *[o.num_kv_heads * o.head_dim] * 2]
        self.attn_norm = w.tensor(p + "attn_norm.weight", (c,))
        self.attn_qkv = w.fused([p + f"attn_{n}.weight" for n in "qkv"], self.splits, c)
        self.attn_output = w.linear(p + "attn_output.weight", c, self.splits[0])
        self.ffn_norm = w.tensor(p + "ffn_norm.weight", (c,))
        self.ffn = Mixture(w, p, o) if o.is_moe(i) else SwiGLU(w, p, "", c)

    def __call__(
        self,
        x: torch.Tensor,
        rot: Rotation,
        temperatures: torch.Tensor | None,
        cache: Cache,
        o: Llama4Options,
        outputs: torch.Tensor | None,
    ) -> torch.Tensor:
        q, k, v = self.attn_qkv(rms_norm(x, self.attn_norm, o.eps)).split(self.splits, dim=-1)
        q = q.unflatten(-1, (o.num_heads, o.head_dim))  # (T, H, D)
        k = k.unflatten(-1, (o.num_kv_heads, o.head_dim))
        if self.uses_rope:
            qk = rot(torch.cat([q, k], dim=1))
            if o.use_qk_norm:  # after the rotation, as HF: a rotation keeps the norm anyway
                qk = rms_norm(qk, None, o.eps)
            q, k = qk[:, : o.num_heads], qk[:, o.num_heads :]
        elif temperatures is not None:
            q = q * temperatures[:, None, None]
        v = v.unflatten(-1, (o.num_kv_heads, o.head_dim))
        h = attention(q, k, v, cache, scale=o.head_dim**-0.5)
        if outputs is not None:  # last layer: only the rows whose logits are wanted go on
            h, x = h[outputs], x[outputs]
        x = x + self.attn_output(h)
        return x + self.ffn(rms_norm(x, self.ffn_norm, o.eps))


@register("llama4")
class Llama4:
    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        w = Weights(gguf)
        o = self.options = Llama4Options.from_config(config, w)
        self.vocab_size = w.vocab_size()
        self.context_length = o.context_length
        self.token_embd = w.embedding("token_embd.weight", self.vocab_size, o.hidden)
        self.blocks = [Block(w, i, o) for i in range(o.num_layers)]
        self.output_norm = w.tensor("output_norm.weight", (o.hidden,))
        self.output = w.output_head(self.vocab_size, o.hidden)

    def make_cache(self) -> Cache:
        o = self.options
        chunked = CausalCache(chunk=o.chunk, shift=self.shift)
        layer_types = [0 if o.uses_rope(i) else 1 for i in range(o.num_layers)]
        return WrapperCache([chunked, CausalCache(shift=self.shift)], layer_types)

    def shift(self, layer: int, key: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """NoPE layers' keys carry no position: they stay as they are."""
        return self.options.rope.shift(key, delta) if self.options.uses_rope(layer) else key

    def forward(self, batch: Batch, cache: Cache) -> torch.Tensor:
        return self.logits(self.hidden(batch, cache))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.output(hidden)

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        o = self.options
        x = self.token_embd.lookup(torch.tensor(batch.tokens))  # (T, C)
        positions = torch.tensor(batch.positions)
        rot = o.rope.rotation(positions, o.head_dim, [(o.num_heads, 1.0), (o.num_kv_heads, 1.0)])
        temperatures = o.temperatures(positions) if o.use_temperature else None
        outputs = _rows(batch)
        for i, block in enumerate(self.blocks):
            cache.set_layer(i)
            last = outputs if i == o.num_layers - 1 else None
            x = block(x, rot, temperatures, cache, o, last)
        return rms_norm(x, self.output_norm, o.eps)
