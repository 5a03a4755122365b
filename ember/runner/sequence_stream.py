"""A submitted sequence's events as the runner's HTTP answers: its final record (embeddings,
rerank) or its NDJSON stream (completion). Each closes the events it reads, so a sequence whose
client went away is cancelled at once and its slot freed in the loop's next step."""

import asyncio
import contextlib
import json
import queue
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from ember.runner.engine import Engine
from ember.runner.sequence import Done, Event, Piece, Sequence
from ember.runner.sequence import Request as SeqRequest


def subscribe(engine: Engine, request: SeqRequest) -> tuple[Sequence, asyncio.Event]:
    """Submits request; the asyncio event is set whenever the loop thread queues an event."""
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()

    def notify() -> None:
        loop.call_soon_threadsafe(wake.set)

    return engine.submit(request, on_event=notify), wake


async def events_of(seq: Sequence, wake: asyncio.Event) -> AsyncGenerator[Event, None]:
    try:
        while True:
            wake.clear()
            try:
                event = seq.events.get_nowait()
            except queue.Empty:
                await wake.wait()
                continue
            yield event
            if isinstance(event, Done):
                return
    finally:  # the client went away (or we are done): the loop frees the slot next step
        seq.cancel()


async def final_record(seq: Sequence, wake: asyncio.Event) -> Done:
    async with contextlib.aclosing(events_of(seq, wake)) as events:  # not left to the collector
        async for event in events:
            if isinstance(event, Done):
                return event
    raise RuntimeError("the sequence ended without a final record")


async def ndjson_stream(seq: Sequence, wake: asyncio.Event) -> AsyncIterator[bytes]:
    # closing this stream (its client went away) closes the events, which frees the slot
    async with contextlib.aclosing(events_of(seq, wake)) as events:
        async for event in events:
            yield (json.dumps(record(event)) + "\n").encode()


def record(event: Event) -> dict[str, Any]:
    """An event as the completion stream's NDJSON record."""
    if isinstance(event, Piece):
        record: dict[str, Any] = {"content": event.text}
        if event.logprobs:
            record["logprobs"] = [
                {
                    "token": lp.token,
                    "logprob": lp.logprob,
                    "top_logprobs": [{"token": t, "logprob": v} for t, v in lp.top],
                }
                for lp in event.logprobs
            ]
        return record
    if event.error is not None:
        return {"error": event.error}
    record = {
        "done": True,
        "done_reason": event.done_reason,
        "prompt_eval_count": event.prompt_eval_count,
        "prompt_eval_duration": event.prompt_eval_duration,
        "eval_count": event.eval_count,
        "eval_duration": event.eval_duration,
        "prompt_count": event.prompt_count,
        "prompt_cached_count": event.prompt_cached_count,
    }
    if event.draft_proposed is not None:  # speculative decoding was on
        record["draft_proposed"] = event.draft_proposed
        record["draft_accepted"] = event.draft_accepted
    if event.stop_sequence:
        record["stop_sequence"] = event.stop_sequence
    return record
