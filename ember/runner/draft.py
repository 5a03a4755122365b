"""Drafters for speculative decoding: cheap guesses of a sequence's next tokens, which the engine
has the target model verify in one forward pass. Prompt lookup (the tokens that followed the
sequence's last n-gram earlier in it) and a small draft model with its own KV cache.

Verification and acceptance are the engine's (engine.py); a drafter only proposes.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import torch

from ember.batch import Batch
from ember.errors import EmberError
from ember.model import Model
from ember.runner.inputcache import common_prefix
from ember.runner.memory import reserve
from ember.tokenizer import Tokenizer

if TYPE_CHECKING:  # sequence.py imports this module for Drafter
    from ember.runner.sequence import Request

NGRAM_MAX = 3  # prompt lookup matches the last 3 tokens, else the last 2, else the last one


class DraftModelError(EmberError):
    """A draft model that cannot draft for the target (another vocabulary)."""


class Drafter(Protocol):
    def propose(self, slot: int, tokens: Sequence[int], k: int) -> list[int]:
        """Up to k tokens that may follow tokens (the sequence's context: what its slot's cells
        hold, then its last token); fewer or none when there is no good guess."""


class NgramDrafter:
    """Prompt lookup: no model, no state."""

    def propose(self, slot: int, tokens: Sequence[int], k: int) -> list[int]:
        return ngram_draft(tokens, k)


def ngram_draft(tokens: Sequence[int], k: int, *, max_n: int = NGRAM_MAX) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of tokens' last n-gram,
    for the longest n (max_n down to 1) that occurs earlier; [] when none does."""
    size = len(tokens)
    for n in range(min(max_n, size - 1), 0, -1):
        tail = list(tokens[size - n :])
        last = tail[-1]
        for end in range(size - 2, n - 2, -1):  # end: the index of a candidate's last token
            if tokens[end] == last and list(tokens[end - n + 1 : end + 1]) == tail:
                return list(tokens[end + 1 : end + 1 + k])
    return []


class DraftModel:
    """A small model that drafts greedily, one sequence per slot of the target: its own KV
    cache, and the tokens each slot's cells hold, so each step evaluates only what is new."""

    def __init__(self, model: Model, *, num_slots: int, num_ctx: int, num_batch: int) -> None:
        self.model = model
        self.cache = model.make_cache()
        self.num_slots = num_slots
        self.num_ctx = min(num_ctx, model.context_length)
        self.num_batch = min(num_batch, self.num_ctx)
        self.held: list[list[int]] = [[] for _ in range(num_slots)]

    def reserve(self, kv_type: str) -> int:
        """Allocates the draft cache and runs its worst case; the bytes its KV cache takes."""
        return reserve(
            self.model,
            self.cache,
            num_parallel=self.num_slots,
            num_ctx=self.num_ctx,
            num_batch=self.num_batch,
            dtype=kv_type,
        )

    def propose(self, slot: int, tokens: Sequence[int], k: int) -> list[int]:
        if len(tokens) + k > self.num_ctx:  # past the draft's context: no guess
            return []
        try:
            return self._propose(slot, tokens, k)
        except Exception:  # its cells and `held` may disagree now: start the slot afresh
            self.cache.remove(slot, 0, None)
            self.held[slot].clear()
            raise

    def _propose(self, slot: int, tokens: Sequence[int], k: int) -> list[int]:
        held = self.held[slot]
        num_past = max(0, min(common_prefix(held, list(tokens)), len(tokens) - 1))
        if not self.cache.can_resume(slot, num_past):
            num_past = 0
        self.cache.remove(slot, num_past, None)
        del held[num_past:]
        todo = list(tokens[num_past:])
        while todo:  # what the draft has not seen yet, in batches of num_batch
            logits = self._run(slot, todo[: self.num_batch])
            del todo[: self.num_batch]
        draft = [int(logits[0].argmax())]
        while len(draft) < k:
            draft.append(int(self._run(slot, draft[-1:])[0].argmax()))
        return draft

    def _run(self, slot: int, tokens: list[int]) -> torch.Tensor:
        held = self.held[slot]
        batch = Batch.single(tokens, len(held), seq=slot)
        self.cache.start_forward(batch)
        with torch.inference_mode():
            logits = self.model.forward(batch, self.cache)
        held.extend(tokens)
        return logits


def check_vocabulary(target: Tokenizer, draft: Tokenizer) -> None:
    """Raises DraftModelError unless draft's token ids mean what target's mean."""
    if target.vocab_size != draft.vocab_size or any(
        target.token_bytes(i) != draft.token_bytes(i) for i in range(target.vocab_size)
    ):
        raise DraftModelError(
            "the draft model's vocabulary differs from the model's: a draft model must use the "
            "same tokenizer"
        )


def choose_drafter(
    request: "Request", draft_model: "DraftModel | None"
) -> tuple[Drafter | None, int]:
    """Who drafts for request, and at most how many tokens a step: prompt lookup when it asks
    for it, else the draft model if one is loaded. Never under a grammar (a drafted token could
    break it) nor for an embedding."""
    opts = request.options
    if request.grammar is not None or request.embedding:
        return None, 0
    if opts.draft_ngram > 0:
        return NgramDrafter(), opts.draft_ngram
    if draft_model is not None and opts.draft_num_predict > 0:
        return draft_model, opts.draft_num_predict
    return None, 0
