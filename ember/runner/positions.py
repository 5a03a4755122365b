"""RoPE positions that run apart from cache positions after an image (M-RoPE models, see
model.base.PositionShifter): per sequence, the shift from each cache position on."""

import bisect

from ember.model.base import PositionShifter

# (first cache position, total shift from there on), ascending; empty: positions are cache's
Shifts = list[tuple[int, int]]


def image_shifts(model: object, multimodal: dict[int, object]) -> Shifts:
    """The shifts of a sequence's images (multimodal: input index -> image piece)."""
    if not isinstance(model, PositionShifter):
        return []
    shifts, total = [], 0
    for index in sorted(multimodal):
        rows, shift = model.position_shift(multimodal[index])
        if shift:
            total += shift
            shifts.append((index + rows, total))
    return shifts


def offsets(shifts: Shifts, start: int, count: int) -> list[int]:
    """The shift of each of the cache positions start .. start + count."""
    firsts = [p for p, _ in shifts]
    out = []
    for pos in range(start, start + count):
        i = bisect.bisect_right(firsts, pos)
        out.append(shifts[i - 1][1] if i else 0)
    return out


def after_discard(shifts: Shifts, num_keep: int, discard: int) -> Shifts:
    """The shifts once a context shift dropped positions num_keep .. num_keep + discard and
    moved the later ones down: their keys were re-rotated by the same amount, so an image's
    shift still holds for what follows, even when the image itself was dropped."""
    return [(p if p < num_keep else max(num_keep, p - discard), s) for p, s in shifts]
