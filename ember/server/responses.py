"""OpenAI's Responses API: POST /v1/responses runs each request as a native chat through
generation.chat (as /v1/chat/completions does) and answers with one response object or with
the Responses API's events; responses kept with `store` continue with `previous_response_id`
and are read and deleted by id. Errors use OpenAI's error object."""

import contextlib
from collections.abc import AsyncGenerator, Callable
from typing import Any

import zstandard
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ember.server import generation
from ember.server.api_schema import json_body
from ember.server.bodies import RequestError, parse_body
from ember.server.errors import APIError
from ember.server.image_urls import fetch_images
from ember.server.middleware import MAX_BODY_BYTES
from ember.server.response_events import Chunk, ResponseBuilder
from ember.server.response_store import StoredResponse
from ember.server.responses_api import InputItem, ResponsesRequest, image_urls
from ember.server.routes import body_of, state_of
from ember.server.state import ServerState
from ember.server.streaming import collect, event_stream_response, first_chunk, prepend

router = APIRouter(prefix="/v1")


def unzstd(body: bytes) -> bytes:
    """A zstd-compressed body, at most the server's body limit once decompressed (as Ollama's
    ResponsesMiddleware; a bomb is a 400, not the server's memory)."""
    parts, size = [], 0
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(body)
        while part := reader.read(1 << 20):
            size += len(part)
            if size > MAX_BODY_BYTES:
                raise RequestError(f"the decompressed body is over {MAX_BODY_BYTES >> 20} MiB")
            parts.append(part)
    except zstandard.ZstdError:
        raise RequestError("failed to decompress zstd body") from None
    return b"".join(parts)


@router.post("/responses", openapi_extra=json_body(ResponsesRequest))
async def create(request: Request) -> Response:
    if request.headers.get("content-encoding") == "zstd":  # Codex compresses its requests
        req = parse_body(ResponsesRequest, unzstd(await request.body()))
    else:
        req = await body_of(request, ResponsesRequest)
    req.check_supported()
    state = state_of(request)
    history = _stored(state, req.previous_response_id).items if req.previous_response_id else []
    fetched = await fetch_images(image_urls(history + req.input))
    chunks = generation.chat(state, req.native(history, fetched))
    builder = ResponseBuilder(req.model, req.echo())

    def keep() -> None:
        if req.store and builder.status in ("completed", "incomplete"):
            output = [InputItem.model_validate(item) for item in builder.output]
            state.responses.put(StoredResponse(builder.response(), history + req.input + output))

    if not req.stream:
        for chunk in await collect(request, chunks):
            builder.add(chunk)
        keep()
        return JSONResponse(builder.response())
    first = await first_chunk(request, chunks)
    return event_stream_response(_events(builder, prepend(first, chunks), keep), builder.fail)


async def _events(
    builder: ResponseBuilder, chunks: AsyncGenerator[Chunk, None], done: Callable[[], None]
) -> AsyncGenerator[Chunk, None]:
    for event in builder.start():
        yield event
    async with contextlib.aclosing(chunks):
        async for chunk in chunks:
            for event in builder.add(chunk):
                yield event
    done()


@router.get("/responses/{response_id}")
async def retrieve(request: Request, response_id: str) -> dict[str, Any]:
    return _stored(state_of(request), response_id).response


@router.delete("/responses/{response_id}")
async def delete(request: Request, response_id: str) -> dict[str, Any]:
    if not state_of(request).responses.delete(response_id):
        raise _not_found(response_id)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


def _stored(state: ServerState, response_id: str) -> StoredResponse:
    stored = state.responses.get(response_id)
    if stored is None:
        raise _not_found(response_id)
    return stored


def _not_found(response_id: str) -> APIError:
    # OpenAI's wording; a response not stored, deleted or expired reads the same
    return APIError(404, f"Response with id '{response_id}' not found.")
