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
    num_tokens, num_heads, head_dim = q.shape
    group = num_heads // keys.shape[0]
    # Fold each group of query heads into the rows of its KV head: (H_kv, G * T, D), so the
    # cached keys and values are used in place instead of being repeated per query head.
    q = q.view(num_tokens, -1, group, head_dim).permute(1, 2, 0, 3).flatten(1, 2)
    if mask is not None and group > 1:
        mask = mask.repeat(group, 1)  # rows ordered (g, t) like q's
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
    out = out.unflatten(1, (group, num_tokens))  # (H_kv, G, T, D_v)
    return out.permute(2, 0, 1, 3).flatten(1)  # (T, H * D_v)
