"""Qwen2: the llama layout with q/k/v biases (bound by Block when present) and NeoX RoPE."""

from ember.model.archs.llama import Llama
from ember.model.registry import register


@register("qwen2")
class Qwen2(Llama):
    is_neox_rope = True
