"""Embedding tables kept as their GGUF blocks: a lookup decodes only the rows it asks for."""

import numpy as np
import torch

from ember.backend.quant import QuantError, as_byte_tensor, dequantize_rows
from ember.backend.weights import AnyLinear, linear_from_gguf


class EmbeddingWeight:
    """A (vocab, dim) table kept as its GGUF bytes; `lookup` decodes only the rows asked for."""

    __slots__ = ("_table", "embedding_dim", "ggml_type", "num_embeddings")

    def __init__(self, table: torch.Tensor, ggml_type: int, shape: tuple[int, int]) -> None:
        self._table = table
        self.ggml_type = ggml_type
        self.num_embeddings, self.embedding_dim = shape
        # Validates type, shape and size once, so lookups can trust them.
        dequantize_rows(table, ggml_type, shape, torch.zeros(0, dtype=torch.long))

    @classmethod
    def from_gguf(
        cls, raw: torch.Tensor | np.ndarray, ggml_type: int, shape: tuple[int, ...]
    ) -> "EmbeddingWeight":
        """From a GGUF tensor's bytes (shared, not copied), `shape` (vocab, dim)."""
        if len(shape) != 2:
            raise QuantError(f"an embedding table is 2-D (vocab, dim), got shape {shape}")
        return cls(as_byte_tensor(raw), ggml_type, (shape[0], shape[1]))

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (T,) int64 -> (T, dim) float32; raises QuantError for an id outside the table."""
        shape = (self.num_embeddings, self.embedding_dim)
        return dequantize_rows(self._table, self.ggml_type, shape, ids)

    def as_linear(self) -> AnyLinear:
        """The table as an output head (tied embeddings), its blocks shared, not copied."""
        return linear_from_gguf(
            self._table, self.ggml_type, (self.num_embeddings, self.embedding_dim)
        )

    @property
    def nbytes(self) -> int:
        """Bytes of the quantized table (shared with the file's memory map)."""
        return self._table.nbytes


Embedding = EmbeddingWeight  # the short name the model layer binds with
