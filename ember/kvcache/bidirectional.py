"""Caches of encoders, whose every input is one whole batch: nothing is kept between batches.
`NoCache` stores nothing (a model that attends on its own); `BidirectionalCache` hands a layer
back the batch's own keys and values, each token seeing all of its sequence's tokens, or those
within a symmetric window on windowed layers (EmbeddingGemma's sliding layers)."""

import torch

from ember.batch import Batch
from ember.errors import EmberError


class NoCache:
    """The cache of an encoder that keeps nothing between batches (each input is one batch)."""

    def set_layer(self, layer: int) -> None:
        pass

    def put(self, key: torch.Tensor, value: torch.Tensor) -> None:
        raise EmberError("an encoder stores no keys or values")

    def get(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        raise EmberError("an encoder stores no keys or values")

    def view(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        return None  # nothing stored

    def init(
        self,
        *,
        max_sequences: int,
        capacity: int,
        max_batch: int,
        dtype: torch.dtype | str | None = None,
    ) -> None:
        pass

    def nbytes(self) -> int:
        return 0

    def planned_bytes(self, *, max_sequences: int, capacity: int, max_batch: int) -> int:
        return 0

    def start_forward(self, batch: Batch, *, reserve: bool = False) -> None:
        pass

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        pass

    def remove(self, seq: int, begin: int, end: int | None) -> None:
        pass

    def can_resume(self, seq: int, pos: int) -> bool:
        return False


class BidirectionalCache(NoCache):
    """The batch's keys and values for the layer that put them, with a mask where each token
    sees its own sequence: all of it, or only positions at most `window` away either side."""

    def __init__(self, windows: list[int | None]) -> None:
        self.windows = windows  # by layer: None for the whole input
        self.masks: dict[int | None, torch.Tensor | None] = {}
        self.layer = 0
        self.kv: tuple[torch.Tensor, torch.Tensor] | None = None

    def start_forward(self, batch: Batch, *, reserve: bool = False) -> None:
        sequences, positions = torch.tensor(batch.sequences), torch.tensor(batch.positions)
        same = sequences[:, None] == sequences[None, :]  # (T, T)
        distance = (positions[:, None] - positions[None, :]).abs()
        self.masks = {}
        for window in set(self.windows):
            seen = same if window is None else same & (distance <= window)
            self.masks[window] = None if bool(seen.all()) else _additive(seen)
        self.kv = None

    def set_layer(self, layer: int) -> None:
        self.layer = layer

    def put(self, key: torch.Tensor, value: torch.Tensor) -> None:
        self.kv = key.transpose(0, 1), value.transpose(0, 1)  # (H_kv, T, D)

    def get(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        if self.kv is None:
            raise EmberError("no keys were put for this batch")
        return (*self.kv, self.masks[self.windows[self.layer]])


def _additive(seen: torch.Tensor) -> torch.Tensor:
    return torch.zeros(seen.shape).masked_fill(~seen, float("-inf"))
