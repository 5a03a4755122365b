"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens), as Ollama has it: each
request becomes a native chat (anthropic_api.py translates it) run by generation.chat, and its
chunks become Anthropic's message, or its stream of named events. Errors take Anthropic's shape
(errors.anthropic_error, chosen by path in app.py and the middleware)."""

import contextlib
import secrets
import string
from collections.abc import AsyncGenerator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ember.gofuncs import go_json_text
from ember.server import generation
from ember.server.anthropic_api import Conversation, MessagesRequest
from ember.server.api_schema import json_body
from ember.server.errors import APIError, anthropic_error
from ember.server.image_urls import fetch_images
from ember.server.routes import body_of, state_of
from ember.server.streaming import collect, event_stream_response, first_chunk, prepend

router = APIRouter()
Chunk = dict[str, Any]
# Thinking blocks carry a signature; Ember signs nothing and ignores the ones sent back.
SIGNATURE = "ember-unsigned"
_ID_CHARS = string.ascii_letters + string.digits


@router.post("/v1/messages", openapi_extra=json_body(MessagesRequest))
async def messages(request: Request) -> Response:
    req = await body_of(request, MessagesRequest)
    budget = req.thinking_budget()
    fetched = await fetch_images(req.image_urls())
    native = req.native(fetched, options=req.ollama_options(), stream=req.stream)
    chunks = generation.chat(state_of(request), native, thinking_budget=budget, relax_thinking=True)
    if not req.stream:
        merged = generation.merge_chat(await collect(request, chunks))
        return JSONResponse(message(merged, req.model))
    first = await first_chunk(request, chunks)
    events = _Events(req.model, req.estimated_tokens()).stream(prepend(first, chunks))
    return event_stream_response(events, lambda err: [_stream_error(err)])


@router.post("/v1/messages/count_tokens", openapi_extra=json_body(Conversation))
async def count_tokens(request: Request) -> dict[str, int]:
    req = await body_of(request, Conversation)
    native = req.native(await fetch_images(req.image_urls()))
    return {"input_tokens": await generation.count_tokens(state_of(request), native)}


def _stream_error(err: APIError) -> dict[str, Any]:
    return anthropic_error(err.status, err.message)


def new_id(prefix: str) -> str:
    """An id in Anthropic's form: msg_… for messages, toolu_… for tool uses."""
    return f"{prefix}_01" + "".join(secrets.choice(_ID_CHARS) for _ in range(22))


def message(native: Chunk, model: str) -> Chunk:
    """A native chat answer (merged) as Anthropic's message."""
    reply = native["message"]
    content: list[Chunk] = []
    if reply.get("thinking"):
        content.append({"type": "thinking", "thinking": reply["thinking"], "signature": SIGNATURE})
    if reply.get("content"):
        content.append({"type": "text", "text": reply["content"]})
    calls = reply.get("tool_calls") or []
    content += [{**_tool_use(call), "input": _arguments(call)} for call in calls]
    return {
        "id": new_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        **_stop(native, has_calls=bool(calls)),
        "usage": _usage(native),
    }


def _tool_use(call: Chunk) -> Chunk:
    return {"type": "tool_use", "id": new_id("toolu"), "name": call["function"]["name"]}


def _arguments(call: Chunk) -> dict[str, Any]:
    return dict(call["function"].get("arguments") or {})


def _stop(native: Chunk, *, has_calls: bool) -> Chunk:
    """stop_reason and stop_sequence of a final native chunk."""
    if has_calls:
        reason = "tool_use"
    elif native.get("done_reason") == "length":
        reason = "max_tokens"
    else:
        reason = "stop_sequence" if native.get("stop_sequence") else "end_turn"
    return {"stop_reason": reason, "stop_sequence": native.get("stop_sequence") or None}


def _usage(native: Chunk) -> dict[str, int]:
    return {
        "input_tokens": native.get("prompt_eval_count", 0),
        "output_tokens": native.get("eval_count", 0),
    }


_EMPTY_BLOCKS: dict[str, Chunk] = {
    "text": {"type": "text", "text": ""},
    "thinking": {"type": "thinking", "thinking": "", "signature": ""},
}


class _Events:
    """Anthropic's stream from native chunks: message_start and a ping; for each content block
    (thinking, text, each tool_use) its start, deltas and stop; message_delta, message_stop."""

    def __init__(self, model: str, input_tokens: int) -> None:
        self.model, self.input_tokens = model, input_tokens  # an estimate: see estimated_tokens
        self.index = -1  # of the latest block
        self.open: str | None = None  # the type of the block still open
        self.has_calls = False

    async def stream(self, chunks: AsyncGenerator[Chunk, None]) -> AsyncGenerator[Chunk, None]:
        start: Chunk = {
            "id": new_id("msg"),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            # the runner's counts come at the end (message_delta)
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
        }
        yield {"type": "message_start", "message": start}
        yield {"type": "ping"}
        async with contextlib.aclosing(chunks):
            async for native in chunks:
                for event in self._events(native):
                    yield event

    def _events(self, native: Chunk) -> list[Chunk]:
        reply = native["message"]
        events: list[Chunk] = []
        if reply.get("thinking"):
            events += self._delta(
                "thinking", {"type": "thinking_delta", "thinking": reply["thinking"]}
            )
        if reply.get("content"):
            events += self._delta("text", {"type": "text_delta", "text": reply["content"]})
        for call in reply.get("tool_calls") or []:
            events += self._tool_use(call)
        if native.get("done"):
            delta = _stop(native, has_calls=self.has_calls)
            events += self._close()
            events.append({"type": "message_delta", "delta": delta, "usage": _usage(native)})
            events.append({"type": "message_stop"})
        return events

    def _delta(self, kind: str, delta: Chunk) -> list[Chunk]:
        events = [] if self.open == kind else [*self._close(), self._start(_EMPTY_BLOCKS[kind])]
        return [*events, {"type": "content_block_delta", "index": self.index, "delta": delta}]

    def _tool_use(self, call: Chunk) -> list[Chunk]:
        self.has_calls = True
        events = [*self._close(), self._start({**_tool_use(call), "input": {}})]
        partial = {"type": "input_json_delta", "partial_json": go_json_text(_arguments(call))}
        events.append({"type": "content_block_delta", "index": self.index, "delta": partial})
        return [*events, *self._close()]

    def _start(self, block: Chunk) -> Chunk:
        self.index += 1
        self.open = block["type"]
        return {"type": "content_block_start", "index": self.index, "content_block": block}

    def _close(self) -> list[Chunk]:
        if self.open is None:
            return []
        events = []
        if self.open == "thinking":
            signed = {"type": "signature_delta", "signature": SIGNATURE}
            events.append({"type": "content_block_delta", "index": self.index, "delta": signed})
        events.append({"type": "content_block_stop", "index": self.index})
        self.open = None
        return events
