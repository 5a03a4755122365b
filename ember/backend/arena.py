"""The decoder's quantized weights moved, once loaded, into one private anonymous mapping.

Eight sequences stepping together read every weight once a step against eight rows of x. With
the weights left where the load put them (the file's mapped pages, and the fused projections'
copies on the heap), SmolLM2's eight-sequence step ran at one of two speeds, the same build and
machine: ~470-575 tok/s in 50 of 69 runs, ~600-690 in the others. With them copied into one
anonymous mapping, 76 of 93 runs were fast, and all 12 of this module's kind (private, 4 KiB
pages): `benchmarks/bench_step.py`'s loop in fresh processes, alternated, a Zen 5 EPYC, 2
threads, 2026-11-27. Why the placement matters was not found (the VM gives no counters). One
sequence's step, and the results (the same bytes), were the same either way. Huge pages did no
better and took the 3B-shaped file's load from 0.9 to 2.9-3.4 s, so none are asked for.

The copies replace the file's pages, which are given back tensor by tensor as they are copied,
so the load's peak holds one tensor twice at most; the heap that held the fused copies is given
back after. Only the blocks' own projections move (the model's and its blocks' attributes): a
mixture's experts, which a token reads a few of, and a vision tower, which a text chat never
reads, stay mapped.
"""

import mmap
from collections.abc import Callable, Iterable

import torch

from ember.backend import heap
from ember.backend.weights import FusedLinear, NativeLinear

ALIGN = 64  # each weight starts on a cache line


def decoder_linears(model: object) -> list[NativeLinear]:
    """The quantized projections held by the model and its blocks, each once."""
    found: dict[int, NativeLinear] = {}

    def visit(value: object) -> None:
        if isinstance(value, NativeLinear):
            found.setdefault(id(value), value)
        elif isinstance(value, FusedLinear):
            for part in value.parts:
                visit(part)

    for owner in [model, *getattr(model, "blocks", [])]:
        for value in _attributes(owner):
            visit(value)
    return list(found.values())


def _attributes(owner: object) -> Iterable[object]:
    if hasattr(owner, "__dict__"):
        yield from vars(owner).values()
    for name in getattr(type(owner), "__slots__", ()):
        if hasattr(owner, name):
            yield getattr(owner, name)


def settle(linears: list[NativeLinear], release: Callable[[torch.Tensor], None]) -> int:
    """Copies every weight's bytes into one new private anonymous mapping and points the
    weight at its copy; release(old bytes) after each copy. Bytes moved."""
    sizes = [w.raw.numel() for w in linears]
    total = sum(-(-n // ALIGN) * ALIGN for n in sizes)
    if total == 0:
        return 0
    # private: a shared anonymous map would count as shared memory
    private = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    arena = mmap.mmap(-1, total, flags=private) if private else mmap.mmap(-1, total)
    space = torch.frombuffer(arena, dtype=torch.uint8)  # its views keep the mapping alive
    start = 0
    for w, n in zip(linears, sizes, strict=True):
        old = w.raw
        w.raw = space[start : start + n].copy_(old)
        release(old)
        start += -(-n // ALIGN) * ALIGN
    heap.give_back()  # the fused projections' old copies
    return total
