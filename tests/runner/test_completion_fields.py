"""The runner's completion request: a grammar beside format (never both), logit_bias ids checked
against the vocabulary; a final record lets its sequence go at once."""

import asyncio
import queue
import sys

import pytest

from ember.errors import EmberError
from ember.runner.sequence import Done, Event, Piece
from ember.runner.server import CompletionRequest, _grammar, _last, _logit_bias, _stream


def test_logit_bias_ids_must_be_in_the_vocabulary() -> None:
    assert _logit_bias({3: -100.0, 9: 2.0}, 10) == ((3, -100.0), (9, 2.0))
    with pytest.raises(EmberError, match="token 10, outside the vocabulary"):
        _logit_bias({10: 1.0}, 10)


def test_a_completion_takes_a_format_or_a_grammar() -> None:
    req = CompletionRequest.model_validate(
        {"prompt": "x", "format": "json", "grammar": 'start: "a"', "logit_bias": {"3": 1}}
    )
    assert req.logit_bias == {3: 1.0}
    with pytest.raises(EmberError, match="not both"):
        _grammar(req, tokenizer=None)  # type: ignore[arg-type]
    assert _grammar(CompletionRequest(prompt="x"), tokenizer=None) is None  # type: ignore[arg-type]


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
    """_last leaves no event stream to the collector: its slot is let go when it returns."""
    finalized: list[str] = []

    async def last() -> tuple[Done, bool]:
        sys.set_asyncgen_hooks(finalizer=lambda agen: finalized.append(agen.__qualname__))
        done = Done("stop", 1, 0, 0, 0)
        seq = QueuedSequence(Piece("a"), done)
        answer = await _last(seq, asyncio.Event())  # type: ignore[arg-type]
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
        stream = _stream(seq, asyncio.Event())  # type: ignore[arg-type]
        first = await anext(stream)
        await stream.aclose()
        return first, seq.cancelled

    assert asyncio.run(cut()) == (b'{"content": "a"}\n', True)
    assert finalized == []
