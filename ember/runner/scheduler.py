"""What goes in the next batch: pending inputs taken round-robin over the active sequences
(shifting a full context first), drafted tokens after a decoding one's last, and the Batch
they make. It runs nothing: the engine runs the batch and emits what it samples."""

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from ember.batch import Batch
from ember.runner.inputcache import InputCache
from ember.runner.positions import after_discard, offsets
from ember.runner.sequence import CLOSED, LENGTH, Sequence

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Part:
    """One sequence's share of a batch: `count` of its pending inputs, and where its rows are."""

    seq: Sequence
    count: int
    first: int  # index of its first token in the batch
    output: int = -1  # row of its logits (generation) when its prompt is done; -1: none
    draft: list[int] = field(default_factory=list)  # drafted tokens after its last, to verify


class Scheduler:
    def __init__(
        self,
        inputs: InputCache,
        *,
        num_ctx: int,
        num_batch: int,
        vocab_size: int,
        finish: Callable[[Sequence, str], None],
    ) -> None:
        """finish(seq, reason): the engine's end of a sequence (cancelled, or out of context
        with shifting off)."""
        self.inputs = inputs
        self.num_ctx, self.num_batch, self.vocab_size = num_ctx, num_batch, vocab_size
        self._finish = finish
        self._next = 0  # where the next batch's round-robin starts

    def next_batch(self, active: list[Sequence]) -> list[Part]:
        """Takes pending inputs round-robin: each sequence gets what the batch has left after
        one token is set aside for each sequence still to come, so none ever starves."""
        for seq in [s for s in active if s.cancelled]:
            self._finish(seq, CLOSED)
        if not active:
            return []
        start = self._next % len(active)
        order = active[start:] + active[:start]
        fits_all = len(order) <= self.num_batch
        parts: list[Part] = []
        used = 0
        for i, seq in enumerate(order):
            kept_for_others = len(order) - i - 1 if fits_all else 0
            room = self.num_batch - used - kept_for_others
            count = self._take(seq, room, batch_empty=not used)
            if count:
                draft = self._draft(seq, count, room - count)
                parts.append(Part(seq, count, used, draft=draft))
                used += count + len(draft)
        # more sequences than num_batch: the next batch starts after the last one served
        self._next = start + (1 if fits_all else max(len(parts), 1))
        return parts

    def _take(self, seq: Sequence, room: int, *, batch_empty: bool) -> int:
        """How many of seq's pending inputs go in this batch (never splitting a same_batch
        group); shifts seq's context first when it is full."""
        need = 1 + seq.groups[0]
        if len(seq.slot.inputs) + need > self.num_ctx:
            if not seq.request.shift:
                self._finish(seq, LENGTH)
                return 0
            held = len(seq.slot.inputs)
            again = self.inputs.shift(seq.slot, seq.num_keep, seq.same_batch)
            discard = held - len(again) - len(seq.slot.inputs)
            seq.position_shifts = after_discard(seq.position_shifts, seq.num_keep, discard)
            seq.shifted(discard, again)
            need = 1 + seq.groups[0]
        limit = min(room, self.num_ctx - len(seq.slot.inputs))
        if batch_empty:
            limit = max(limit, need)  # a group larger than num_batch still goes, alone
        count = 0
        while count < len(seq.pending) and count + 1 + seq.groups[count] <= limit:
            count += 1 + seq.groups[count]
        return count

    def _draft(self, seq: Sequence, count: int, room: int) -> list[int]:
        """Tokens drafted to follow seq's last one, when it is decoding (its one pending input is
        its last token): never past num_predict, the context, or the batch's room."""
        if seq.drafter is None or count != 1 or len(seq.pending) != 1:
            return []
        if seq.carried[0] is not None:
            return []
        k = min(
            seq.draft_limit,
            room,
            self.num_ctx - len(seq.slot.inputs) - 1,
            seq.num_predict - len(seq.generated) - 1,  # it emits at most k + 1 tokens
        )
        if k <= 0:
            return []
        try:
            draft = seq.drafter.propose(seq.slot.id, seq.slot.inputs + seq.pending, k)[:k]
        except Exception:  # drafting only saves time: a failed one decodes plainly
            log.exception("drafting failed")
            return []
        # a draft model's head may be padded past the vocabulary
        valid = next((i for i, t in enumerate(draft) if not 0 <= t < self.vocab_size), len(draft))
        seq.draft_proposed += valid
        return draft[:valid]


def make_batch(parts: list[Part]) -> Batch:
    """The batch of parts' inputs and drafts; sets each part's `output` (its first logits row)."""
    tokens: list[int] = []
    positions: list[int] = []
    sequences: list[int] = []
    outputs: list[int] = []
    multimodal: list[tuple[int, object]] = []
    types: list[int] = []
    shifted: list[int] = []  # RoPE position offsets (models.base.PositionShifter)
    has_types = any(p.seq.token_types for p in parts)
    has_shifts = any(p.seq.position_shifts for p in parts)
    for p in parts:
        seq, start = p.seq, len(p.seq.slot.inputs)
        carried = enumerate(seq.carried[: p.count], start=p.first)
        multimodal += [(i, data) for i, data in carried if data is not None]
        tokens += seq.pending[: p.count]
        positions += range(start, start + p.count)
        sequences += [seq.slot.id] * p.count
        if has_shifts:
            shifted += offsets(seq.position_shifts, start, p.count + len(p.draft))
        if has_types:  # an encoder's input is whole in its batch: its types from 0
            types += seq.token_types[start : start + p.count] or [0] * p.count
        if seq.embedding:
            p.output = len(outputs)
            outputs += range(p.first, p.first + p.count)
        elif p.count == len(seq.pending):  # its prompt is done: logits for the next token
            p.output = len(outputs)  # and for the token after each drafted one
            outputs += range(p.first + p.count - 1, p.first + p.count + len(p.draft))
            tokens += p.draft
            positions += range(start + p.count, start + p.count + len(p.draft))
            sequences += [seq.slot.id] * len(p.draft)
    indices, data = zip(*multimodal, strict=True) if multimodal else ((), ())
    return Batch(
        tuple(tokens),
        tuple(positions),
        tuple(sequences),
        tuple(outputs),
        indices,
        data,
        tuple(types),
        tuple(shifted),
    )
