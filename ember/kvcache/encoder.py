"""Encoder cache for cross-attention (mllama's image layers): one set of encoder keys and values
per layer, stored by the first forward pass whose batch carries encoder input and read by every
later one, with no mask. One sequence only, as Ollama's EncoderCache."""

import torch

from ember.batch import Batch


class EncoderCache:
    def __init__(self) -> None:
        self.layer = 0
        self.keys: dict[int, torch.Tensor] = {}  # layer -> (H_kv, T_enc, D)
        self.values: dict[int, torch.Tensor] = {}
        self.encoder_pos: int | None = None  # position of the input the stored output came from
        self._storing = False

    def init(
        self,
        *,
        max_sequences: int,
        capacity: int,
        max_batch: int,
        dtype: torch.dtype | str | None = None,
    ) -> None:
        if max_sequences != 1:
            raise ValueError("an encoder cache serves one sequence")
        self.keys.clear()
        self.values.clear()
        self.encoder_pos = None

    def nbytes(self) -> int:
        tensors = [*self.keys.values(), *self.values.values()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def planned_bytes(self, *, max_sequences: int, capacity: int, max_batch: int) -> int:
        return self.nbytes()  # one encoder output, whatever the context

    def start_forward(self, batch: Batch, *, reserve: bool = False) -> None:
        if any(s != 0 for s in batch.sequences):
            raise ValueError("an encoder cache serves one sequence (id 0)")
        self._storing = reserve or bool(batch.multimodal)
        if batch.multimodal and not reserve:
            self.encoder_pos = batch.positions[batch.multimodal[-1]]

    @property
    def is_cached(self) -> bool:
        """Whether encoder keys and values are stored (a model skips its encoder if so)."""
        return bool(self.keys) and self.encoder_pos is not None

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        raise NotImplementedError("an encoder cache cannot share a prefix")

    def remove(self, seq: int, begin: int, end: int | None) -> None:
        """Drops the encoder output when the input it came from is removed."""
        pos = self.encoder_pos
        if pos is not None and pos >= begin and (end is None or pos < end):
            self.keys.clear()
            self.values.clear()
            self.encoder_pos = None

    def can_resume(self, seq: int, pos: int) -> bool:
        return True

    def set_layer(self, layer: int) -> None:
        self.layer = layer

    def put(self, key: torch.Tensor, value: torch.Tensor) -> None:
        """key, value (T_enc, H_kv, D): stored only in a pass whose batch carries encoder input."""
        if self._storing:
            self.keys[self.layer] = key.transpose(0, 1).contiguous()
            self.values[self.layer] = value.transpose(0, 1).contiguous()

    def get(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        if self.layer not in self.keys:
            raise LookupError("no encoder output is cached for this layer")
        return self.keys[self.layer], self.values[self.layer], None

    def view(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        return self.get()  # float32 already
