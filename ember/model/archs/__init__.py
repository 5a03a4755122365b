"""One module per architecture; importing this package registers them all."""

from ember.model.archs import (
    bert,
    gemma2,
    gemma3,
    gemma3_vision,
    gptoss,
    granite,
    llama,
    llava_vision,
    mistral3,
    olmo2,
    phi3,
    qwen2,
    qwen3,
    qwen3moe,
)

__all__ = [
    "bert",
    "gemma2",
    "gemma3",
    "gemma3_vision",
    "gptoss",
    "granite",
    "llama",
    "llava_vision",
    "mistral3",
    "olmo2",
    "phi3",
    "qwen2",
    "qwen3",
    "qwen3moe",
]
