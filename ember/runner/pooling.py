"""How an embedding's token states become one vector, as the model's `pooling_type` says (the
mean by default, the [CLS] token's, or the last token's), projected where the model has an
embedding head, and a ranker's score of it."""

import torch

from ember.model import (
    POOLING_CLS,
    POOLING_LAST,
    POOLING_MEAN,
    POOLING_RANK,
    EmbeddingHead,
    Model,
    Ranker,
)


class Pooler:
    def __init__(self, model: Model) -> None:
        pooling = getattr(model, "pooling_type", POOLING_MEAN)
        self.pooling = POOLING_CLS if pooling == POOLING_RANK else pooling  # rank: its [CLS]
        self.ranker = model if isinstance(model, Ranker) else None  # scores what it pools
        self.head = model if isinstance(model, EmbeddingHead) else None

    def add(self, pooled: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor:
        """What is kept after the next rows of a sequence (its states, in order): the sum for
        the mean, else the one row that pooling takes."""
        if self.pooling == POOLING_CLS:
            return rows[0] if pooled is None else pooled
        if self.pooling == POOLING_LAST:
            return rows[-1]
        return rows.sum(dim=0) if pooled is None else pooled + rows.sum(dim=0)

    def result(self, pooled: torch.Tensor, count: int) -> torch.Tensor:
        """The embedding of a sequence of count tokens from what add kept."""
        if self.pooling not in (POOLING_CLS, POOLING_LAST):
            pooled = pooled / count
        if self.head is None:
            return pooled
        with torch.inference_mode():
            return self.head.project(pooled[None])[0]

    def score(self, pooled: torch.Tensor) -> float | None:
        """A ranker's relevance score of the pooled vector; None for an embedding model."""
        if self.ranker is None:
            return None
        with torch.inference_mode():
            return float(self.ranker.score(pooled[None])[0])
