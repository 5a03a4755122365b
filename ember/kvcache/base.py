"""The Cache seam between models (put/get per layer) and the runner (cells, sequences, shifts)."""

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

from ember.batch import Batch
from ember.errors import EmberError

# Re-rotates stored keys after positions move: (layer, keys (H_kv, n, D), delta (n,)) -> keys.
ShiftFn = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


class CacheFullError(EmberError):
    """No free cells are left for the tokens of a batch."""


class Cache(Protocol):
    # --- used by models ---
    def set_layer(self, layer: int) -> None:
        """Selects the layer that the next put and get act on."""

    def put(self, key: torch.Tensor, value: torch.Tensor) -> None:
        """Stores the batch's keys and values (T, H_kv, D) of the current layer."""

    def get(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Keys, values (H_kv, S, D) visible to the batch, and an additive mask (T, S) or None."""

    def view(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        """get()'s keys, values and mask, the keys and values as stored (a float type, maybe
        float16, not copied); None where they are stored otherwise (quantized)."""

    # --- used by the runner ---
    def init(
        self,
        *,
        max_sequences: int,
        capacity: int,
        max_batch: int,
        dtype: torch.dtype | str | None = None,
    ) -> None:
        """Sizes the cell pool: capacity tokens for each of max_sequences sequences; dtype of
        the stored keys and values: a KV_TYPES name (f32, f16, bf16, q8_0, q4_0) or a float
        torch dtype (None: keep the cache's own, float32 by default)."""

    def nbytes(self) -> int:
        """Bytes the stored keys and values take (all layers, once allocated)."""

    def planned_bytes(self, *, max_sequences: int, capacity: int, max_batch: int) -> int:
        """Bytes the keys and values would take at that size, measured on the layers stored so
        far (run a small pass over every layer first)."""

    def start_forward(self, batch: Batch, *, reserve: bool = False) -> None:
        """Places the batch's tokens in free cells and builds the masks for this forward pass."""

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """Makes dst share src's cells for positions below length (no data is copied)."""

    def remove(self, seq: int, begin: int, end: int | None) -> None:
        """Drops seq's positions in [begin, end) and shifts later ones down (None: to the end)."""

    def can_resume(self, seq: int, pos: int) -> bool:
        """Whether seq can continue from pos with what the cache still holds."""


@runtime_checkable
class CellCounter(Protocol):
    """An optional capability of a cache: how full its pool of cells is (for metrics)."""

    def cell_usage(self) -> tuple[int, int]:
        """(cells holding a key of some sequence, cells in the pool)."""


@runtime_checkable
class PlainCausal(Protocol):
    """An optional capability of a cache: whether the current layer's mask is plain causal
    attention over every cell it shows, in order (token i of T sees cells 0..S-T+i), as for one
    sequence's prompt, batch after batch, with no window cutting in. Attention can then skip
    the cells above the diagonal by taking its queries in blocks."""

    def plain_causal(self) -> bool:
        """Whether get()'s (T, S) mask is the lower-right causal one."""

    def sliding_band(self) -> tuple[torch.Tensor, int] | None:
        """Where get()'s mask is one sequence's prompt under a sliding window: (cells, window),
        cells (m int64) the indices of the sequence's m cells among get()'s S in order of
        position, its T tokens the last; token i sees the last `window` of cells[0..m-T+i].
        Else None."""
