"""Logit softcapping (Gemma 2): `cap * tanh(x / cap)`, on the final logits and on the attention
scores, where SDPA cannot apply it, so attention is computed here in plain matmuls."""

import torch

from ember.kvcache import Cache
from ember.nn.attention import blocked_attention


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    return torch.tanh(x / cap) * cap


def softcap_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: Cache, *, scale: float, cap: float
) -> torch.Tensor:
    """`nn.attention` with the scores softcapped before the mask and the softmax:
    q (T, H, D), k and v (T, H_kv, D) -> (T, H * D_v), grouped-query heads."""
    cache.put(k, v)
    keys, values, mask = cache.get()  # (H_kv, S, D), (T, S) or None

    def probabilities(scores: torch.Tensor, rows_mask: torch.Tensor | None) -> torch.Tensor:
        scores = softcap(scores * scale, cap)
        return (scores if rows_mask is None else scores + rows_mask).softmax(dim=-1)

    return blocked_attention(q, keys, values, mask, probabilities)
