"""A cache per layer type (e.g. sliding-window and global layers), behind one Cache."""

from collections.abc import Sequence

import torch

from ember.batch import Batch
from ember.kvcache.base import Cache, CellCounter, PlainCausal


class WrapperCache:
    def __init__(self, caches: Sequence[Cache], layer_types: Sequence[int]) -> None:
        """layer_types[i] is the index in caches of the cache that layer i uses."""
        self.caches = list(caches)
        self.layer_types = list(layer_types)
        self.current = self.caches[0]

    def init(
        self,
        *,
        max_sequences: int,
        capacity: int,
        max_batch: int,
        dtype: torch.dtype | str | None = None,
    ) -> None:
        for c in self.caches:
            c.init(max_sequences=max_sequences, capacity=capacity, max_batch=max_batch, dtype=dtype)

    def nbytes(self) -> int:
        return sum(c.nbytes() for c in self.caches)

    def planned_bytes(self, *, max_sequences: int, capacity: int, max_batch: int) -> int:
        size = {"max_sequences": max_sequences, "capacity": capacity, "max_batch": max_batch}
        return sum(c.planned_bytes(**size) for c in self.caches)

    def cell_usage(self) -> tuple[int, int]:
        """Summed over the caches that count their cells (an encoder cache does not)."""
        usages = [c.cell_usage() for c in self.caches if isinstance(c, CellCounter)]
        return sum(u for u, _ in usages), sum(t for _, t in usages)

    def start_forward(self, batch: Batch, *, reserve: bool = False) -> None:
        for c in self.caches:
            c.start_forward(batch, reserve=reserve)

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        for c in self.caches:
            c.copy_prefix(src, dst, length)

    def remove(self, seq: int, begin: int, end: int | None) -> None:
        for c in self.caches:
            c.remove(seq, begin, end)

    def can_resume(self, seq: int, pos: int) -> bool:
        return all(c.can_resume(seq, pos) for c in self.caches)

    def set_layer(self, layer: int) -> None:
        self.current = self.caches[self.layer_types[layer]]
        self.current.set_layer(layer)

    def put(self, key: torch.Tensor, value: torch.Tensor) -> None:
        self.current.put(key, value)

    def get(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        return self.current.get()

    def view(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        return self.current.view()

    def plain_causal(self) -> bool:
        return isinstance(self.current, PlainCausal) and self.current.plain_causal()

    def sliding_band(self) -> tuple[torch.Tensor, int] | None:
        return self.current.sliding_band() if isinstance(self.current, PlainCausal) else None
