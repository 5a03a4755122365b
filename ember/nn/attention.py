"""Attention over the KV cache: stores the batch's keys and values, attends to what it shows (the
cells the cache's range covers: the used length, never the whole allocation), in float32. One
token (decode) takes the native kernel over the cache as stored (ember/backend/attend.py) where
it can; one sequence's prompt under a plain causal mask takes ember/nn/prompt_attention.py (on
x86, up to 512 cells or, on AVX-512, half the L2 cache of a KV head's keys and values, a native
kernel too); the rest is torch."""

from collections.abc import Callable

import torch
import torch.nn.functional as F

from ember.backend.attend import attend_one
from ember.kvcache import Cache, PlainCausal
from ember.nn import prompt_attention

# The most the scores of a path that computes them in torch take at once: its queries go in
# blocks that small (SDPA's kernel is blocked itself), so a batch's memory stays linear in its
# cells (the load-time reservation counts on it: ember/model/activations.py).
SCORES_BYTES = 16 << 20
# Queries a block takes at once where the mask is plain causal (PlainCausal).
CAUSAL_BLOCK = 64


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: Cache, *, scale: float
) -> torch.Tensor:
    """q (T, H, D), k and v (T, H_kv, D) -> (T, H * D_v), with grouped-query heads. scale
    multiplies the scores (1.0 when the queries come scaled already, see nn.rope.Rotation)."""
    cache.put(k, v)
    return attend(q, cache, scale=scale)


def attend(q: torch.Tensor, cache: Cache, *, scale: float) -> torch.Tensor:
    """q (T, H, D) over the keys and values the cache's layer holds, the batch's among them ->
    (T, H * D_v): `attention` after its put, and alone for a layer that reads another's keys
    (Gemma 4's shared layers)."""
    num_tokens, num_heads, head_dim = q.shape
    if num_tokens == 1:  # decode: the native kernel reads the cache as stored, in one call
        stored = cache.view()
        if stored is not None:
            out = attend_one(q[0], *stored, scale)
            if out is not None:
                return out
    keys, values, mask = cache.get()  # (H_kv, S, D), (T, S) or None
    num_kv_heads = keys.shape[0]
    if num_tokens == 1:
        # One token: each group of query heads becomes the rows of its KV head's matmul, so
        # the cached keys and values are read in place, never repeated per query head; three
        # ops (scores, softmax, weighted sum), the mask and scale inside the first.
        qg = q.reshape(num_kv_heads, num_heads // num_kv_heads, head_dim)
        kt = keys.transpose(1, 2)
        if mask is not None:
            scores = torch.baddbmm(mask, qg, kt, alpha=scale)
        elif scale != 1.0:
            scores = torch.baddbmm(qg.new_zeros(()), qg, kt, beta=0.0, alpha=scale)
        else:
            scores = torch.bmm(qg, kt)
        out = torch.bmm(torch.softmax(scores, dim=-1), values)  # (H_kv, G, D_v)
        return out.reshape(1, -1)
    # Several tokens: torch's flash kernel (it takes 4-D inputs; 3-D ones fall to the slow
    # math path).
    q4, keys4, values4 = q.transpose(0, 1)[None], keys[None], values[None]
    gqa = num_heads != num_kv_heads
    if mask is None or not (isinstance(cache, PlainCausal) and cache.plain_causal()):
        band = cache.sliding_band() if mask is not None and isinstance(cache, PlainCausal) else None
        if band is not None:  # one sequence's prompt past a sliding window: the native kernel
            cells, window = band  # takes its cells in order of position, and skips the hidden
            banded = prompt_attention.native_attention(
                q, keys[:, cells], values[:, cells], scale, window
            )
            if banded is not None:
                return banded
        out = F.scaled_dot_product_attention(
            q4, keys4, values4, attn_mask=mask, scale=scale, enable_gqa=gqa
        )  # (1, H, T, D_v)
    elif prompt_attention.native_runs(keys.shape[1], keys.shape[2] + values.shape[2]) or (
        prompt_attention.available()
        and prompt_attention.scores_bytes(num_heads, num_kv_heads, keys.shape[1]) <= SCORES_BYTES
    ):
        return prompt_attention.causal_attention(q, keys, values, scale)
    else:
        # One sequence's prompt: each block of queries takes only the cells up to its last
        # token (the kernel's own causal mode skips nothing within its 512-key blocks): 20-27%
        # less attention time for a first batch of 512 tokens.
        earlier = keys.shape[1] - num_tokens  # cells before the batch's own
        out = torch.cat(
            [
                F.scaled_dot_product_attention(
                    q4[:, :, start : start + CAUSAL_BLOCK],
                    keys4[:, :, : earlier + start + CAUSAL_BLOCK],
                    values4[:, :, : earlier + start + CAUSAL_BLOCK],
                    attn_mask=mask[start : start + CAUSAL_BLOCK, : earlier + start + CAUSAL_BLOCK],
                    scale=scale,
                    enable_gqa=gqa,
                )
                for start in range(0, num_tokens, CAUSAL_BLOCK)
            ],
            dim=2,
        )
    return out[0].transpose(0, 1).flatten(1)


def all_pairs(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None
) -> torch.Tensor:
    """An encoder's attention, every query over every key (no mask): q, k, v (..., N, D) with
    the same leading dimensions -> (..., N, D); scale 1/sqrt(D) unless given. Queries go in
    blocks whose scores take at most SCORES_BYTES: torch's SDPA on the CPU makes all N × N
    scores at once (16 heads of 8,100 patches, a Qwen3-VL layer at Ollama's pixel bound: 9.4 GB
    and 10-17 s, against 134 MB and 2.4 s in blocks, on the Zen 5 EPYC's 2 threads)."""
    heads, n = q.shape[:-2].numel(), k.shape[-2]
    if 4 * heads * q.shape[-2] * n <= SCORES_BYTES:
        return F.scaled_dot_product_attention(q, k, v, scale=scale)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    rows, kt = max(1, SCORES_BYTES // (4 * heads * n)), k.transpose(-1, -2)
    blocks = [
        torch.matmul(torch.softmax(torch.matmul(q[..., i : i + rows, :], kt).mul_(scale), -1), v)
        for i in range(0, q.shape[-2], rows)
    ]
    return torch.cat(blocks, dim=-2)


def blocked_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    probabilities: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor],
) -> torch.Tensor:
    """Attention whose scores are made in torch: q (T, H, D), keys and values (H_kv, S, D) as
    the cache gives them -> (T, H * D_v). probabilities(scores, mask) turns one block's raw
    scores q·k (H_kv, G, t, S) and its mask rows (t, S) into the weights of the values."""
    num_tokens, num_heads = q.shape[:2]
    num_kv_heads, num_cells = keys.shape[:2]
    qh = q.transpose(0, 1).unflatten(0, (num_kv_heads, -1))  # (H_kv, G, T, D)
    kt = keys[:, None].transpose(-1, -2).to(q.dtype)
    vals = values[:, None].to(q.dtype)
    rows = max(1, SCORES_BYTES // (4 * num_heads * num_cells))
    blocks = [
        torch.matmul(
            probabilities(
                torch.matmul(qh[:, :, i : i + rows], kt),
                None if mask is None else mask[i : i + rows],
            ),
            vals,
        )
        for i in range(0, num_tokens, rows)
    ]
    out = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=2)  # (H_kv, G, T, D_v)
    return out.flatten(0, 1).transpose(0, 1).flatten(1)
