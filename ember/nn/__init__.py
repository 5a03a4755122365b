"""Building blocks shared by the architectures: RoPE, attention over the cache, norms."""

import torch
import torch.nn.functional as F

from ember.nn.attention import attention
from ember.nn.rope import RoPE, Rotation


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return F.rms_norm(x, weight.shape, weight, eps)


__all__ = ["RoPE", "Rotation", "attention", "rms_norm"]
