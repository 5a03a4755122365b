"""Qwen3 (dense): the qwen2 layout without q/k/v biases, with an RMSNorm over each head of the
queries and keys before NeoX RoPE (QK-norm); the head size comes from `attention.key_length`."""

import torch
import torch.nn.functional as F

from ember.gguf import GGUFFile
from ember.kvcache import Cache
from ember.model.archs.llama import Llama, LlamaOptions
from ember.model.config import Config
from ember.model.registry import register
from ember.model.weights import Weights
from ember.nn import Rotation, attention, rms_norm


class Qwen3Block:
    def __init__(self, w: Weights, i: int, o: LlamaOptions) -> None:
        p, q_out, kv_out = f"blk.{i}.", o.num_heads * o.head_dim, o.num_kv_heads * o.head_dim
        self.splits = [q_out, kv_out, o.num_kv_heads * o.value_dim]
        self.attn_norm = w.tensor(p + "attn_norm.weight", (o.hidden,))
        self.attn_qkv = w.fused(
            [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"], self.splits, o.hidden
        )
        self.attn_q_norm = w.tensor(p + "attn_q_norm.weight", (o.head_dim,))
        self.attn_k_norm = w.tensor(p + "attn_k_norm.weight", (o.head_dim,))
        self.attn_output = w.linear(p + "attn_output.weight", o.hidden, o.num_heads * o.value_dim)
        self.ffn_norm = w.tensor(p + "ffn_norm.weight", (o.hidden,))
        self.ffn_gate_up = w.fused(
            [p + "ffn_gate.weight", p + "ffn_up.weight"], [o.ffn, o.ffn], o.hidden
        )
        self.ffn_down = w.linear(p + "ffn_down.weight", o.hidden, o.ffn)

    def __call__(
        self,
        x: torch.Tensor,
        rot: Rotation,
        cache: Cache,
        o: LlamaOptions,
        outputs: torch.Tensor | None,
    ) -> torch.Tensor:
        q, k, v = self.attn_qkv(rms_norm(x, self.attn_norm, o.eps)).split(self.splits, dim=-1)
        q = rms_norm(q.unflatten(-1, (o.num_heads, o.head_dim)), self.attn_q_norm, o.eps)
        k = rms_norm(k.unflatten(-1, (o.num_kv_heads, o.head_dim)), self.attn_k_norm, o.eps)
        qk = rot(torch.cat([q, k], dim=1))  # Llama.hidden's rotation: q heads scaled, then k
        v = v.unflatten(-1, (o.num_kv_heads, o.value_dim))
        h = attention(qk[:, : o.num_heads], qk[:, o.num_heads :], v, cache, scale=1.0)
        if outputs is not None:
            h, x = h[outputs], x[outputs]
        x = x + self.attn_output(h)
        gate, up = self.ffn_gate_up(rms_norm(x, self.ffn_norm, o.eps)).chunk(2, dim=-1)
        return x + self.ffn_down(F.silu(gate) * up)


@register("qwen3")
class Qwen3(Llama):
    is_neox_rope = True

    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        w = Weights(gguf)
        o = self.options = LlamaOptions.from_config(config, w, is_neox=True)
        self.vocab_size = w.vocab_size()
        self.context_length = o.context_length
        self.token_embd = w.embedding("token_embd.weight", self.vocab_size, o.hidden)
        self.blocks = [Qwen3Block(w, i, o) for i in range(o.num_layers)]  # type: ignore[misc]
        self.output_norm = w.tensor("output_norm.weight", (o.hidden,))
        self.output = w.output_head(self.vocab_size, o.hidden)
