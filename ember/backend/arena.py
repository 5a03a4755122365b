"""The decoder's quantized weights moved out of the file's pages into one private anonymous
mapping: the blocks' projections once the model has loaded, the head (into the place kept for
it after them) once its second call has returned.

Eight sequences stepping together read every weight once a step against eight rows of x. With
the weights left where the load put them (the file's mapped pages, and the fused projections'
copies on the heap), SmolLM2's eight-sequence step ran at one of two speeds, the same build and
machine: ~470-575 tok/s in 50 of 69 runs, ~600-700 in the others. With them in one anonymous
mapping, fast in 30 of 36 runs (16 of 18 with the head copied at the load, 14 of 18 with it
copied after its first call); with the blocks' weights there and the head left mapped, 6 of 12:
`benchmarks/bench_step.py`'s loop in fresh processes, alternated, a Zen 5 EPYC, 2 threads,
2026-11-27. Why the placement matters was not found (the VM gives no counters). One sequence's
step, and the results (the same bytes), were the same either way. Huge pages did no better and
took the 3B-shaped file's load from 0.9 to 2.9-3.4 s, so none are asked for.

The head waits because a mapped head was read in only at its first call, after the first
prompt's layers had run and their temporaries had gone back (backend/heap.py). Copied at the
load, Gemma 3's tied 179 MB head sat beside the prompt's temporaries: its peak RSS in
`bench_generate.py` rose from 505 to 624 MB, the 3B file's from 2,244 to 2,340 MiB; the pages
kept for it are not touched, so not counted, until it moves. It moves after its second call
(the first decode step's), not the first (the prompt's): the copy took 8, 45 and 42 ms for
SmolLM2's, Gemma 3's and Qwen 0.5B's heads, 2-11% of a 512-token prompt's time, and a decode
step bears it once where a prompt's time to first token would. Each copy releases the file's
pages it has copied CHUNK bytes at a time, so a weight is never held twice whole; the heap that
held the fused copies is given back after. A mixture's experts (a token reads a few of them) and
a vision tower (a text chat never reads it) stay mapped.
"""

import mmap
from collections.abc import Callable, Iterable

import torch

from ember.backend import heap
from ember.backend.weights import FusedLinear, NativeLinear

ALIGN = 64  # each weight starts on a cache line
CHUNK = 16 << 20  # bytes copied before their source pages are released


def settle_decoder(model: object, release: Callable[[torch.Tensor], None]) -> None:
    """The blocks' projections move now, the model's own (its head) after their second call,
    into the place the mapping keeps for them after the blocks'."""
    blocks = linears_of(getattr(model, "blocks", []))
    moved = {id(w) for w in blocks}
    heads = [w for w in linears_of([model]) if id(w) not in moved]
    later = settle([*blocks, *heads], release, now=len(blocks))
    places = {id(w): place for w, place in zip(heads, later, strict=False)}

    def move(w: NativeLinear) -> None:
        if (place := places.pop(id(w), None)) is not None:
            _move(w, place, release)

    def then_move(w: NativeLinear) -> None:  # after the first call: the prompt's (TTFT)
        w.after_call = move

    for head in heads:
        head.after_call = then_move


def linears_of(owners: Iterable[object]) -> list[NativeLinear]:
    """The quantized projections the owners hold as attributes (FusedLinear parts too), each
    once."""
    found: dict[int, NativeLinear] = {}

    def visit(value: object) -> None:
        if isinstance(value, NativeLinear):
            found.setdefault(id(value), value)
        elif isinstance(value, FusedLinear):
            for part in value.parts:
                visit(part)

    for owner in owners:  # models and blocks are plain objects: their attributes are vars()
        for value in vars(owner).values():
            visit(value)
    return list(found.values())


def settle(
    linears: list[NativeLinear], release: Callable[[torch.Tensor], None], *, now: int | None = None
) -> list[torch.Tensor]:
    """Places every weight's bytes in one new private anonymous mapping, in order, and moves
    the first `now` of them there (all by default): points each at its copy and calls
    release(bytes copied) after each CHUNK and each weight. The places of the others, whose
    pages stay untouched (and uncounted) until _move copies into them."""
    sizes = [w.raw.numel() for w in linears]
    total = sum(-(-n // ALIGN) * ALIGN for n in sizes)
    if total == 0:
        return []
    # private: a shared anonymous map would count as shared memory
    private = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    arena = mmap.mmap(-1, total, flags=private) if private else mmap.mmap(-1, total)
    space = torch.frombuffer(arena, dtype=torch.uint8)  # its views keep the mapping alive
    places, start = [], 0
    for n in sizes:
        places.append(space[start : start + n])
        start += -(-n // ALIGN) * ALIGN
    count = len(linears) if now is None else now
    for w, place in zip(linears[:count], places, strict=False):
        _move(w, place, release)
    heap.give_back()  # the fused projections' old copies
    return places[count:]


def _move(w: NativeLinear, place: torch.Tensor, release: Callable[[torch.Tensor], None]) -> None:
    old = w.raw
    for first in range(0, old.numel(), CHUNK):
        place[first : first + CHUNK].copy_(old[first : first + CHUNK])
        release(old[first : first + CHUNK])
    w.raw = place
    release(old)  # the pages that straddled two chunks
