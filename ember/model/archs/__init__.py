"""One module per architecture; importing this package registers them all."""

from ember.model.archs import gemma3, llama, qwen2

__all__ = ["gemma3", "llama", "qwen2"]
