"""Attention with sinks (gpt-oss): each head has a learned logit that joins the softmax as one
more key with no value, so a head can attend to nothing; computed in plain matmuls (SDPA has no
such column)."""

import torch

from ember.kvcache import Cache


def sink_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: Cache, *, scale: float,
    sinks: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """`nn.attention` with a sink logit per query head, sinks (H,): q (T, H, D), k and v
    (T, H_kv, D) -> (T, H * D_v), grouped-query heads."""
    cache.put(k, v)
    keys, values, mask = cache.get()  # (H_kv, S, D), (T, S) or None
    num_kv_heads, num_tokens = keys.shape[0], q.shape[0]
    qh = q.transpose(0, 1).unflatten(0, (num_kv_heads, -1))  # (H_kv, G, T, D)
    scores = torch.matmul(qh, keys[:, None].transpose(-1, -2).to(q.dtype)) * scale
    if mask is not None:
        scores = scores + mask
    sink = sinks.view(num_kv_heads, -1, 1, 1).expand(-1, -1, num_tokens, 1)
    probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    out = torch.matmul(probs, values[:, None].to(q.dtype))  # (H_kv, G, T, D_v)
    return out.flatten(0, 1).transpose(0, 1).flatten(1)
