"""Leaf data types that cross the runner/model seam: one batch of tokens from many sequences.

Tensor layout, stated once for the whole engine: activations are (T, C) with T the tokens of a
batch in order; attention heads are (T, H, D); the KV cache stores (H_kv, cells, D) per layer.
"""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Batch:
    """Tokens to run through the model in one forward pass.

    tokens, positions and sequences have one entry per token of the batch; outputs lists the
    indices (into tokens) whose logits the caller wants, in the order the logits come back.
    """

    tokens: tuple[int, ...]
    positions: tuple[int, ...]
    sequences: tuple[int, ...]
    outputs: tuple[int, ...]
    multimodal: tuple[int, ...] = ()  # indices of inputs that carry encoder (image) data
    # what each of those inputs carries (the model's own type: an image's embeddings), or ()
    multimodal_data: tuple[object, ...] = ()
    # each token's segment (BERT's token type: 0 the first text of a pair, 1 the second), or ()
    # when every token is of type 0
    token_types: tuple[int, ...] = ()
    # each token's RoPE position minus its cache position (after an image, for models whose
    # positions advance over it by less than its tokens: model.base.PositionShifter), or ()
    position_offsets: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if n == 0 or len(self.positions) != n or len(self.sequences) != n:
            raise ValueError("a batch needs one position and one sequence per token, and a token")
        if any(not 0 <= i < n for i in (*self.outputs, *self.multimodal)):
            raise ValueError("batch outputs and multimodal entries must index tokens of the batch")
        if self.multimodal_data and len(self.multimodal_data) != len(self.multimodal):
            raise ValueError("a batch needs data for each multimodal entry, or none")
        if self.token_types and len(self.token_types) != n:
            raise ValueError("a batch needs one token type per token, or none")
        if self.position_offsets and len(self.position_offsets) != n:
            raise ValueError("a batch needs one position offset per token, or none")

    @classmethod
    def single(cls, tokens: list[int], start: int, *, seq: int = 0) -> "Batch":
        """One sequence's tokens at positions start.., with logits of the last token only."""
        n = len(tokens)
        return cls(
            tokens=tuple(tokens),
            positions=tuple(range(start, start + n)),
            sequences=(seq,) * n,
            outputs=(n - 1,),
        )

    def __len__(self) -> int:
        return len(self.tokens)
