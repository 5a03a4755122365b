"""Models: the Model seam, the architecture registry, strict weight binding."""

from ember.model.base import (
    EmbeddingHead,
    Model,
    PromptRanker,
    Ranker,
    forward,
)
from ember.model.config import Config, ModelLoadError
from ember.model.registry import load_model, register
from ember.pooling import POOLING_CLS, POOLING_LAST, POOLING_MEAN, POOLING_RANK

__all__ = [
    "POOLING_CLS",
    "POOLING_LAST",
    "POOLING_MEAN",
    "POOLING_RANK",
    "Config",
    "EmbeddingHead",
    "Model",
    "ModelLoadError",
    "PromptRanker",
    "Ranker",
    "forward",
    "load_model",
    "register",
]
