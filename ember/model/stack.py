"""What the pre-norm decoders written as one stack share (deepseek2, lfm2, laguna): a block's
two residual steps, and a model of `token_embd`, blocks `blk.N`, a final norm and the head
(`output`, or the embeddings tied), whose forward is the head over its hidden states."""

from collections.abc import Callable
from typing import Any

import torch

from ember.batch import Batch
from ember.kvcache import Cache
from ember.model.weights import Weights
from ember.nn import rms_norm


class PreNormBlock:
    """Subclasses set attn_norm, ffn_norm and ffn, and hand their mixer's output to residual."""

    attn_norm: torch.Tensor
    ffn_norm: torch.Tensor
    ffn: Callable[[torch.Tensor], torch.Tensor]

    def residual(
        self, x: torch.Tensor, mixed: torch.Tensor, eps: float, outputs: torch.Tensor | None
    ) -> torch.Tensor:
        """x + mixed (the attention's or convolution's output of norm(x)), then the MLP's step;
        in the last layer only the rows whose logits are wanted (`outputs`) go on."""
        if outputs is not None:
            mixed, x = mixed[outputs], x[outputs]
        x = x + mixed
        return x + self.ffn(rms_norm(x, self.ffn_norm, eps))


class DecoderStack:
    vocab_size: int
    context_length: int
    blocks: list[Any]

    def load_stack(
        self, w: Weights, hidden: int, context_length: int, num_layers: int,
        block: Callable[[int], Any], norm: str = "output_norm.weight",
    ) -> None:  # fmt: skip
        self.vocab_size = w.vocab_size()
        self.context_length = context_length
        self.token_embd = w.embedding("token_embd.weight", self.vocab_size, hidden)
        self.blocks = [block(i) for i in range(num_layers)]
        self.output_norm = w.tensor(norm, (hidden,))
        self.output = w.output_head(self.vocab_size, hidden)

    def embed(self, batch: Batch) -> torch.Tensor:
        return self.token_embd.lookup(torch.tensor(batch.tokens))  # (T, C)

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, batch: Batch, cache: Cache) -> torch.Tensor:
        return self.logits(self.hidden(batch, cache))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.output(hidden)
