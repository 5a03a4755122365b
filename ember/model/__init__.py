"""Models: the Model seam, the architecture registry, strict weight binding."""

from ember.model.base import Model, forward
from ember.model.config import Config, ModelLoadError
from ember.model.registry import load_model, register

__all__ = ["Config", "Model", "ModelLoadError", "forward", "load_model", "register"]
