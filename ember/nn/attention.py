"""Attention over the KV cache: stores the batch's keys and values, attends to what it shows."""

import torch
import torch.nn.functional as F

from ember.kvcache import Cache


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: Cache, *, scale: float
) -> torch.Tensor:
    """q (T, H, D), k and v (T, H_kv, D) -> (T, H * D_v), with grouped-query heads."""
    cache.put(k, v)
    keys, values, mask = cache.get()  # (H_kv, S, D), (T, S) or None
    num_heads, num_kv_heads = q.shape[1], keys.shape[0]
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        keys,
        values,
        attn_mask=mask,
        scale=scale,
        enable_gqa=num_heads != num_kv_heads,
    )  # (H, T, D_v)
    return out.transpose(0, 1).flatten(1)
