"""Models: the Model seam, the architecture registry, strict weight binding."""

from ember.model.base import POOLING_CLS, POOLING_MEAN, Model, forward
from ember.model.config import Config, ModelLoadError
from ember.model.registry import load_model, register

__all__ = [
    "POOLING_CLS",
    "POOLING_MEAN",
    "Config",
    "Model",
    "ModelLoadError",
    "forward",
    "load_model",
    "register",
]
