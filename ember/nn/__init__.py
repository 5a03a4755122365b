"""Building blocks shared by the architectures: RoPE, attention over the cache, norms."""

import torch
import torch.nn.functional as F

from ember.nn.attention import attention
from ember.nn.rope import RoPE, Rotation


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension; without a weight, the bare normalization (Llama 4's
    "L2" QK-norm)."""
    return F.rms_norm(x, x.shape[-1:] if weight is None else weight.shape, weight, eps)


__all__ = ["RoPE", "Rotation", "attention", "rms_norm"]
