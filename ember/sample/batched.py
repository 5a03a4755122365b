"""One sampling step over a batch of rows, each with its own Sampler (parameters, seeded generator,
recent tokens) and optional grammar mask: the same token each row's Sampler.sample would give.

The passes over the vocabulary are batched (one block-maxima pass, one argmax for the greedy
rows, one top-k at the largest k); what follows top-k works on a few candidates per row, and each
row draws from its own generator, so a sequence's tokens do not depend on its batch.
"""

from collections.abc import Sequence

import torch

from ember.sample.sampler import Sampler, biased, penalize, truncate
from ember.sample.topk import argmax_rows, block_maxima, sorted_row, top_k_rows


def sample_rows(
    samplers: Sequence[Sampler],
    logits: torch.Tensor,
    allowed: Sequence[torch.Tensor | None] | None = None,
) -> list[int]:
    """logits (R, V), one row per sampler -> the R next tokens.

    allowed[i], when given, is row i's (V',) bool grammar mask (tokens past V' are disallowed,
    as `grammar.constrain`). The samplers' recent tokens are read, not changed: call `accept`
    with each token afterwards.
    """
    _check(samplers, logits, allowed)
    work = _prepared(samplers, logits, allowed).contiguous()  # (R, V)
    maxima = block_maxima(work)
    vocab_size = work.shape[1]
    greedy, partial, full = _groups(samplers, vocab_size)
    tokens = [0] * len(samplers)
    for r, token in zip(greedy, argmax_rows(work, greedy, maxima), strict=True):
        tokens[r] = token
    ks = [samplers[r].params.top_k for r in partial]
    for r, (values, ids) in zip(partial, top_k_rows(work, partial, ks, maxima), strict=True):
        tokens[r] = samplers[r].draw(*truncate(values, ids, samplers[r].params))
    for r in full:
        tokens[r] = samplers[r].draw(*truncate(*sorted_row(work[r]), samplers[r].params))
    return tokens


def _check(
    samplers: Sequence[Sampler],
    logits: torch.Tensor,
    allowed: Sequence[torch.Tensor | None] | None,
) -> None:
    if logits.dim() != 2 or logits.shape[0] != len(samplers) or logits.shape[1] == 0:
        raise ValueError(f"logits {tuple(logits.shape)} must be (R, V) for {len(samplers)} rows")
    if allowed is not None and len(allowed) != len(samplers):
        raise ValueError(f"{len(allowed)} masks for {len(samplers)} rows")


def _groups(samplers: Sequence[Sampler], vocab_size: int) -> tuple[list[int], list[int], list[int]]:
    """Row numbers: greedy (temperature 0), partial top_k (0 < k < V), full sort (the rest)."""
    greedy: list[int] = []
    partial: list[int] = []
    full: list[int] = []
    for r, s in enumerate(samplers):
        if s.params.temperature == 0:
            greedy.append(r)
        elif 0 < s.params.top_k < vocab_size:
            partial.append(r)
        else:
            full.append(r)
    return greedy, partial, full


def _prepared(
    samplers: Sequence[Sampler],
    logits: torch.Tensor,
    allowed: Sequence[torch.Tensor | None] | None,
) -> torch.Tensor:
    """The rows as each sampler sees them: biased (logit_bias, every row in one write), masked
    by their grammar, then penalized over their recent tokens (Sampler.sample's order). logits
    itself when no row changes, else a copy."""
    masks = allowed if allowed is not None else [None] * len(samplers)
    changed = [
        r
        for r, s in enumerate(samplers)
        if masks[r] is not None or (s.params.has_penalties and s.counts)
    ]
    has_bias = any(s.params.logit_bias for s in samplers)
    if not changed and not has_bias:
        return logits
    work = biased(logits, [s.params.logit_bias for s in samplers]) if has_bias else logits.clone()
    for r in changed:
        mask, s = masks[r], samplers[r]
        if mask is not None:
            _apply_mask(work[r], mask)
        if s.params.has_penalties and s.counts:
            work[r] = penalize(work[r], s.counts, s.params)
    return work


def _apply_mask(row: torch.Tensor, allowed: torch.Tensor) -> None:
    """Sets the tokens of row (V,) that allowed (V',) does not allow to -inf, in place."""
    n = min(row.numel(), allowed.numel())
    row[:n].masked_fill_(allowed[:n].logical_not().to(row.device), float("-inf"))
    row[n:] = float("-inf")
