"""/api/chat and /api/generate as async streams of Ollama's response chunks (dicts): checks,
the load and unload forms, the prompt, the runner's records through the output parser, the
final metrics. Routes choose streaming or one merged answer; /v1 translates the chunks.

Errors are APIError: raised before the first chunk they become the response's status."""

import asyncio
import base64
import contextlib
import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import asdict, replace
from typing import Any, TypeVar

from ember.errors import EmberError
from ember.gotime import utc_now
from ember.runner.client import RunnerError
from ember.server import budget, harmony
from ember.server.api import ChatRequest, GenerateRequest, Generation
from ember.server.errors import RUNNER_STOPPED_MESSAGE, APIError, unsupported
from ember.server.metrics import CompletionObserver
from ember.server.model import ServedModel
from ember.server.output import Parser, Part, logprobs
from ember.server.output_rules import (
    chat_constraint,
    forces_unreadable_call,
    generate_constraint,
    output_parser,
    thinking_tags,
)
from ember.server.prompt import Completion, Message, Prompt, chat_prompt, generate_prompt
from ember.server.scheduler import Lease
from ember.server.state import Plan, ServerState, runner_failure
from ember.server.thinking import no_thinking_message
from ember.server.tool_grammar import choice_mode

Chunk = dict[str, Any]

log = logging.getLogger("ember.server")


def now() -> str:
    """created_at as Ollama writes it (Go's RFC 3339 in UTC)."""
    return utc_now()


def check_capabilities(
    name: str, model: ServedModel, *, think: Any, tools: bool, images: bool, what: str
):
    """400 for what the model cannot do, with Ollama's messages; `what` is "generate" or
    "chat", which an embedding-only model cannot do."""
    if "completion" not in model.capabilities:
        raise unsupported(name, what)
    if think not in (None, False) and "thinking" not in model.capabilities:
        raise APIError(400, no_thinking_message(name))
    if tools and "tools" not in model.capabilities:
        raise unsupported(name, "tools")
    if images and "vision" not in model.capabilities:
        raise unsupported(name, "vision")


async def chat(
    state: ServerState,
    req: ChatRequest,
    *,
    thinking_budget: int | None = None,
    relax_thinking: bool = False,
) -> AsyncGenerator[Chunk, None]:
    """The chunks of a chat; thinking_budget: at most that many tokens of thinking (budget.py);
    relax_thinking: as _checked_chat's."""
    start = time.perf_counter_ns()
    plan, req = _checked_chat(state, req, relax_thinking=relax_thinking)
    if is_load_form(req):
        reason, load_ns = await load_or_unload(state, plan, req.keep_alive)
        empty = {"role": "assistant", "content": ""}
        yield _final({"message": empty}, req.model, reason, start, load_ns)
        return
    async with state.lease(plan, req.keep_alive) as lease:
        prompt = await _chat_prompt(lease, plan, req)
        parser = output_parser(plan.model, req, prompt.text, tools=req.tools)
        observer = state.metrics.completion(plan.model.name, start)
        grammar = chat_constraint(plan.model, req, prompt.text)
        run = _run(
            lease,
            plan,
            req,
            prompt,
            parser,
            observer,
            grammar=grammar,
            thinking_budget=thinking_budget,
        )
        async with contextlib.aclosing(run):  # here, not by the collector: README's Soak
            async for part, lps, final in run:
                message: dict[str, Any] = {"role": "assistant", "content": part.content}
                if part.thinking:
                    message["thinking"] = part.thinking
                if part.tool_calls:
                    message["tool_calls"] = part.tool_calls
                fields: Chunk = {"message": message}
                if lps:
                    fields["logprobs"] = lps
                if final is None:
                    yield {"model": req.model, "created_at": now(), **fields, "done": False}
                    continue
                chunk = _final(fields, req.model, final, start, lease.load_duration)
                if prompt.truncated:
                    chunk["truncated"] = True
                yield chunk


async def count_tokens(state: ServerState, req: ChatRequest) -> int:
    """The tokens of a chat's whole prompt as the model's runner counts them (images as the
    template counts them): the input tokens the chat would have."""
    plan, req = _checked_chat(state, req)
    async with state.lease(plan, req.keep_alive) as lease:
        prompt = await _chat_prompt(lease, plan, req.model_copy(update={"truncate": False}))
        tokens = await _tokens(lease, prompt.text)
    return len(tokens) + plan.model.template.image_tokens * len(prompt.images)


def _checked_chat(
    state: ServerState, req: ChatRequest, *, relax_thinking: bool = False
) -> tuple[Plan, ChatRequest]:
    """A chat's plan, and the request with the tools its tool_choice leaves; 400 for what the
    model cannot do. relax_thinking: thinking asked of a model that cannot think is dropped,
    not refused (Anthropic's clients ask it of every model, and Ollama relaxes it for them)."""
    plan = state.plan(req.model, req.options)
    if relax_thinking and req.think and "thinking" not in plan.model.capabilities:
        log.warning("the model cannot think: thinking left off", extra={"model": req.model})
        req = req.model_copy(update={"think": None})
    images = any(m.images for m in req.messages)
    req = req.model_copy(update={"tools": req.chosen_tools()})
    tools = bool(req.tools)
    choice_mode(req)  # a contradiction is a 400 before anything loads
    if forces_unreadable_call(plan.model, req):
        raise APIError(400, "tool_choice cannot force a call in this model's call format yet")
    check_capabilities(
        req.model, plan.model, think=req.think, tools=tools, images=images, what="chat"
    )
    return plan, thinking_by_default(req, plan.model)


async def rendered(state: ServerState, req: GenerateRequest | ChatRequest) -> Chunk:
    """Ollama's `_debug_render_only` answer: the prompt the template made, nothing generated."""
    if isinstance(req, ChatRequest):
        plan, req = _checked_chat(state, req)
    else:
        plan, req = _checked_generate(state, req)
    async with state.lease(plan, req.keep_alive) as lease:
        if isinstance(req, ChatRequest):
            prompt = await _chat_prompt(lease, plan, req)
            empty: Chunk = {"message": {"role": "", "content": ""}}
        else:
            prompt = await _generate_prompt(lease, plan, req)
            empty = {"response": ""}
    info: dict[str, Any] = {"rendered_template": prompt.text}
    if prompt.images:
        info["image_count"] = len(prompt.images)
    return {"model": req.model, "created_at": now(), **empty, "done": False, "_debug_info": info}


_Request = TypeVar("_Request", GenerateRequest, ChatRequest)


def _checked_generate(
    state: ServerState, req: GenerateRequest
) -> tuple[Plan, GenerateRequest]:
    plan = state.plan(req.model, req.options)
    images = bool(req.images)
    check_capabilities(
        req.model, plan.model, think=req.think, tools=False, images=images, what="generate"
    )
    if req.raw and (req.template or req.system or req.context):
        raise APIError(400, "raw mode does not support template, system, or context")
    if req.suffix and "insert" not in plan.model.capabilities:
        raise unsupported(req.model, "insert")
    return plan, thinking_by_default(req, plan.model)


def thinking_by_default(req: _Request, model: ServedModel) -> _Request:
    """A thinking model asked nothing of think thinks, as Ollama's handlers set think=true (a
    Go template's .Think had read false, where Jinja templates and the parser thought)."""
    if req.think is None and "thinking" in model.capabilities:
        return req.model_copy(update={"think": True})
    return req


async def generate(state: ServerState, req: GenerateRequest) -> AsyncGenerator[Chunk, None]:
    start = time.perf_counter_ns()
    plan, req = _checked_generate(state, req)
    if is_load_form(req):
        reason, load_ns = await load_or_unload(state, plan, req.keep_alive)
        yield _final({"response": ""}, req.model, reason, start, load_ns)
        return
    async with state.lease(plan, req.keep_alive) as lease:
        prompt = await _generate_prompt(lease, plan, req)
        parser = output_parser(plan.model, req, prompt.text)
        said: list[str] = []  # the model's text, its thinking included, as Ollama's context
        observer = state.metrics.completion(plan.model.name, start)
        grammar = generate_constraint(plan.model, req, prompt.text)
        run = _run(lease, plan, req, prompt, parser, observer, grammar=grammar, raw=said)
        async with contextlib.aclosing(run):  # here, not by the collector: README's Soak
            async for part, lps, final in run:
                fields: Chunk = {"response": part.content}
                if part.thinking:
                    fields["thinking"] = part.thinking
                if lps:
                    fields["logprobs"] = lps
                if final is None:
                    yield {"model": req.model, "created_at": now(), **fields, "done": False}
                    continue
                if not req.raw:  # as Ollama: the tokens of prompt and answer, to continue from
                    context = prompt.text + "".join(said)
                    fields["context"] = await _tokens(lease, context, add_special=False)
                yield _final(fields, req.model, final, start, lease.load_duration)


async def _tokens(lease: Lease, text: str, *, add_special: bool = True) -> list[int]:
    """The runner's tokens of text; a runner that failed (even one killed right after a final
    record) fails the request with its API error, as Ollama's does, not as a bug."""
    try:
        return await lease.runner.tokenize(text, add_special=add_special)
    except RunnerError as err:
        raise await runner_failure(err, lease.runner) from None


def is_load_form(req: GenerateRequest | ChatRequest) -> bool:
    """A request with nothing to answer (no messages; no prompt nor images): it loads or unloads
    the model, and its answer is one JSON object, streamed or not, as Ollama's c.JSON."""
    if isinstance(req, ChatRequest):
        return not req.messages
    return not req.prompt and not req.images


async def load_or_unload(
    state: ServerState, plan: Plan, keep_alive: float | None
) -> tuple[str, int]:
    """The empty request: keep_alive 0 unloads the model, anything else loads it."""
    if keep_alive == 0:
        await state.scheduler.unload(plan.shape.model_path)
        return "unload", 0
    async with state.lease(plan, keep_alive) as lease:
        return "load", lease.load_duration


def _final(
    fields: Chunk, name: str, final: dict[str, Any] | str, start: int, load_duration: int
) -> Chunk:
    chunk: Chunk = {"model": name, "created_at": now(), **fields, "done": True}
    if isinstance(final, str):  # the load and unload forms
        chunk["done_reason"] = final
        return chunk
    reason = final.get("done_reason", "stop")
    chunk.update(
        done_reason="" if reason == "closed" else reason,
        total_duration=time.perf_counter_ns() - start,
        load_duration=load_duration,
        # Ollama reports the whole prompt, cached or not
        prompt_eval_count=final.get("prompt_count", final.get("prompt_eval_count", 0)),
        prompt_eval_duration=final.get("prompt_eval_duration", 0),
        eval_count=final.get("eval_count", 0),
        eval_duration=final.get("eval_duration", 0),
    )
    for key in ("draft_proposed", "draft_accepted"):  # when speculative decoding was on
        if key in final:
            chunk[key] = final[key]
    if final.get("stop_sequence"):  # an extension: which stop string ended the answer
        chunk["stop_sequence"] = final["stop_sequence"]
    return chunk


async def _chat_prompt(lease: Lease, plan: Plan, req: ChatRequest) -> Prompt:
    messages = [m.to_prompt() for m in req.messages]
    tools = [t.to_template() for t in req.tools] or None
    think = req.think
    if plan.model.harmony:
        messages, tools, think = harmony.chat_inputs(messages, tools, think)
    prompt = await _rendered_chat(lease, plan, req, messages, tools, think)
    return _harmony_answer(plan, req, prompt)


def _harmony_answer(plan: Plan, req: Generation, prompt: Prompt) -> Prompt:
    """gpt-oss asked for a format without thinking: its final channel opened after the prompt
    (with thinking, the analysis comes first: output_rules.py)."""
    if plan.model.harmony and req.format is not None and req.think is False:
        return harmony.answering(prompt)
    return prompt


async def _rendered_chat(
    lease: Lease,
    plan: Plan,
    req: ChatRequest,
    messages: list[Message],
    tools: list[dict[str, Any]] | None,
    think: bool | str | None,
) -> Prompt:
    try:
        # a template renders off the event loop: an untrusted one may take its fuel's seconds
        if req.truncate is False:
            return await asyncio.to_thread(
                chat_prompt, plan.model.template, messages, tools=tools, think=think
            )
        loop = asyncio.get_running_loop()

        def count(text: str) -> int:  # runs in the worker thread; the runner call on the loop
            future = asyncio.run_coroutine_threadsafe(lease.runner.tokenize(text), loop)
            return len(future.result())

        return await asyncio.to_thread(
            chat_prompt,
            plan.model.template,
            messages,
            tools=tools,
            think=think,
            count=count,
            num_ctx=lease.loaded.num_ctx,
        )
    except RunnerError as err:
        raise await runner_failure(err, lease.runner) from None
    except EmberError as err:  # a template that fails to render, a prompt that cannot be built
        raise APIError(400, str(err)) from None


async def _generate_prompt(lease: Lease, plan: Plan, req: GenerateRequest) -> Prompt:
    template = plan.model.template
    if req.template:
        template = replace(template, source=req.template)
    think = harmony.think_for_template(req.think) if plan.model.harmony else req.think
    try:
        context = await lease.runner.detokenize(req.context) if req.context else ""
        request = Completion(
            prompt=req.prompt,
            system=req.system,
            suffix=req.suffix,
            images=tuple(req.images),
            raw=req.raw,
            think=think,
            context=context,
        )
        prompt = await asyncio.to_thread(generate_prompt, template, request)  # as chats
        return prompt if req.raw else _harmony_answer(plan, req, prompt)
    except RunnerError as err:
        raise await runner_failure(err, lease.runner) from None
    except EmberError as err:
        raise APIError(400, str(err)) from None


async def _run(
    lease: Lease,
    plan: Plan,
    req: Generation,
    prompt: Prompt,
    parser: Parser,
    observer: CompletionObserver,
    *,
    grammar: str | None = None,
    thinking_budget: int | None = None,
    raw: list[str] | None = None,
) -> AsyncGenerator[tuple[Part, list[dict[str, Any]], dict[str, Any] | None], None]:
    """(part, logprobs, None) per runner piece, then (rest, [], final record); the observer
    sees every record (metrics). grammar: the Lark text of tool_choice (tool_grammar.py), which
    the runner takes instead of a format. raw: gets the model's text as it came, before any
    thinking or call was parsed out of it."""
    fields = runner_fields(lease, plan, req)
    if grammar is not None:  # it holds the format too, where there is one
        fields["grammar"], fields["format"] = grammar, None
    if prompt.images:  # as Ollama's ImageData: base64 bytes and the N of the prompt's [img-N]
        fields["images"] = [
            {"data": base64.b64encode(data).decode(), "id": i}
            for i, data in enumerate(prompt.images)
        ]
    records = runner_records(lease, prompt.text, fields)
    tags = thinking_tags(plan.model, req)
    if thinking_budget is not None and tags is not None:

        def complete(text: str, fields: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
            return runner_records(lease, text, fields)

        records = budget.capped(complete, prompt.text, fields, budget=thinking_budget, tags=tags)
    async with contextlib.aclosing(records):
        async for record in records:
            observer.record(record)
            if record.get("done"):
                yield parser.flush(), [], record
                return
            content = record.get("content", "")
            if raw is not None:
                raw.append(content)
            part = parser.add(content)
            lps = logprobs(record.get("logprobs") or [])
            if part or lps:
                yield part, lps, None


def runner_fields(lease: Lease, plan: Plan, req: Generation) -> dict[str, Any]:
    options = asdict(replace(plan.options, num_ctx=lease.loaded.num_ctx))
    options["stop"] = list(plan.options.stop)
    return {
        "options": options,
        "format": req.format,
        "shift": req.shift is not False,
        "truncate": req.truncate is not False,
        "logprobs": req.logprobs,
        "top_logprobs": req.top_logprobs,
        **({"logit_bias": req.logit_bias} if req.logit_bias else {}),
    }


async def runner_records(
    lease: Lease, prompt: str, fields: dict[str, Any]
) -> AsyncGenerator[dict[str, Any], None]:
    """The runner's records up to the final one; APIError for an error record or a failure."""
    try:
        async with contextlib.aclosing(lease.runner.completion(prompt, **fields)) as records:
            async for record in records:
                if "error" in record:
                    raise APIError(500, str(record["error"]))
                yield record
                if record.get("done"):
                    return
    except RunnerError as err:
        raise await runner_failure(err, lease.runner) from None
    raise APIError(500, RUNNER_STOPPED_MESSAGE)  # the stream ended without its final record


def merge_chat(chunks: list[Chunk]) -> Chunk:
    """A non-streamed chat answer: every chunk's message joined, the last one's metrics."""
    merged = dict(chunks[-1])
    messages = [c["message"] for c in chunks]
    message: dict[str, Any] = {"role": "assistant", "content": _joined(messages, "content")}
    if thinking := _joined(messages, "thinking"):
        message["thinking"] = thinking
    if calls := [call for m in messages for call in m.get("tool_calls", [])]:
        message["tool_calls"] = calls
    merged["message"] = message
    return _merge_logprobs(merged, chunks)


def merge_generate(chunks: list[Chunk]) -> Chunk:
    merged = dict(chunks[-1])
    merged["response"] = _joined(chunks, "response")
    if thinking := _joined(chunks, "thinking"):
        merged["thinking"] = thinking
    return _merge_logprobs(merged, chunks)


def _joined(items: list[dict[str, Any]], key: str) -> str:
    return "".join(item.get(key, "") for item in items)


def _merge_logprobs(merged: Chunk, chunks: list[Chunk]) -> Chunk:
    lps = [lp for c in chunks for lp in c.get("logprobs", [])]
    if lps:
        merged["logprobs"] = lps
    return merged
