"""Attention with sinks (gpt-oss): each head has a learned logit that joins the softmax as one
more key with no value, so a head can attend to nothing; computed in plain matmuls (SDPA has no
such column)."""

import torch

from ember.kvcache import Cache
from ember.nn.attention import blocked_attention


def sink_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: Cache, *, scale: float,
    sinks: torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    """`nn.attention` with a sink logit per query head, sinks (H,): q (T, H, D), k and v
    (T, H_kv, D) -> (T, H * D_v), grouped-query heads."""
    cache.put(k, v)
    keys, values, mask = cache.get()  # (H_kv, S, D), (T, S) or None
    sink = sinks.view(keys.shape[0], -1, 1, 1)  # (H_kv, G, 1, 1)

    def probabilities(scores: torch.Tensor, rows_mask: torch.Tensor | None) -> torch.Tensor:
        scores = scores * scale
        if rows_mask is not None:
            scores = scores + rows_mask
        column = sink.expand(-1, -1, scores.shape[2], 1)
        return torch.softmax(torch.cat([scores, column], dim=-1), dim=-1)[..., :-1]

    return blocked_attention(q, keys, values, mask, probabilities)
