"""Bounded, validating GGUF reader for untrusted files, and the ggml tensor type table."""

from ember.gguf.reader import GGUFError, GGUFFile, TensorInfo
from ember.gguf.types import BLOCK_SIZES, GGMLType

__all__ = ["BLOCK_SIZES", "GGMLType", "GGUFError", "GGUFFile", "TensorInfo"]
