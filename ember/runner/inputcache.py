"""The input cache: num_parallel slots over one KV cache, each remembering which tokens its
cells hold, so that a new request reuses the longest cached prefix of its prompt.

A slot's id is its sequence id in the KV cache. Optional multi-user mode (Ollama's
OLLAMA_MULTIUSER_CACHE) shares a prefix between slots with copy_prefix instead of evaluating it
again.

A slot also keeps the logits that followed its last prompt. Ollama evaluates a wholly cached
prompt's last token again; here a request for the same prompt draws its first token from the
kept logits instead. Evaluated again, alone, that token took another kernel path than in its
prompt's batch (logits ~0.003 apart), so the same seed could draw another answer.
"""

import itertools
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from ember.errors import EmberError
from ember.kvcache import Cache, CacheFullError

T = TypeVar("T")


class NoFreeSlotError(EmberError):
    """Every slot is serving a sequence."""


@dataclass(eq=False)
class Slot:
    id: int
    inputs: list[int] = field(default_factory=list)  # tokens in the cache, by position
    # position of an image's first input -> the image's hash: placeholders of two images are
    # the same tokens, so a prefix matches past an image only when the hashes agree
    images: dict[int, int] = field(default_factory=dict)
    in_use: bool = False
    last_used: int = 0  # a use counter: higher is more recent
    # the logits after the first `logits_at` inputs (a prompt's end; 0: none), while the cache
    # holds those inputs as they were
    logits: torch.Tensor | None = None
    logits_at: int = 0

    def reserve_logits(self, width: int) -> None:
        """Allocates the slot's row of kept logits now (at load: never mid-generation)."""
        self.logits = torch.empty(width)

    def keep_logits(self, logits: torch.Tensor) -> None:
        """Keeps a copy of the logits after the inputs the slot holds now (in the buffer
        reserve_logits made, where it fits)."""
        if self.logits is None or self.logits.shape != logits.shape:
            self.logits = torch.empty_like(logits)
        self.logits.copy_(logits)
        self.logits_at = len(self.inputs)

    def cut(self, length: int) -> None:
        """Drops the inputs from `length` on (the caller drops their cells); the kept logits
        go with them when they followed a dropped input."""
        del self.inputs[length:]
        if self.logits_at > length:
            self.logits_at = 0


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def matching_prefix(slot: Slot, prompt: list[int], images: dict[int, int]) -> int:
    """How many leading inputs of prompt (with its images) slot holds."""
    n = common_prefix(slot.inputs, prompt)
    differ = [i for i in slot.images.keys() | images.keys() if slot.images.get(i) != images.get(i)]
    return min([n, *differ])


def shift_discard(
    length: int, num_ctx: int, num_keep: int, groups: dict[int, int] | None = None
) -> int:
    """How many inputs after num_keep a shift drops: enough to free half of what is not kept
    (Ollama's ShiftDiscard), and the rest of any group (an image's span: its start -> how many
    inputs follow it) the cut would fall inside, so a span is dropped whole or not at all."""
    target_free = max((num_ctx - num_keep) // 2, 1)
    end = num_keep + max(0, min(target_free - (num_ctx - length), length - num_keep))
    for start, n in (groups or {}).items():
        if start < end <= start + n:
            end = start + n + 1
    return min(end, length) - num_keep


def without_cut(by_index: dict[int, T], begin: int, count: int) -> dict[int, T]:
    """Entries keyed by input position after inputs begin..begin + count were dropped: those in
    the cut gone, the later ones moved down."""
    return {
        (i if i < begin else i - count): v
        for i, v in by_index.items()
        if i < begin or i >= begin + count
    }


class InputCache:
    def __init__(self, cache: Cache, *, num_ctx: int, num_slots: int, multiuser: bool = False):
        self.cache, self.num_ctx, self.multiuser = cache, num_ctx, multiuser
        self.slots = [Slot(i) for i in range(num_slots)]
        self._clock = itertools.count(1)

    def has_free_slot(self) -> bool:
        return any(not s.in_use for s in self.slots)

    def load(
        self, prompt: list[int], *, reuse: bool = True, images: dict[int, int] | None = None
    ) -> tuple[Slot, int]:
        """Takes a free slot for prompt; returns it and how many leading prompt tokens its
        cache already holds: all of them where the slot kept the logits after exactly this
        prompt (slot.logits: the first token is drawn from them), else at most all but the last,
        which is evaluated again. `images` maps the position where each of the prompt's images
        begins to the image's hash."""
        images = images or {}
        free = [s for s in self.slots if not s.in_use]
        if not free:
            raise NoFreeSlotError("no free slot")
        if not reuse:
            slot, num_past = min(free, key=lambda s: s.last_used), 0
        elif self.multiuser:
            slot, num_past = self._best_shared(prompt, free, images)
        else:
            slot = max(free, key=lambda s: (matching_prefix(s, prompt, images), -s.id))
            num_past = matching_prefix(slot, prompt, images)
        whole = reuse and num_past == len(prompt) == slot.logits_at > 0
        num_past = max(0, min(num_past, len(prompt) - (0 if whole else 1)))  # 0 for no prompt
        if not self.cache.can_resume(slot.id, num_past):
            num_past = 0
        self.cache.remove(slot.id, num_past, None)
        slot.cut(num_past)
        slot.images = {i: h for i, h in slot.images.items() if i < num_past}
        slot.images.update((i, h) for i, h in images.items() if i >= num_past)
        slot.in_use, slot.last_used = True, next(self._clock)
        return slot, num_past

    def _best_shared(
        self, prompt: list[int], free: list[Slot], images: dict[int, int]
    ) -> tuple[Slot, int]:
        """A free slot wholly a prefix of prompt; else the least recently used free slot, given
        the longest prefix any slot holds (cells shared, not copied)."""
        lengths = {s.id: matching_prefix(s, prompt, images) for s in self.slots}
        source = max(self.slots, key=lambda s: lengths[s.id])
        longest = lengths[source.id]
        if not source.in_use and longest == len(source.inputs):
            return source, longest
        slot = min(free, key=lambda s: s.last_used)
        if source is not slot and longest > lengths[slot.id]:
            self.cache.copy_prefix(source.id, slot.id, longest)
            slot.cut(0)
            slot.inputs = source.inputs[:longest]
            slot.images = {i: h for i, h in source.images.items() if i < longest}
        return slot, matching_prefix(slot, prompt, images)

    def release(self, slot: Slot) -> None:
        slot.in_use = False
        slot.last_used = next(self._clock)

    def shift(self, slot: Slot, num_keep: int, groups: dict[int, int] | None = None) -> list[int]:
        """Frees room in slot's context: drops inputs after num_keep (never part of a group:
        `groups` maps a group's first position to how many inputs follow it) and shifts the
        later ones down. Returns the inputs to evaluate again when the cache cannot shift in
        place (cells shared with another slot): then the slot is emptied and they come back,
        its images at the positions they will be evaluated at."""
        discard = shift_discard(len(slot.inputs), self.num_ctx, num_keep, groups)
        slot.images = without_cut(slot.images, num_keep, discard)
        slot.logits_at = 0  # the cells after the cut move: the logits no longer follow them
        try:
            self.cache.remove(slot.id, num_keep, num_keep + discard)
        except (CacheFullError, NotImplementedError):
            kept = slot.inputs[:num_keep] + slot.inputs[num_keep + discard :]
            self.cache.remove(slot.id, 0, None)
            slot.cut(0)
            return kept
        del slot.inputs[num_keep : num_keep + discard]
        return []
