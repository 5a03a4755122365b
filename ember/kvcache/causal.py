"""Causal KV cache over a shared pool of cells, optionally with a sliding window or chunked
attention (a query sees only the keys of its own chunk: p - p % chunk <= q <= p, as llama4's).

Every sequence draws cells from one pool; a cell may belong to several sequences (shared
prefixes), tracked as a bit mask of sequence ids. Masks follow the transformers convention
for sliding windows: a query at position p sees keys at positions p - window < q <= p.
"""

import torch

from ember.batch import Batch
from ember.kvcache.base import CacheFullError, ShiftFn

MAX_SEQUENCES = 63  # sequence membership is a bit mask in one int64


class CausalCache:
    def __init__(
        self,
        *,
        window: int | None = None,
        chunk: int | None = None,
        shift: ShiftFn | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if window is not None and chunk is not None:
            raise ValueError("a cache has a sliding window or chunks, not both")
        self.window, self.chunk = window, chunk
        self.shift_fn = shift
        self.dtype = dtype
        self.layer = 0
        self.keys: dict[int, torch.Tensor] = {}  # layer -> (H_kv, cells, D)
        self.values: dict[int, torch.Tensor] = {}
        self.num_cells = 0

    # --- cache management ---
    def init(
        self, *, max_sequences: int, capacity: int, max_batch: int, dtype: torch.dtype | None = None
    ) -> None:
        if not 1 <= max_sequences <= MAX_SEQUENCES:
            raise ValueError(f"max_sequences must be within 1..{MAX_SEQUENCES}")
        if dtype is not None:
            self.dtype = dtype
        self.num_cells = max_sequences * capacity
        self.cell_pos = torch.full((self.num_cells,), -1, dtype=torch.int64)
        self.cell_seqs = torch.zeros(self.num_cells, dtype=torch.int64)  # bit mask
        self.keys.clear()
        self.values.clear()

    def start_forward(self, batch: Batch, *, reserve: bool = False) -> None:
        n = len(batch)
        positions = torch.tensor(batch.positions, dtype=torch.int64)
        seq_bits = torch.tensor([1 << s for s in batch.sequences], dtype=torch.int64)
        if reserve:  # a dry run: the batch writes free cells and sees every cell up to its end
            self.locs = torch.arange(n)
            self.lo, self.hi = 0, min(self.num_cells, int(positions.max()) + 1)
            self.mask: torch.Tensor | None = None
            return
        free = (self.cell_seqs == 0).nonzero().squeeze(1)
        if free.numel() < n:
            raise CacheFullError(f"the KV cache has {free.numel()} free cells, the batch needs {n}")
        self.locs = free[:n]
        self.cell_pos[self.locs] = positions
        self.cell_seqs[self.locs] = seq_bits
        self.mask = self._build_mask(positions, seq_bits)

    def _build_mask(self, positions: torch.Tensor, seq_bits: torch.Tensor) -> torch.Tensor | None:
        batch_bits = _or_all(seq_bits)
        used = ((self.cell_seqs & batch_bits) != 0).nonzero().squeeze(1)
        self.lo, self.hi = int(used[0]), int(used[-1]) + 1
        cell_pos = self.cell_pos[self.lo : self.hi]  # (S,)
        in_seq = (self.cell_seqs[self.lo : self.hi][None, :] & seq_bits[:, None]) != 0  # (T, S)
        visible = in_seq & (cell_pos[None, :] <= positions[:, None])
        if self.window is not None:
            visible &= cell_pos[None, :] > positions[:, None] - self.window
        if self.chunk is not None:
            visible &= cell_pos[None, :] >= positions[:, None] - positions[:, None] % self.chunk
        if bool(visible.all()):
            return None  # plain attention over everything: lets SDPA take its fastest path
        mask = torch.zeros(visible.shape, dtype=torch.float32)
        return mask.masked_fill_(~visible, float("-inf"))

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        dst_bit, src_bit = 1 << dst, 1 << src
        self.cell_seqs &= ~dst_bit
        shared = ((self.cell_seqs & src_bit) != 0) & (self.cell_pos < length)
        self.cell_seqs[shared] |= dst_bit
        self._free_empty()

    def remove(self, seq: int, begin: int, end: int | None) -> None:
        bit = 1 << seq
        mine = (self.cell_seqs & bit) != 0
        dropped = mine & (self.cell_pos >= begin)
        later = mine & (self.cell_pos >= end) if end is not None else torch.zeros_like(mine)
        dropped &= ~later
        if bool(later.any()):
            if bool(((self.cell_seqs[later] & ~bit) != 0).any()):
                raise CacheFullError("cannot shift cells shared by several sequences")
            if self.shift_fn is None:
                raise NotImplementedError("this model cannot shift its cache")
        self.cell_seqs[dropped] &= ~bit
        self._free_empty()
        if end is not None and bool(later.any()):
            self._shift(later.nonzero().squeeze(1), begin - end)

    def _shift(self, cells: torch.Tensor, delta: int) -> None:
        self.cell_pos[cells] += delta
        offsets = torch.full((cells.numel(),), delta, dtype=torch.int64)
        with torch.inference_mode():  # the buffers were made in the forward's inference mode
            for layer, k in self.keys.items():
                if self.shift_fn is not None:
                    k[:, cells] = self.shift_fn(layer, k[:, cells], offsets)

    def _free_empty(self) -> None:
        self.cell_pos[self.cell_seqs == 0] = -1

    def can_resume(self, seq: int, pos: int) -> bool:
        if self.window is None:
            return True
        mine = self.cell_pos[(self.cell_seqs & (1 << seq)) != 0]
        if mine.numel() == 0:
            return pos == 0
        return max(0, pos - self.window) >= int(mine.min()) and pos <= int(mine.max()) + 1

    # --- used by models ---
    def set_layer(self, layer: int) -> None:
        self.layer = layer

    def put(self, key: torch.Tensor, value: torch.Tensor) -> None:
        if self.layer not in self.keys:
            _, h, d = key.shape
            self.keys[self.layer] = torch.zeros(h, self.num_cells, d, dtype=self.dtype)
            self.values[self.layer] = torch.zeros(
                h, self.num_cells, value.shape[2], dtype=self.dtype
            )
        self.keys[self.layer].index_copy_(1, self.locs, key.transpose(0, 1).to(self.dtype))
        self.values[self.layer].index_copy_(1, self.locs, value.transpose(0, 1).to(self.dtype))

    def get(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        k = self.keys[self.layer][:, self.lo : self.hi]
        v = self.values[self.layer][:, self.lo : self.hi]
        if self.dtype != torch.float32:  # a half-size cache still computes in float32
            k, v = k.float(), v.float()
        return k, v, self.mask

    def nbytes(self) -> int:
        """Bytes the keys and values allocated so far take."""
        tensors = [*self.keys.values(), *self.values.values()]
        return sum(t.numel() * t.element_size() for t in tensors)


def _or_all(bits: torch.Tensor) -> int:
    out = 0
    for b in bits.unique().tolist():
        out |= b
    return out
