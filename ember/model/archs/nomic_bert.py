"""nomic-bert encoders (nomic-embed-text v1 and v1.5) as llama.cpp writes them: BERT's
post-LayerNorm layers without biases, one fused qkv projection, rotary positions (NeoX halves)
instead of learned ones, a SwiGLU MLP, token types. Embedding-only, pooled as `pooling_type`
says; nothing is cached (each input is one batch, as for `bert`). The MoE variant is not run."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.kvcache import Cache
from ember.model.archs.bert import (
    Encoder,
    input_positions,
    layer_norm,
    layer_norm_weights,
    output_rows,
    sequence_mask,
)
from ember.model.config import Config, ModelLoadError
from ember.model.registry import register
from ember.model.weights import Weights
from ember.nn import RoPE, Rotation
from ember.pooling import POOLING_CLS, POOLING_MEAN


@dataclass(frozen=True, slots=True)
class NomicBertOptions:
    num_layers: int
    hidden: int
    num_heads: int
    head_dim: int
    ffn: int
    eps: float
    context_length: int
    type_vocab: int
    pooling_type: int
    rope: RoPE

    @classmethod
    def from_config(cls, c: Config) -> "NomicBertOptions":
        hidden, num_heads = c.uint("embedding_length"), c.uint("attention.head_count")
        if hidden % num_heads:
            raise ModelLoadError("nomic-bert: embedding_length must be a multiple of head_count")
        if c.metadata.get("nomic-bert.attention.causal", False) is not False:
            raise ModelLoadError("nomic-bert: only bidirectional attention is supported")
        pooling = c.metadata.get("nomic-bert.pooling_type", POOLING_MEAN)
        if pooling not in (POOLING_MEAN, POOLING_CLS):
            raise ModelLoadError(f"nomic-bert: pooling type {pooling!r} is not supported")
        head_dim = hidden // num_heads
        return cls(
            num_layers=c.uint("block_count", maximum=1024),
            hidden=hidden,
            num_heads=num_heads,
            head_dim=head_dim,
            ffn=c.uint("feed_forward_length"),
            eps=c.float("attention.layer_norm_epsilon", 1e-12),
            context_length=c.uint("context_length", 2048, maximum=1 << 20),
            type_vocab=c.uint("tokenizer.ggml.token_type_count", 2, absolute=True),
            pooling_type=pooling,
            rope=RoPE(head_dim, c.float("rope.freq_base", 1000.0), True),
        )


class Block:
    def __init__(self, w: Weights, i: int, o: NomicBertOptions) -> None:
        p, c = f"blk.{i}.", o.hidden
        self.attn_qkv = w.linear(p + "attn_qkv.weight", 3 * c, c)
        self.attn_output = w.linear(p + "attn_output.weight", c, c)
        self.attn_norm = layer_norm_weights(w, p + "attn_output_norm", c)
        self.ffn_gate_up = w.fused([p + "ffn_gate.weight", p + "ffn_up.weight"], [o.ffn] * 2, c)
        self.ffn_down = w.linear(p + "ffn_down.weight", c, o.ffn)
        self.out_norm = layer_norm_weights(w, p + "layer_output_norm", c)

    def __call__(
        self, x: torch.Tensor, rot: Rotation, mask: torch.Tensor | None, o: NomicBertOptions
    ) -> torch.Tensor:
        t, h = x.shape[0], o.num_heads
        qkv = self.attn_qkv(x).view(t, 3 * h, o.head_dim)
        qk = rot(qkv[:, : 2 * h]).transpose(0, 1)  # (2H, T, D), queries scaled
        v = qkv[:, 2 * h :].transpose(0, 1)
        attn = F.scaled_dot_product_attention(qk[:h], qk[h:], v, attn_mask=mask, scale=1.0)
        attn = self.attn_output(attn.transpose(0, 1).reshape(t, -1))
        x = layer_norm(x + attn, self.attn_norm, o.eps)
        gate_up = self.ffn_gate_up(x)
        mlp = self.ffn_down(F.silu(gate_up[:, : o.ffn]) * gate_up[:, o.ffn :])
        return layer_norm(x + mlp, self.out_norm, o.eps)


@register("nomic-bert")
class NomicBert(Encoder):
    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        w = Weights(gguf)
        o = self.options = NomicBertOptions.from_config(config)
        self.pooling_type = o.pooling_type  # read by the runner's engine
        self.vocab_size = w.vocab_size()
        self.context_length = o.context_length
        self.token_embd = w.embedding("token_embd.weight", self.vocab_size, o.hidden)
        self.token_types = w.tensor("token_types.weight", (o.type_vocab, o.hidden))
        self.embd_norm = layer_norm_weights(w, "token_embd_norm", o.hidden)
        self.blocks = [Block(w, i, o) for i in range(o.num_layers)]

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        """The final hidden state of each output row (one per token for an embedding)."""
        o = self.options
        positions = input_positions(batch, o.context_length)
        x = self.token_embd.lookup(torch.tensor(batch.tokens)) + self._types(batch)
        x = layer_norm(x, self.embd_norm, o.eps)
        groups = [(o.num_heads, o.head_dim**-0.5), (o.num_heads, 1.0)]
        rot = o.rope.rotation(positions, o.head_dim, groups)
        mask = sequence_mask(batch)
        for block in self.blocks:
            x = block(x, rot, mask, o)
        return output_rows(x, batch)
