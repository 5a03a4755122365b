"""Building blocks shared by the architectures: RoPE, attention over the cache, norms."""

import torch
import torch.nn.functional as F

from ember.backend.norm import rms_norm_rows
from ember.nn.attention import attention
from ember.nn.rope import RoPE, Rotation


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension; without a weight, the bare normalization (Llama 4's
    "L2" QK-norm). The native kernel where it takes x (backend/norm.py), else torch's."""
    out = rms_norm_rows(x, weight, eps)
    if out is not None:
        return out
    return F.rms_norm(x, x.shape[-1:] if weight is None else weight.shape, weight, eps)


__all__ = ["RoPE", "Rotation", "attention", "rms_norm"]
