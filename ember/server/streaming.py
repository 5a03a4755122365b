"""Responses of a stream of chunks: NDJSON or one merged JSON object (native API), SSE (OpenAI's
data-only events, Anthropic's named ones).

The first chunk is awaited before the response starts, so an error raised before it (a bad
request, a full queue, a model that fails to load) gets its own status; a later one ends the
stream with an error line. A client that goes away cancels the work, which frees its runner slot.
Several streams of one answer (OpenAI's n choices) start and interleave here too.
"""

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ember import disconnect
from ember.server.errors import APIError

log = logging.getLogger("ember.server")

T = TypeVar("T")
Chunk = dict[str, Any]
ErrorBody = Callable[[APIError], dict[str, Any]]


def native_error(err: APIError) -> dict[str, Any]:
    return {"error": err.message}


def error_response(err: APIError, body: ErrorBody = native_error) -> JSONResponse:
    return JSONResponse(body(err), status_code=err.status)


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """work's result; if the client goes away first, work is cancelled and 499 raised."""
    try:
        return await disconnect.until_disconnected(request, work)
    except disconnect.ClientGone:
        log.info("client went away", extra={"path": request.url.path})
        raise APIError(499, "request canceled") from None


async def collect(request: Request, chunks: AsyncIterator[Chunk]) -> list[Chunk]:
    async def gather() -> list[Chunk]:
        return [chunk async for chunk in chunks]

    return await until_disconnected(request, gather())


async def respond(
    request: Request,
    chunks: AsyncGenerator[Chunk, None],
    *,
    stream: bool,
    merge: Callable[[list[Chunk]], Chunk],
) -> Response:
    """The native API's answer: NDJSON when stream, else the chunks merged into one object."""
    try:
        if not stream:
            return JSONResponse(merge(await collect(request, chunks)))
        first = await until_disconnected(request, anext(chunks))
    except APIError as err:
        return error_response(err)
    lines = _lines(prepend(first, chunks), _ndjson, lambda err: _ndjson(native_error(err)))
    return StreamingResponse(lines, media_type="application/x-ndjson")


def compact(value: Any) -> str:
    """JSON as Go's encoder writes it (and FastAPI's non-streamed answers): no spaces."""
    return json.dumps(value, separators=(",", ":"))


def _ndjson(value: dict[str, Any]) -> str:
    return compact(value) + "\n"


async def first_chunk(request: Request, chunks: AsyncGenerator[T, None]) -> T:
    """The first chunk (for routes that format the rest themselves); APIError as raised."""
    return await until_disconnected(request, anext(chunks))


async def prepend(first: T, rest: AsyncGenerator[T, None]) -> AsyncGenerator[T, None]:
    """first, then rest; closing this closes rest."""
    async with contextlib.aclosing(rest):
        yield first
        async for item in rest:
            yield item


async def _lines(
    chunks: AsyncGenerator[T, None],
    encode: Callable[[T], str],
    encode_error: Callable[[APIError], str],
    end: str = "",
) -> AsyncIterator[str]:
    async with contextlib.aclosing(chunks):  # also when the client went away: frees the slot
        try:
            async for chunk in chunks:
                yield encode(chunk)
        except APIError as err:
            yield encode_error(err)
            return
        except Exception as err:  # a bug: the client still gets an error line, not a cut stream
            log.exception("stream failed")
            yield encode_error(APIError(500, f"internal error: {type(err).__name__}: {err}"))
            return
    if end:
        yield end


def sse_response(chunks: AsyncGenerator[Chunk, None], error_body: ErrorBody) -> StreamingResponse:
    """OpenAI's server-sent events: `data: {json}` lines, then `data: [DONE]`."""

    def event(value: dict[str, Any]) -> str:
        return f"data: {compact(value)}\n\n"

    lines = _lines(chunks, event, lambda err: event(error_body(err)), "data: [DONE]\n\n")
    return StreamingResponse(lines, media_type="text/event-stream")


def event_stream_response(
    events: AsyncGenerator[Chunk, None], on_error: Callable[[APIError], list[Chunk]]
) -> StreamingResponse:
    """Server-sent events named by their `type` (OpenAI's Responses API): `event:` and `data:`
    lines, no [DONE]; an error becomes the events on_error gives."""

    def event(value: dict[str, Any]) -> str:
        return f"event: {value['type']}\ndata: {compact(value)}\n\n"

    lines = _lines(events, event, lambda err: "".join(event(e) for e in on_error(err)))
    return StreamingResponse(lines, media_type="text/event-stream")


async def started(
    request: Request, streams: list[AsyncGenerator[T, None]]
) -> list[AsyncGenerator[T, None]]:
    """The streams, the first one's first chunk awaited so that an error before any (a bad
    request, a model that fails to load) gets its own status. The others start as they get a
    slot: n may be more than the runner's parallel sequences, whose slots the first choices
    free only once read to their end. On an error all are closed."""
    try:
        first = await until_disconnected(request, anext(streams[0]))
    except BaseException:
        for stream in streams:
            await stream.aclose()
        raise
    return [prepend(first, streams[0]), *streams[1:]]


async def interleaved(
    streams: list[AsyncGenerator[T, None]],
) -> AsyncGenerator[tuple[int, T], None]:
    """(index, chunk) of each stream's chunks as they come (n choices generated at once); the
    streams are closed when this is."""
    if len(streams) == 1:  # nearly every request: read in place, without a task and a queue
        async with contextlib.aclosing(streams[0]):
            async for only in streams[0]:
                yield 0, only
        return
    queue: asyncio.Queue[tuple[int, T | None, Exception | None]] = asyncio.Queue(16)

    async def pump(index: int, stream: AsyncGenerator[T, None]) -> None:
        try:
            async with contextlib.aclosing(stream):
                async for chunk in stream:
                    await queue.put((index, chunk, None))
        except Exception as err:  # the consumer raises it: the stream's error event
            await queue.put((index, None, err))
        else:
            await queue.put((index, None, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            index, chunk, err = await queue.get()
            if err is not None:
                raise err
            if chunk is None:
                running -= 1
            else:
                yield index, chunk
    finally:  # the client went away, or one choice failed: the others stop too
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
