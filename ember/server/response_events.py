"""The Responses API's answer built from native chat chunks: the stream's events (numbered by
sequence_number) and the response object they end with. A request that does not stream gets
that same object, built the same way. Ids are made here; storing is the route's."""

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from ember.gofuncs import go_json_text
from ember.server.errors import APIError
from ember.server.openai import token_logprobs, usage
from ember.server.output import call_id

Chunk = dict[str, Any]


def new_id(prefix: str) -> str:
    """An id as OpenAI's look: resp_, msg_, rs_ or fc_ and 48 hex digits."""
    return f"{prefix}_{secrets.token_hex(24)}"


@dataclass(slots=True)
class _Open:
    """The item being streamed: a reasoning summary or a message's text."""

    item: Chunk
    index: int
    text: str = ""
    logprobs: list[Chunk] = field(default_factory=list)

    def where(self) -> Chunk:
        return {"item_id": self.item["id"], "output_index": self.index}


class ResponseBuilder:
    """Turns one request's native chunks into events; `response()` is the object at any time."""

    def __init__(self, model: str, echo: Chunk) -> None:
        self.id = new_id("resp")
        self.created_at = int(time.time())
        self._model, self._echo = model, echo  # echo: the request's fields the object repeats
        self._sequence = 0
        self.output: list[Chunk] = []  # finished items, in order
        self._open: _Open | None = None
        self._space = ""  # whitespace before any text: sent with the text after it, or dropped
        self.status = "in_progress"
        self._usage: Chunk | None = None
        self._error: Chunk | None = None
        self._completed_at: int | None = None

    def response(self) -> Chunk:
        incomplete = {"reason": "max_output_tokens"} if self.status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "completed_at": self._completed_at,
            "error": self._error,
            "incomplete_details": incomplete,
            "model": self._model,
            "output": list(self.output),
            "usage": self._usage,
            **self._echo,
        }

    def start(self) -> list[Chunk]:
        return [
            self._event("response.created", response=self.response()),
            self._event("response.in_progress", response=self.response()),
        ]

    def add(self, native: Chunk) -> list[Chunk]:
        """The events of one native chunk; the last chunk's end with response.completed."""
        message = native.get("message") or {}
        events = []
        if message.get("thinking"):
            events += self._thinking(message["thinking"])
        if message.get("content"):
            events += self._text(message["content"], token_logprobs(native))
        for call in message.get("tool_calls") or []:
            events += self._call(call)
        if native.get("done"):
            events += self._finish(native)
        return events

    def fail(self, err: APIError) -> list[Chunk]:
        """The events of a stream that ends with an error: `error`, then response.failed."""
        code = "server_error" if err.status >= 500 else "invalid_prompt"
        self.status, self._error = "failed", {"code": code, "message": err.message}
        return [
            self._event("error", code=code, message=err.message, param=None),
            self._event("response.failed", response=self.response()),
        ]

    def _event(self, kind: str, **fields: Any) -> Chunk:
        self._sequence += 1
        return {"type": kind, "sequence_number": self._sequence - 1, **fields}

    def _is_open(self, kind: str) -> bool:
        return self._open is not None and self._open.item["type"] == kind

    def _opened(self, kind: str) -> tuple[list[Chunk], _Open]:
        """The open item of kind, begun (and the one before it ended) when it is not open."""
        if self._open is not None and self._is_open(kind):
            return [], self._open
        item = _reasoning_item() if kind == "reasoning" else _message_item()
        events = self._end()
        opened = self._open = _Open(item, len(self.output))
        events.append(
            self._event("response.output_item.added", output_index=opened.index, item=item)
        )
        if kind == "reasoning":
            part: Chunk = {"type": "summary_text", "text": ""}
            added, where = "response.reasoning_summary_part.added", {"summary_index": 0}
        else:
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            added, where = "response.content_part.added", {"content_index": 0}
        events.append(self._event(added, **opened.where(), **where, part=part))
        return events, opened

    def _end(self) -> list[Chunk]:
        """The closing events of the open item, which joins the output."""
        opened, self._open = self._open, None
        if opened is None:
            return []
        is_reasoning = opened.item["type"] == "reasoning"
        item, events = self._end_reasoning(opened) if is_reasoning else self._end_message(opened)
        self.output.append(item)
        done = self._event("response.output_item.done", output_index=opened.index, item=item)
        return [*events, done]

    def _end_reasoning(self, opened: _Open) -> tuple[Chunk, list[Chunk]]:
        where = {**opened.where(), "summary_index": 0}
        part: Chunk = {"type": "summary_text", "text": opened.text}
        return {**opened.item, "summary": [part]}, [
            self._event("response.reasoning_summary_text.done", **where, text=opened.text),
            self._event("response.reasoning_summary_part.done", **where, part=part),
        ]

    def _end_message(self, opened: _Open) -> tuple[Chunk, list[Chunk]]:
        where = {**opened.where(), "content_index": 0}
        text, lps = opened.text, opened.logprobs
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": lps}
        status = "incomplete" if self.status == "incomplete" else "completed"
        return {**opened.item, "status": status, "content": [part]}, [
            self._event("response.output_text.done", **where, text=text, logprobs=lps),
            self._event("response.content_part.done", **where, part=part),
        ]

    def _thinking(self, text: str) -> list[Chunk]:
        events, opened = self._opened("reasoning")
        opened.text += text
        delta = self._event(
            "response.reasoning_summary_text.delta", **opened.where(), summary_index=0, delta=text
        )
        return [*events, delta]

    def _text(self, text: str, lps: list[Chunk]) -> list[Chunk]:
        if not self._is_open("message"):
            if not (self._space + text).strip():  # perhaps only the space before a tool call
                self._space += text
                return []
            text, self._space = self._space + text, ""
        return self._write(text, lps)

    def _write(self, text: str, lps: list[Chunk]) -> list[Chunk]:
        events, opened = self._opened("message")
        opened.text += text
        opened.logprobs += lps
        if text:
            where = opened.where()
            delta = self._event(
                "response.output_text.delta", **where, content_index=0, delta=text, logprobs=lps
            )
            events.append(delta)
        return events

    def _call(self, call: Chunk) -> list[Chunk]:
        events = self._end()
        function = call["function"]
        arguments = go_json_text(function.get("arguments", {}))
        item = {
            "id": new_id("fc"),
            "type": "function_call",
            "status": "in_progress",
            "call_id": call.get("id") or call_id(),
            "name": function["name"],
            "arguments": "",
        }
        where = {"item_id": item["id"], "output_index": len(self.output)}
        done = {**item, "status": "completed", "arguments": arguments}
        self.output.append(done)
        return [
            *events,
            self._event(
                "response.output_item.added", output_index=where["output_index"], item=item
            ),
            self._event("response.function_call_arguments.delta", **where, delta=arguments),
            self._event("response.function_call_arguments.done", **where, arguments=arguments),
            self._event("response.output_item.done", output_index=where["output_index"], item=done),
        ]

    def _finish(self, native: Chunk) -> list[Chunk]:
        self.status = "incomplete" if native.get("done_reason") == "length" else "completed"
        events = self._end()
        if not any(item["type"] in ("message", "function_call") for item in self.output):
            events += self._write(self._space, []) + self._end()  # an answer of no text
        counts = usage(native)
        self._usage = {
            "input_tokens": counts["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": counts["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": counts["total_tokens"],
        }
        # OpenAI's field is set only once a response is completed
        self._completed_at = int(time.time()) if self.status == "completed" else None
        kind = "response.incomplete" if self.status == "incomplete" else "response.completed"
        return [*events, self._event(kind, response=self.response())]


def _message_item() -> Chunk:
    return {
        "id": new_id("msg"),
        "type": "message",
        "status": "in_progress",
        "role": "assistant",
        "content": [],
    }


def _reasoning_item() -> Chunk:
    return {"id": new_id("rs"), "type": "reasoning", "summary": []}
