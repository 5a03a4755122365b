"""Encoder cache for cross-attention (mllama's image layers): per sequence, the keys and values
of each cross-attention layer over that sequence's image, and the position of the image's input.
As Ollama's EncoderCache, but one store per sequence (slot), so that sequences with different
images share batches. A store is written by the pass whose batch carries the image and read by
every later pass; it goes when its image's position is removed (context shift, slot reuse),
and moves down with the positions after a shift."""

from dataclasses import dataclass, field

import torch

from ember.batch import Batch


@dataclass
class EncoderEntry:
    position: int  # of the input that carried the image
    keys: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> (H_kv, T_enc, D)
    values: dict[int, torch.Tensor] = field(default_factory=dict)

    def nbytes(self) -> int:
        tensors = [*self.keys.values(), *self.values.values()]
        return sum(t.numel() * t.element_size() for t in tensors)


class EncoderCache:
    def __init__(self, *, bytes_per_image: int = 0) -> None:
        """bytes_per_image: what one sequence's image takes at most (for the load-time plan)."""
        self.bytes_per_image = bytes_per_image
        self.layer = 0
        self.entries: dict[int, EncoderEntry] = {}  # sequence (slot) -> its image's store
        self.max_sequences = 1
        self._new: dict[int, int] = {}  # sequences whose image is in this batch -> its row

    def init(
        self,
        *,
        max_sequences: int,
        capacity: int,
        max_batch: int,
        dtype: torch.dtype | str | None = None,
    ) -> None:
        self.entries.clear()
        self._new.clear()
        self.max_sequences = max_sequences

    def nbytes(self) -> int:
        return sum(e.nbytes() for e in self.entries.values())

    def planned_bytes(self, *, max_sequences: int, capacity: int, max_batch: int) -> int:
        """One image per sequence, each of the model's largest or the largest stored so far."""
        largest = max((e.nbytes() for e in self.entries.values()), default=0)
        return max_sequences * max(self.bytes_per_image, largest)

    def start_forward(self, batch: Batch, *, reserve: bool = False) -> None:
        """Notes the batch's images: a sequence's new image replaces its old one."""
        self._new = {batch.sequences[i]: i for i in batch.multimodal}
        for seq, row in self._new.items():
            self.entries[seq] = EncoderEntry(batch.positions[row])

    def image_row(self, seq: int) -> int | None:
        """The batch row of seq's image when this batch carries it (its states to store)."""
        return self._new.get(seq)

    def image_position(self, seq: int) -> int | None:
        """Where seq's image is; rows of seq from there on see it. None: no image."""
        entry = self.entries.get(seq)
        return None if entry is None else entry.position

    def store(self, seq: int, key: torch.Tensor, value: torch.Tensor) -> None:
        """key, value (T_enc, H_kv, D) of seq's image at the current layer."""
        entry = self.entries[seq]
        entry.keys[self.layer] = key.transpose(0, 1).contiguous()
        entry.values[self.layer] = value.transpose(0, 1).contiguous()

    def lookup(self, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (H_kv, T_enc, D) of seq's image at the current layer."""
        entry = self.entries.get(seq)
        if entry is None or self.layer not in entry.keys:
            raise LookupError(f"no encoder output is cached for sequence {seq}, layer {self.layer}")
        return entry.keys[self.layer], entry.values[self.layer]

    @property
    def is_cached(self) -> bool:
        """Whether any sequence has encoder keys and values stored."""
        return any(e.keys for e in self.entries.values())

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """dst shares src's image when it lies in the shared prefix (the tensors are shared)."""
        entry = self.entries.get(src)
        if entry is not None and entry.position < length:
            self.entries[dst] = EncoderEntry(entry.position, dict(entry.keys), dict(entry.values))
        elif dst in self.entries and self.entries[dst].position < length:
            del self.entries[dst]

    def remove(self, seq: int, begin: int, end: int | None) -> None:
        """Drops seq's image when its position is removed; a later one moves down."""
        entry = self.entries.get(seq)
        if entry is None or entry.position < begin:
            return
        if end is None or entry.position < end:
            del self.entries[seq]
        else:
            entry.position -= end - begin

    def can_resume(self, seq: int, pos: int) -> bool:
        return True

    def set_layer(self, layer: int) -> None:
        self.layer = layer

    def put(self, key: torch.Tensor, value: torch.Tensor) -> None:
        """The Cache seam's put: stores the image of a batch that carries one; a batch with
        none stores nothing (its stored images stay)."""
        if len(self._new) > 1:
            raise ValueError("put cannot tell the images of several sequences apart: use store")
        if self._new:
            self.store(next(iter(self._new)), key, value)

    def get(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The Cache seam's get, for one stored image: its keys and values, no mask."""
        if len(self.entries) != 1:
            raise LookupError("get reads the cache of exactly one sequence")
        return (*self.lookup(next(iter(self.entries))), None)

    def view(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        return self.get()  # float32 already
