"""Embedding tables kept as their GGUF blocks: a lookup decodes only the rows it asks for."""

import numpy as np
import torch

from ember.backend import native
from ember.backend.quant import QuantError, as_byte_tensor, dequantize_rows, row_nbytes
from ember.backend.weights import AnyLinear, linear_from_gguf

# Lookups of at most this many rows decode each row natively (a decode step's tokens): torch's
# decoding is ~10 small ops whatever the count, 0.25 ms of SmolLM2's ~11 ms step on the Zen 2.
NATIVE_LOOKUP_ROWS = 64


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
        kernels = native.usable_kernels() if ids.numel() <= NATIVE_LOOKUP_ROWS else None
        if kernels is None or not kernels.supports(self.ggml_type):
            return dequantize_rows(self._table, self.ggml_type, shape, ids)
        rows = ids.reshape(-1).tolist()
        if any(not 0 <= r < self.num_embeddings for r in rows):
            raise QuantError(f"row index out of range: the table has {self.num_embeddings} rows")
        # the native decoding is bit-equal to gguf-py's, as dequantize_rows' is
        out = torch.empty(len(rows), self.embedding_dim)
        row_bytes = row_nbytes(self.ggml_type, self.embedding_dim)
        src, dst = self._table.data_ptr(), out.data_ptr()
        step, dim = out.stride(0) * out.element_size(), out.shape[1]
        for i, r in enumerate(rows):
            rc = kernels.dequant(self.ggml_type, src + r * row_bytes, dst + i * step, 1, dim)
            if rc:
                raise QuantError(f"the native decoding of an embedding row failed ({rc})")
        return out

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
