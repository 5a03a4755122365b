"""Logit softcapping (Gemma 2): `cap * tanh(x / cap)`, on the final logits and on the attention
scores, where SDPA cannot apply it, so attention is computed here in plain matmuls."""

import torch

from ember.kvcache import Cache


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    return torch.tanh(x / cap) * cap


def softcap_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: Cache, *, scale: float, cap: float
) -> torch.Tensor:
    """`nn.attention` with the scores softcapped before the mask and the softmax:
    q (T, H, D), k and v (T, H_kv, D) -> (T, H * D_v), grouped-query heads."""
    cache.put(k, v)
    keys, values, mask = cache.get()  # (H_kv, S, D), (T, S) or None
    num_kv_heads = keys.shape[0]
    qh = q.transpose(0, 1).unflatten(0, (num_kv_heads, -1))  # (H_kv, G, T, D)
    scores = softcap(torch.matmul(qh, keys[:, None].transpose(-1, -2).to(q.dtype)) * scale, cap)
    if mask is not None:
        scores = scores + mask
    out = torch.matmul(scores.softmax(dim=-1), values[:, None].to(q.dtype))  # (H_kv, G, T, D_v)
    return out.flatten(0, 1).transpose(0, 1).flatten(1)
