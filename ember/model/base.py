"""The Model seam: forward(batch, cache) -> logits of the batch's output rows."""

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from ember.backend import heap
from ember.batch import Batch
from ember.kvcache import Cache


@runtime_checkable
class Model(Protocol):
    vocab_size: int
    context_length: int

    def make_cache(self) -> Cache:
        """A fresh, unsized cache of the kind this architecture needs (runner calls init)."""

    def forward(self, batch: Batch, cache: Cache) -> torch.Tensor:
        """Logits (len(batch.outputs), vocab) float32; the cache has been started for batch.
        The same as logits(hidden(batch, cache))."""

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        """Final (normalized) hidden states (len(batch.outputs), C) of the output rows."""

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output head over hidden states (n, C) -> (n, vocab)."""


def forward(model: Model, cache: Cache, batch: Batch) -> torch.Tensor:
    """Runs one forward pass: places the batch in the cache, then computes the model."""
    cache.start_forward(batch)
    with torch.inference_mode():
        if len(batch) < heap.LARGE_BATCH or not getattr(model, "is_causal", True):
            return model.forward(batch, cache)  # (an encoder's forward is its hidden states)
        hidden = model.hidden(batch, cache)
        heap.give_back_freed(len(batch))  # before the head reads its weights: see heap.py
        return model.logits(hidden)


@runtime_checkable
class EmbeddingHead(Protocol):
    """An embedding model whose pooled state is projected before it is returned (EmbeddingGemma's
    sentence-transformers Dense layers)."""

    def project(self, pooled: torch.Tensor) -> torch.Tensor:
        """Embeddings (n, E) of pooled hidden states (n, C), one per input."""


@runtime_checkable
class Ranker(Protocol):
    """A cross-encoder (a reranker): its pooled input is scored, not returned as a vector."""

    def score(self, pooled: torch.Tensor) -> torch.Tensor:
        """Relevance scores (n,) of pooled hidden states (n, C), one per input."""


@runtime_checkable
class PromptRanker(Ranker, Protocol):
    """A reranker that reads one prompt per pair (Qwen3-Reranker), not a token pair (BERT)."""

    def rerank_prompt(self, query: str, document: str) -> str:
        """The text whose last token's score ranks document against query."""


@runtime_checkable
class PositionShifter(Protocol):
    """A model whose RoPE positions run apart from cache positions after an image (M-RoPE:
    Qwen 2.5 VL advances positions over an image by its grid's longer side, not its rows)."""

    def position_shift(self, piece: object) -> tuple[int, int]:
        """(rows, shift) of an image piece: the inputs after its `rows` take RoPE positions
        `shift` past their cache positions (negative: behind)."""


@dataclass(frozen=True)
class ImageSpan:
    """An image's place in the prompt: its tokens (placeholders where embeddings go) and what
    the model reads at offsets of the span: usually one (rows, C) tensor whose rows replace the
    placeholders from there on; several where marker tokens sit between rows of patches."""

    tokens: list[int]
    pieces: dict[int, object]
