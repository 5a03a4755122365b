"""Conversion of HF model directories (config.json, *.safetensors, tokenizer files) to GGUF."""

from ember.convert.source import ConvertError
from ember.convert.writer import CONVERTERS, convert_directory, needs_projector_file

__all__ = ["CONVERTERS", "ConvertError", "convert_directory", "needs_projector_file"]
