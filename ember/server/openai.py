"""OpenAI compatibility (/v1): each request becomes a native one (openai_api.py translates the
fields), runs through the same flows as /api/chat and /api/generate, and its chunks are turned
into OpenAI's objects; streams are server-sent events. Errors use OpenAI's error object."""

import asyncio
import base64
import contextlib
import secrets
import struct
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from ember.gofuncs import go_json_text
from ember.server import embedding, generation, rerank
from ember.server.api import (
    ChatMessage,
    ChatRequest,
    GenerateRequest,
    RequestError,
    RequestOptions,
    RerankRequest,
)
from ember.server.api_schema import json_body
from ember.server.errors import APIError, openai_error
from ember.server.image_urls import Fetched, fetch_images
from ember.server.openai_api import ChatCompletionRequest, CompletionRequest, EmbeddingsRequest
from ember.server.routes import body_of, state_of
from ember.server.streaming import collect, interleaved, sse_response, started, until_disconnected

router = APIRouter(prefix="/v1")
Chunk = dict[str, Any]
_FINGERPRINT = "fp_ember"


def _stream_error(err: APIError) -> dict[str, Any]:
    return openai_error(err.status, err.message)


# --- /v1/chat/completions ---


@router.post("/chat/completions", openapi_extra=json_body(ChatCompletionRequest))
async def chat_completions(request: Request) -> Response:
    req = await body_of(request, ChatCompletionRequest)
    native = _native_chat(req, await fetch_images(req.image_urls()))
    state = state_of(request)
    reply = _Reply("chatcmpl", req.model, include_usage=_usage_wanted(req))
    if req.debug_render_only:
        shown = await until_disconnected(request, generation.rendered(state, native))
        return JSONResponse(_rendered(reply.chat([shown]), shown))
    if not req.stream:

        def one(i: int) -> AsyncGenerator[Chunk, None]:
            return generation.chat(state, _with_seed(native, i))

        merged = [generation.merge_chat(c) for c in await _each_choice(request, req.n, one)]
        return JSONResponse(reply.chat(merged))
    streams = [generation.chat(state, _with_seed(native, i)) for i in range(req.n)]
    return sse_response(reply.chat_stream(await started(request, streams)), _stream_error)


def _native_chat(req: ChatCompletionRequest, fetched: Fetched) -> ChatRequest:
    tools, tool_choice = req.ollama_tools()
    return ChatRequest.model_construct(
        model=req.model,
        messages=[ChatMessage.from_prompt(m) for m in req.ollama_messages(fetched)],
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=req.parallel_tool_calls,
        format=req.ollama_format(),
        options=RequestOptions.model_validate(req.ollama_options()),
        stream=req.stream,
        think=req.ollama_think(),
        logprobs=bool(req.logprobs),  # top_logprobs alone asks for none, as Ollama
        top_logprobs=req.top_logprobs,
        logit_bias=req.logit_bias,
        keep_alive=req.keep_alive,
    )


def _with_seed(native: Any, i: int) -> Any:
    """The i-th choice's request: a given seed becomes seed + i, so choices differ; -1 (random)
    stays random for every choice, and the count skips -1 and wraps as an int64."""
    seed = native.options.seed if native.options is not None else None
    if i == 0 or seed is None or seed == -1:
        return native
    shifted = seed + i + (1 if seed < -1 <= seed + i else 0)
    options = native.options.model_copy(update={"seed": (shifted + 2**63) % 2**64 - 2**63})
    return native.model_copy(update={"options": options})


async def _each_choice(
    request: Request, n: int, start: Callable[[int], AsyncGenerator[Chunk, None]]
) -> list[list[Chunk]]:
    """The chunks of n generations run at once (they share the runner's batch)."""
    return list(await asyncio.gather(*(collect(request, start(i)) for i in range(n))))


def _usage_wanted(req: ChatCompletionRequest | CompletionRequest) -> bool:
    return req.stream_options is not None and req.stream_options.include_usage


class _Reply:
    """Builds OpenAI's objects from native chunks; one id and creation time per request."""

    def __init__(self, prefix: str, model: str, *, include_usage: bool) -> None:
        self.id = f"{prefix}-{secrets.randbelow(1000)}"
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage

    def _object(self, kind: str, choices: list[dict[str, Any]]) -> Chunk:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": _FINGERPRINT,
            "choices": choices,
        }

    def chat(self, natives: list[Chunk]) -> Chunk:
        choices = []
        for index, native in enumerate(natives):
            message = _message(native["message"])
            choices.append(
                {
                    "index": index,
                    "message": message,
                    "finish_reason": _finish_reason(native, bool(message.get("tool_calls"))),
                    "logprobs": _chat_logprobs(native),
                }
            )
        return {**self._object("chat.completion", choices), "usage": usage(*natives)}

    async def chat_stream(
        self, streams: list[AsyncGenerator[Chunk, None]]
    ) -> AsyncGenerator[Chunk, None]:
        """OpenAI's chunks (as Ollama's since its streams follow OpenAI's): the role in a
        choice's first delta only, then what each native chunk adds, and at its end a chunk
        of an empty delta with the finish reason."""
        has_calls = [False] * len(streams)
        started = [False] * len(streams)
        finals = []
        async with contextlib.aclosing(interleaved(streams)) as chunks:
            async for index, native in chunks:
                delta = _message(native["message"])
                has_calls[index] = has_calls[index] or bool(delta.get("tool_calls"))
                if started[index]:
                    del delta["role"]
                done = native.get("done")
                if not done or native.get("logprobs") or _adds(delta) or not started[index]:
                    choice = {"index": index, "delta": delta, "finish_reason": None}
                    if native.get("logprobs"):
                        choice["logprobs"] = _chat_logprobs(native)
                    yield self._object("chat.completion.chunk", [choice])
                    started[index] = True
                if done:
                    finish = _finish_reason(native, has_calls[index])
                    choice = {"index": index, "delta": {}, "finish_reason": finish}
                    yield self._object("chat.completion.chunk", [choice])
                    finals.append(native)
        if self.include_usage and finals:
            yield {**self._object("chat.completion.chunk", []), "usage": usage(*finals)}

    def completion(self, natives: list[Chunk], *, echo: str = "") -> Chunk:
        choices = [
            {
                "text": echo + native.get("response", ""),
                "index": index,
                "logprobs": _completion_logprobs(native, len(echo)),
                "finish_reason": _finish_reason(native, False),
            }
            for index, native in enumerate(natives)
        ]
        return {**self._object("text_completion", choices), "usage": usage(*natives)}

    async def completion_stream(
        self, streams: list[AsyncGenerator[Chunk, None]], *, echo: str = ""
    ) -> AsyncGenerator[Chunk, None]:
        echoed = [False] * len(streams)  # each choice's first text starts with the echo
        offset = [len(echo)] * len(streams)  # of a choice's next token, for text_offset
        finals = []
        async with contextlib.aclosing(interleaved(streams)) as chunks:
            async for index, native in chunks:
                finish = _finish_reason(native, False) if native.get("done") else None
                logprobs = _completion_logprobs(native, offset[index])
                choice = {
                    "text": ("" if echoed[index] else echo) + native.get("response", ""),
                    "index": index,
                    "logprobs": logprobs,
                    "finish_reason": finish,
                }
                echoed[index] = True
                offset[index] += sum(len(t) for t in logprobs["tokens"]) if logprobs else 0
                yield self._object("text_completion", [choice])
                if native.get("done"):
                    finals.append(native)
        if self.include_usage and finals:
            yield {**self._object("text_completion", []), "usage": usage(*finals)}


def _message(native: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": native.get("content", "")}
    if native.get("thinking"):
        message["reasoning"] = native["thinking"]
    calls = native.get("tool_calls") or []
    if calls:
        message["tool_calls"] = [
            {
                "index": call["function"].get("index", i),
                "id": call.get("id", ""),
                "type": "function",
                "function": {
                    "name": call["function"]["name"],
                    "arguments": go_json_text(call["function"].get("arguments", {})),
                },
            }
            for i, call in enumerate(calls)
        ]
    return message


def _adds(delta: dict[str, Any]) -> bool:
    """Whether a delta holds anything past its role."""
    return any(value for key, value in delta.items() if key != "role")


def _rendered(body: Chunk, native: Chunk) -> Chunk:
    """Ollama's `_debug_render_only` answer on /v1, one object streamed or not: nothing
    generated, no finish reason, the rendered prompt in `_debug_info`."""
    for choice in body["choices"]:
        choice["finish_reason"] = None
    return {**body, "_debug_info": native["_debug_info"]}


def _finish_reason(native: Chunk, has_calls: bool) -> str:
    # calls relabel only a stop: a call in an answer cut short ends with length, as Ollama's
    if native.get("done_reason") == "length":
        return "length"
    return "tool_calls" if has_calls else "stop"


def usage(*natives: Chunk) -> dict[str, int]:
    """OpenAI's usage of one or more choices of the same prompt: its tokens counted once."""
    prompt = natives[0].get("prompt_eval_count", 0)
    completion = sum(native.get("eval_count", 0) for native in natives)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _chat_logprobs(native: Chunk) -> dict[str, Any] | None:
    entries = token_logprobs(native)
    return {"content": entries} if entries else None


def token_logprobs(native: Chunk) -> list[dict[str, Any]]:
    """A chunk's logprobs as OpenAI's entries (chat's `content`, the Responses API's text)."""
    return [
        {
            "token": lp["token"],
            "logprob": lp["logprob"],
            "bytes": lp.get("bytes"),
            "top_logprobs": lp.get("top_logprobs", []),
        }
        for lp in native.get("logprobs") or []
    ]


def _completion_logprobs(native: Chunk, offset: int = 0) -> dict[str, Any] | None:
    """The legacy completions form: parallel lists of tokens, logprobs, top maps and each
    token's character offset in the whole text (offset: the first token's, after an echo)."""
    lps = native.get("logprobs")
    if not lps:
        return None
    offsets = []
    for lp in lps:
        offsets.append(offset)
        offset += len(lp["token"])
    return {
        "tokens": [lp["token"] for lp in lps],
        "text_offset": offsets,
        "token_logprobs": [lp["logprob"] for lp in lps],
        # OpenAI's: up to logprobs + 1 entries, the sampled token always among them
        "top_logprobs": [
            {t["token"]: t["logprob"] for t in lp.get("top_logprobs", [])}
            | {lp["token"]: lp["logprob"]}
            for lp in lps
        ],
    }


# --- /v1/completions ---


@router.post("/completions", openapi_extra=json_body(CompletionRequest))
async def completions(request: Request) -> Response:
    req = await body_of(request, CompletionRequest)
    native = GenerateRequest.model_construct(
        model=req.model,
        prompt=req.prompt,
        suffix=req.suffix,
        options=RequestOptions.model_validate(req.ollama_options()),
        stream=req.stream,
        logprobs=req.logprobs is not None,
        top_logprobs=req.logprobs or 0,
        logit_bias=req.logit_bias,
        keep_alive=req.keep_alive,
    )
    state = state_of(request)
    reply = _Reply("cmpl", req.model, include_usage=_usage_wanted(req))
    if req.debug_render_only:
        shown = await until_disconnected(request, generation.rendered(state, native))
        return JSONResponse(_rendered(reply.completion([shown]), shown))
    echo = req.prompt if req.echo else ""
    if not req.stream:

        def one(i: int) -> AsyncGenerator[Chunk, None]:
            return generation.generate(state, _with_seed(native, i))

        merged = [generation.merge_generate(c) for c in await _each_choice(request, req.n, one)]
        return JSONResponse(reply.completion(merged, echo=echo))
    streams = [generation.generate(state, _with_seed(native, i)) for i in range(req.n)]
    choices = await started(request, streams)
    return sse_response(reply.completion_stream(choices, echo=echo), _stream_error)


# --- /v1/embeddings ---


@router.post("/embeddings", openapi_extra=json_body(EmbeddingsRequest))
async def embeddings(request: Request) -> dict[str, Any]:
    req = await body_of(request, EmbeddingsRequest)
    if not req.input:
        raise RequestError("invalid input: a string or a non-empty list of strings", "input")
    result = await embedding.embed(
        state_of(request),
        request,
        req.model,
        list(req.input),
        options=None,
        truncate=True,
        dimensions=req.dimensions,
        keep_alive=None,
    )
    data = [
        {"object": "embedding", "embedding": _encoded(v, req.encoding_format), "index": i}
        for i, v in enumerate(result.vectors)
    ]
    count = result.prompt_eval_count
    return {
        "object": "list",
        "data": data,
        "model": req.model,
        "usage": {"prompt_tokens": count, "total_tokens": count},
    }


def _encoded(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "base64":  # little-endian float32, as OpenAI's clients decode it
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


# --- /v1/rerank (llama-server's and Cohere's; OpenAI has none) ---


@router.post("/rerank", openapi_extra=json_body(RerankRequest))
async def rerank_documents(request: Request) -> dict[str, Any]:
    req = await body_of(request, RerankRequest)
    return await rerank.rerank(state_of(request), request, req)


# --- /v1/models ---


@router.get("/models")
async def models(request: Request) -> dict[str, Any]:
    listed = state_of(request).models.available()
    return {"object": "list", "data": [_model(*entry) for entry in listed]}


@router.get("/models/{name:path}")
async def model(request: Request, name: str) -> dict[str, Any]:
    served = state_of(request).models.resolve(name)
    return _model(name, int(served.modified_at.timestamp()), served.owner)


def _model(name: str, created: int, owner: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": owner}
