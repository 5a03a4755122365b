"""One sampling step over a batch of rows, each with its own Sampler (parameters, seeded generator,
recent tokens) and optional grammar mask: the same token each row's Sampler.sample would give.

The passes over the vocabulary are batched (one block-maxima pass, one argmax for the greedy
rows, one top-k at the largest k); what follows top-k works on a few candidates per row, and each
row draws from its own generator, so a sequence's tokens do not depend on its batch.
"""

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from ember.sample.sampler import Sampler, bias_entries, penalty_entries, truncate
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
    logits = logits.contiguous()
    with _prepared(samplers, logits, allowed) as work:  # (R, V)
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


@contextmanager
def _prepared(
    samplers: Sequence[Sampler],
    logits: torch.Tensor,
    allowed: Sequence[torch.Tensor | None] | None,
) -> Iterator[torch.Tensor]:
    """logits (R, V) as each sampler sees them: biased (logit_bias, every row in one write),
    masked by their grammar, then penalized over their recent tokens (Sampler.sample's order).
    Changed in place and put back on exit: the caller's rows stay raw (logprobs, a slot's kept
    logits) without a copy of the whole batch each step (8 MB for 8 rows of 262k tokens)."""
    masks = allowed if allowed is not None else [None] * len(samplers)
    undo: list[tuple[tuple[torch.Tensor, ...], torch.Tensor]] = []  # (index, the values it had)
    try:
        with torch.inference_mode():  # the head's logits are inference tensors
            bias = bias_entries(logits, [s.params.logit_bias for s in samplers])
            if bias is not None:
                undo.append((bias[0], logits[bias[0]]))
                logits.index_put_(*bias, accumulate=True)
            for r, (mask, s) in enumerate(zip(masks, samplers, strict=True)):
                penalized = s.params.has_penalties and bool(s.counts)
                if mask is None and not penalized:
                    continue
                row = (torch.tensor([r], device=logits.device),)
                if mask is not None:
                    undo.append((row, logits[r].clone()[None]))
                    _apply_mask(logits[r], mask)
                if penalized:
                    penalty = penalty_entries(logits[r], s.counts, s.params)
                    if penalty is not None:
                        undo.append(((*row, penalty[0]), logits[r, penalty[0]]))
                        logits[r, penalty[0]] = penalty[1]
        yield logits
    finally:
        with torch.inference_mode():
            for index, values in reversed(undo):  # the latest change first: an entry changed
                logits.index_put_(index, values)  # twice gets back the value before both


def _apply_mask(row: torch.Tensor, allowed: torch.Tensor) -> None:
    """Sets the tokens of row (V,) that allowed (V',) does not allow to -inf, in place."""
    n = min(row.numel(), allowed.numel())
    row[:n].masked_fill_(allowed[:n].logical_not().to(row.device), float("-inf"))
    row[n:] = float("-inf")
