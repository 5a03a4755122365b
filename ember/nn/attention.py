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
    num_kv_heads = keys.shape[0]
    # 4-D inputs: torch's CPU flash kernel takes them; 3-D ones fall to the slow math path.
    if num_tokens == 1:
        # One token: fold each group of query heads into the rows of its KV head, so the
        # cached keys and values are used in place, never repeated per query head.
        q4 = q.view(1, num_kv_heads, num_heads // num_kv_heads, head_dim)
        out = F.scaled_dot_product_attention(
            q4, keys[None], values[None], attn_mask=mask, scale=scale
        )  # (1, H_kv, G, D_v)
        return out.reshape(1, -1)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        keys[None],
        values[None],
        attn_mask=mask,
        scale=scale,
        enable_gqa=num_heads != num_kv_heads,
    )  # (1, H, T, D_v)
    return out[0].transpose(0, 1).flatten(1)
