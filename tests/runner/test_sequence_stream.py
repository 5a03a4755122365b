"""A sequence's events as the runner's answers: its final record and its stream each let the
sequence go at once when they end or are closed, and leave nothing to the collector."""

import asyncio
import queue
import sys

from ember.runner.sequence import Done, Event, Piece
from ember.runner.sequence_stream import final_record, ndjson_stream


class QueuedSequence:
    """A sequence whose events are already queued."""

    def __init__(self, *events: Event) -> None:
        self.events: queue.Queue[Event] = queue.Queue()
        for event in events:
            self.events.put(event)
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def test_a_final_record_closes_its_sequence_stream_at_once() -> None:
    """final_record leaves no event stream to the collector: its slot is let go when it returns."""
    finalized: list[str] = []

    async def last() -> tuple[Done, bool]:
        sys.set_asyncgen_hooks(finalizer=lambda agen: finalized.append(agen.__qualname__))
        done = Done("stop", 1, 0, 0, 0)
        seq = QueuedSequence(Piece("a"), done)
        answer = await final_record(seq, asyncio.Event())  # type: ignore[arg-type]
        return answer, seq.cancelled

    assert asyncio.run(last()) == (Done("stop", 1, 0, 0, 0), True)
    assert finalized == []


def test_a_stream_closed_early_lets_its_sequence_go_at_once() -> None:
    """The completion stream closed after one piece (its client went away) closes its events,
    which cancel the sequence: its slot is not left to the collector."""
    finalized: list[str] = []

    async def cut() -> tuple[bytes, bool]:
        sys.set_asyncgen_hooks(finalizer=lambda agen: finalized.append(agen.__qualname__))
        seq = QueuedSequence(Piece("a"), Piece("b"), Done("stop", 1, 0, 0, 0))
        stream = ndjson_stream(seq, asyncio.Event())  # type: ignore[arg-type]
        first = await anext(stream)
        await stream.aclose()
        return first, seq.cancelled

    assert asyncio.run(cut()) == (b'{"content": "a"}\n', True)
    assert finalized == []
