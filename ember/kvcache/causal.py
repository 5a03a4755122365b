"""Causal KV cache over a shared pool of cells, optionally with a sliding window or chunked
attention (a query sees only the keys of its own chunk: p - p % chunk <= q <= p, as llama4's).

Every sequence draws cells from one pool; a cell may belong to several sequences (shared
prefixes), tracked as a bit mask of sequence ids. Masks follow the transformers convention
for sliding windows: a query at position p sees keys at positions p - window < q <= p.
"""

import numpy as np
import torch

from ember.batch import Batch
from ember.envconfig import MAX_PARALLEL
from ember.kvcache.base import CacheFullError, ShiftFn
from ember.kvcache.store import FLOAT_TYPES, LayerStore, kv_type_name

MAX_SEQUENCES = MAX_PARALLEL  # sequence membership is a bit mask in one int64


class CausalCache:
    """Cells for max_sequences × capacity tokens (fewer with a sliding window: each sequence
    keeps only what its next query can see, as Ollama's SWA cache). The cell bookkeeping is
    in numpy (host side, once per forward); keys and values live in one LayerStore a layer."""

    def __init__(
        self,
        *,
        window: int | None = None,
        chunk: int | None = None,
        shift: ShiftFn | None = None,
        dtype: torch.dtype | str = torch.float32,
    ) -> None:
        if window is not None and chunk is not None:
            raise ValueError("a cache has a sliding window or chunks, not both")
        self.window, self.chunk = window, chunk
        self.shift_fn = shift
        self.kind = kv_type_name(dtype)
        self.layer = 0
        self.stores: dict[int, LayerStore] = {}
        self.num_cells = 0
        self.capacity = 0  # tokens a sequence may hold (num_ctx)
        self.trims = False  # whether cells out of every query's window are freed
        self.cell_pos = np.full(0, -1, dtype=np.int64)
        self.cell_seqs = np.zeros(0, dtype=np.int64)  # bit mask of the sequences of a cell
        self.plain = False  # whether the mask is plain causal (PlainCausal)
        self.band: tuple[torch.Tensor, int] | None = None  # its sliding band (PlainCausal)

    @property
    def dtype(self) -> torch.dtype | str:
        return FLOAT_TYPES.get(self.kind, self.kind)

    # --- cache management ---
    def cells_for(self, *, max_sequences: int, capacity: int, max_batch: int) -> int:
        """Cells of a cache of that size: with a sliding window narrower than capacity, each
        sequence holds at most window - 1 earlier keys besides the batch's tokens."""
        if self.window is not None and self.window < capacity:
            return min(max_sequences * capacity, max_sequences * self.window + max_batch)
        return max_sequences * capacity

    def init(
        self,
        *,
        max_sequences: int,
        capacity: int,
        max_batch: int,
        dtype: torch.dtype | str | None = None,
    ) -> None:
        if not 1 <= max_sequences <= MAX_SEQUENCES:
            raise ValueError(f"max_sequences must be within 1..{MAX_SEQUENCES}")
        if dtype is not None:
            self.kind = kv_type_name(dtype)
        self.num_cells = self.cells_for(
            max_sequences=max_sequences, capacity=capacity, max_batch=max_batch
        )
        self.capacity = capacity
        self.trims = self.num_cells < max_sequences * capacity
        self.cell_pos = np.full(self.num_cells, -1, dtype=np.int64)
        self.cell_seqs = np.zeros(self.num_cells, dtype=np.int64)
        self.stores.clear()

    def planned_bytes(self, *, max_sequences: int, capacity: int, max_batch: int) -> int:
        """Bytes of keys and values at that size, from the layers stored so far."""
        if not self.num_cells:
            return 0
        cells = self.cells_for(max_sequences=max_sequences, capacity=capacity, max_batch=max_batch)
        return self.nbytes() * cells // self.num_cells

    def start_forward(self, batch: Batch, *, reserve: bool = False) -> None:
        n = len(batch)
        if reserve:  # a dry run: the batch writes free cells and sees every cell up to its end
            self.locs = torch.arange(n)
            self.span: tuple[int, int] | None = (0, n)
            self.lo, self.hi = 0, min(self.num_cells, max(batch.positions) + 1)
            self.mask: torch.Tensor | None = None
            self.plain, self.band = False, None
            return
        positions = np.asarray(batch.positions, dtype=np.int64)
        seq_bits = np.left_shift(1, np.asarray(batch.sequences, dtype=np.int64))
        if self.trims:
            self._trim(batch)
        free = np.flatnonzero(self.cell_seqs == 0)
        if free.size < n:
            raise CacheFullError(f"the KV cache has {free.size} free cells, the batch needs {n}")
        locs = free[:n]
        first = int(locs[0])
        self.span = (first, first + n) if int(locs[-1]) - first == n - 1 else None
        self.locs = torch.from_numpy(locs)
        self.cell_pos[locs] = positions
        self.cell_seqs[locs] = seq_bits
        self.mask = self._build_mask(positions, seq_bits)

    def _trim(self, batch: Batch) -> None:
        """Frees each sequence's cells that no query can see any more: below the window of the
        batch's first token of that sequence, or of the token after its last one."""
        assert self.window is not None
        lowest: dict[int, int] = {}
        for s, p in zip(batch.sequences, batch.positions, strict=True):
            lowest[s] = min(p, lowest.get(s, p))
        present = int(np.bitwise_or.reduce(self.cell_seqs)) if self.num_cells else 0
        seq = 0
        while present:
            if present & 1:
                bit = 1 << seq
                mine = (self.cell_seqs & bit) != 0
                nxt = lowest.get(seq)
                if nxt is None:
                    nxt = int(self.cell_pos[mine].max()) + 1
                old = mine & (self.cell_pos <= nxt - self.window)
                if old.any():
                    self.cell_seqs[old] &= ~bit
            present >>= 1
            seq += 1
        self._free_empty()

    def _build_mask(self, positions: np.ndarray, seq_bits: np.ndarray) -> torch.Tensor | None:
        batch_bits = int(np.bitwise_or.reduce(seq_bits))
        used = np.flatnonzero(self.cell_seqs & batch_bits)
        self.lo, self.hi = int(used[0]), int(used[-1]) + 1
        cell_pos = self.cell_pos[self.lo : self.hi]  # (S,)
        in_seq = (self.cell_seqs[self.lo : self.hi][None, :] & seq_bits[:, None]) != 0  # (T, S)
        visible = in_seq & (cell_pos[None, :] <= positions[:, None])
        if self.window is not None:
            visible &= cell_pos[None, :] > positions[:, None] - self.window
        if self.chunk is not None:
            visible &= cell_pos[None, :] >= positions[:, None] - positions[:, None] % self.chunk
        num_tokens, num_cells = visible.shape
        one_sequence = (batch_bits & (batch_bits - 1)) == 0
        self.plain = (  # only several tokens of one sequence can be (one token uses no mask)
            num_tokens > 1
            and one_sequence
            and bool(
                np.array_equal(visible, np.tri(num_tokens, num_cells, num_cells - num_tokens, bool))
            )
        )
        self.band = None
        if self.window is not None and self.chunk is None and num_tokens > 1 and one_sequence:
            self.band = self._band(in_seq[0], cell_pos, positions)
        if visible.all():
            return None  # plain attention over everything: no mask to add
        return torch.from_numpy(np.where(visible, np.float32(0), np.float32(-np.inf)))

    def see_both_ways(self, begin: int, end: int) -> None:
        """Lets the batch's rows begin..end (an image's tokens, all of one sequence, in order)
        also see the later rows' cells: the mask is then neither plain causal nor a window's
        band. Earlier rows stay as the causal mask has them (with a window: within it, as
        transformers' sliding masks have an image's tokens)."""
        if self.mask is None:  # every row sees every cell already
            return
        rows, later = torch.triu_indices(end - begin, end - begin, 1)
        self.mask[begin + rows, torch.as_tensor(self.locs[begin:end])[later] - self.lo] = 0.0
        self.plain, self.band = False, None

    def _band(
        self, mine: np.ndarray, cell_pos: np.ndarray, positions: np.ndarray
    ) -> tuple[torch.Tensor, int] | None:
        """sliding_band's (cells, window) for one sequence's batch: its cells among lo..hi
        (mine) sorted by position must hold each position from the first once, the batch's
        positions the last of them; then its window mask is a band in that order."""
        assert self.window is not None
        cells = np.flatnonzero(mine)
        order = np.argsort(cell_pos[cells], kind="stable")
        cells, pos = cells[order], cell_pos[cells[order]]
        held, tokens = pos.size, positions.size
        if held < tokens or pos[-1] - pos[0] != held - 1:
            return None
        if not np.array_equal(pos[held - tokens :], positions):
            return None
        return torch.from_numpy(cells), self.window

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
        later = mine & (self.cell_pos >= end) if end is not None else np.zeros_like(mine)
        dropped &= ~later
        if later.any():
            if ((self.cell_seqs[later] & ~bit) != 0).any():
                raise CacheFullError("cannot shift cells shared by several sequences")
            if self.shift_fn is None:
                raise NotImplementedError("this model cannot shift its cache")
        self.cell_seqs[dropped] &= ~bit
        self._free_empty()
        if end is not None and later.any():
            self._shift(np.flatnonzero(later), begin - end)

    def _shift(self, cells: np.ndarray, delta: int) -> None:
        self.cell_pos[cells] += delta
        index = torch.from_numpy(cells)
        offsets = torch.full((cells.size,), delta, dtype=torch.int64)
        with torch.inference_mode():  # the buffers were made in the forward's inference mode
            for layer, store in self.stores.items():
                if self.shift_fn is not None:
                    store.set_keys(index, self.shift_fn(layer, store.keys_f32(index), offsets))

    def cell_usage(self) -> tuple[int, int]:
        return int(np.count_nonzero(self.cell_seqs)), self.num_cells

    def _free_empty(self) -> None:
        self.cell_pos[self.cell_seqs == 0] = -1

    def can_resume(self, seq: int, pos: int) -> bool:
        """Whether a query at pos finds every key it sees (with a window: pos - window + 1 up)."""
        if self.window is None:
            return True
        mine = self.cell_pos[(self.cell_seqs & (1 << seq)) != 0]
        if mine.size == 0:
            return pos == 0
        return max(0, pos - self.window + 1) >= int(mine.min()) and pos <= int(mine.max()) + 1

    # --- used by models ---
    def set_layer(self, layer: int) -> None:
        self.layer = layer

    def put(self, key: torch.Tensor, value: torch.Tensor) -> None:
        store = self.stores.get(self.layer)
        if store is None:
            _, h, d = key.shape
            store = LayerStore(self.kind, h, self.num_cells, d, value.shape[2])
            self.stores[self.layer] = store
        store.put(self.locs, self.span, key, value)

    def get(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        k, v = self.stores[self.layer].get(self.lo, self.hi)
        return k, v, self.mask

    def view(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        kv = self.stores[self.layer].view(self.lo, self.hi)
        return None if kv is None else (kv[0], kv[1], self.mask)

    def plain_causal(self) -> bool:
        return self.plain

    def sliding_band(self) -> tuple[torch.Tensor, int] | None:
        return self.band

    def stored_floats(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The current layer's keys (H, cells, Dk) and values as stored, for a native layer that
        writes and reads them in place: None before the layer's first put, or when quantized."""
        store = self.stores.get(self.layer)
        if store is None or store.kind not in FLOAT_TYPES:
            return None
        return store.k, store.v

    @property
    def keys(self) -> dict[int, torch.Tensor]:
        """Every layer's stored keys (H_kv, cells, D) as float32 (a copy unless f32)."""
        return {i: s.keys_f32(torch.arange(s.cells)) for i, s in self.stores.items()}

    def nbytes(self) -> int:
        """Bytes the keys and values allocated so far take."""
        return sum(s.nbytes() for s in self.stores.values())
