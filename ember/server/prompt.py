"""Prompts of requests: a chat's messages through the model's chat template, its history cut to
num_ctx as Ollama's chatPrompt does, and /api/generate's prompt, system, suffix and raw rules.

Text only: tokenizing is the caller's (through `count`), images travel beside the text."""

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from ember.errors import EmberError
from ember.gotemplate import is_go_template
from ember.template import TemplateError, fills_gaps, render_chat, render_fill

# No chat template in the file: the contents, one after another (a generate prompt stays as is).
PLAIN_TEMPLATE = (
    "{% for m in messages %}{% if not loop.first %}{{ '\\n\\n' }}{% endif %}{{ m['content'] }}"
    "{% endfor %}"
)
IMAGE_TOKENS = 768  # what Ollama counts for an image of a projector file's model in a chat


class PromptError(EmberError):
    """A request whose prompt cannot be built (the server answers 400)."""


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message as Ollama's API carries it; images are decoded bytes."""

    role: str
    content: str = ""
    images: tuple[bytes, ...] = ()
    tool_calls: tuple[dict[str, Any], ...] = ()  # [{"function": {"name", "arguments": {...}}}]
    thinking: str = ""
    tool_name: str = ""
    tool_call_id: str = ""


@dataclass(frozen=True, slots=True)
class FillInMiddle:
    """The special tokens a code model completes a gap with: prefix, suffix, middle."""

    prefix: str
    suffix: str
    middle: str


_FIM_STYLES = (
    FillInMiddle("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder
    FillInMiddle("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder
)


def fill_in_middle(vocab: Sequence[str]) -> FillInMiddle | None:
    """The fill-in-the-middle tokens a vocabulary has (Ollama's "insert" capability)."""
    tokens = set(vocab)
    return next((f for f in _FIM_STYLES if {f.prefix, f.suffix, f.middle} <= tokens), None)


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """What building a prompt needs to know of a model."""

    source: str | None  # the chat template (Jinja, or Ollama's Go); None: PLAIN_TEMPLATE
    bos_token: str = ""
    eos_token: str = ""
    system: str = ""  # the default system prompt (Modelfile SYSTEM)
    messages: tuple[Message, ...] = ()  # messages put before every chat (Modelfile MESSAGE)
    fim: FillInMiddle | None = None  # its vocabulary's tokens to fill a gap (suffix) with
    image_tokens: int = IMAGE_TOKENS

    def render(self, messages: Sequence[Message], **context: Any) -> tuple[str, list[bytes]]:
        """The text of messages (images as [img-N] tags) and their images in tag order."""
        dicts, images = _template_messages(messages)
        try:
            return self._render(messages, dicts, context), images
        except TemplateError:
            # DeepSeek V3.1's and functionary's templates join a call's arguments to text,
            # written as JSON: HF's form (an object) fails there, so they get that instead
            strung = _arguments_as_json(dicts)
            if strung is None:
                raise
            return self._render(messages, strung, context), images

    def _render(
        self, messages: Sequence[Message], dicts: list[dict[str, Any]], context: dict[str, Any]
    ) -> str:
        source = self.source or PLAIN_TEMPLATE
        extra = {"bos_token": self.bos_token, "eos_token": self.eos_token, **context}
        last = messages[-1] if messages else None
        # a Go template continues a final assistant message itself, as in Ollama
        if (
            last is not None
            and last.role == "assistant"
            and last.content
            and not last.tool_calls
            and not is_go_template(source)
        ):
            return _continued(source, dicts, extra)
        return render_chat(source, dicts, **extra)


def _arguments_as_json(dicts: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The messages with each call's arguments as a JSON string; None when no call has any."""
    out, changed = [], False
    for d in dicts:
        calls = d.get("tool_calls")
        if calls:
            strung = [_json_arguments(c) for c in calls]
            changed = changed or strung != calls
            d = {**d, "tool_calls": strung}
        out.append(d)
    return out if changed else None


def _json_arguments(call: dict[str, Any]) -> dict[str, Any]:
    function = call.get("function")
    if not isinstance(function, dict) or isinstance(function.get("arguments"), str):
        return call
    return {**call, "function": {**function, "arguments": json.dumps(function.get("arguments"))}}


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str
    images: tuple[bytes, ...] = ()  # in the order of their [img-N] tags
    truncated: bool = False  # older messages were dropped to fit num_ctx


def chat_prompt(
    template: ChatTemplate,
    messages: Sequence[Message],
    *,
    tools: Sequence[dict[str, Any]] | None = None,
    think: bool | str | None = None,
    count: Callable[[str], int] | None = None,
    num_ctx: int | None = None,
) -> Prompt:
    """The prompt of a chat. The model's MESSAGEs come first, its SYSTEM before them unless
    the chat opens with a system message. With count and num_ctx, the oldest messages are
    dropped until the prompt fits (system messages and the last message always stay)."""
    msgs = list(template.messages) + list(messages)
    if template.system and (not messages or messages[0].role != "system"):
        msgs.insert(0, Message("system", template.system))
    context = _template_context(tools, think)

    @cache
    def render_from(start: int) -> Prompt:
        kept = [m for m in msgs[:start] if m.role == "system"] + msgs[start:]
        text, images = template.render(kept, **context)
        truncated = any(m.role != "system" for m in msgs[:start])
        return Prompt(text, tuple(images), truncated)

    if count is None or num_ctx is None or len(msgs) < 2:
        return render_from(0)

    def fits(p: Prompt) -> bool:
        return count(p.text) + template.image_tokens * len(p.images) <= num_ctx

    if fits(render_from(0)):
        return render_from(0)
    # Binary search: fewer messages never render longer. msgs[-1] is always kept.
    lo, hi = 1, len(msgs) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(render_from(mid)) else (mid + 1, hi)
    return render_from(hi)


@dataclass(frozen=True, slots=True)
class Completion:
    """The prompt parts of a /api/generate request."""

    prompt: str = ""
    system: str = ""  # "": the model's SYSTEM
    suffix: str = ""  # text after the gap to fill (needs ChatTemplate.fim)
    images: tuple[bytes, ...] = ()
    raw: bool = False  # the prompt goes to the model as it is
    think: bool | str | None = None
    context: str = ""  # the decoded `context` of an earlier response, continued by this one


def generate_prompt(template: ChatTemplate, request: Completion) -> Prompt:
    """The prompt of /api/generate: raw as given; with a suffix, the fill-in-the-middle form;
    else system (the request's, or the model's) and prompt as one user turn of the template.
    The server rejects raw with a `template` of its own before calling this."""
    if request.raw:
        if request.system or request.context:
            raise PromptError("raw mode does not support template, system, or context")
        return Prompt(request.prompt, request.images)
    if request.suffix:
        if template.source and fills_gaps(template.source):  # a Go template with .Suffix
            text = render_fill(template.source, request.prompt, request.suffix, request.think)
            return Prompt(text, request.images)
        if template.fim is None:
            raise PromptError("this model does not support insert (a suffix)")
        fim = template.fim
        text = f"{fim.prefix}{request.prompt}{fim.suffix}{request.suffix}{fim.middle}"
        return Prompt(text, request.images)
    system = request.system or template.system
    msgs = [Message("system", system)] if system else []
    if not request.context:
        msgs += template.messages
    msgs.append(Message("user", request.prompt, images=request.images))
    text, images = template.render(msgs, **_template_context(None, request.think))
    return Prompt(request.context + text, tuple(images))


def _template_context(
    tools: Sequence[dict[str, Any]] | None, think: bool | str | None
) -> dict[str, Any]:
    # HF templates read `tools`, `enable_thinking` (Qwen3) and `reasoning_effort` (gpt-oss);
    # tools is None without any, as HF passes it (`tools is not none` is false, not undefined)
    context: dict[str, Any] = {"tools": list(tools) if tools else None}
    if think is not None:
        context["enable_thinking"] = think is not False
        if isinstance(think, str):
            context["reasoning_effort"] = think
    return context


def _template_messages(messages: Sequence[Message]) -> tuple[list[dict[str, Any]], list[bytes]]:
    dicts: list[dict[str, Any]] = []
    images: list[bytes] = []
    for m in messages:
        content = _tag_images(m.content, len(images), len(m.images))
        images += m.images
        d: dict[str, Any] = {"role": m.role, "content": content}
        if m.tool_calls:
            d["tool_calls"] = list(m.tool_calls)
        if m.thinking:  # Ollama's field, and the name HF templates read
            d["thinking"] = d["reasoning_content"] = m.thinking
        if m.tool_name:
            d["tool_name"] = d["name"] = m.tool_name
        if m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
        dicts.append(d)
    return dicts, images


def _tag_images(content: str, first_id: int, num_images: int) -> str:
    # as Ollama: each image replaces the next "[img]" of the content, else goes before it
    prefix = ""
    for image_id in range(first_id, first_id + num_images):
        tag = f"[img-{image_id}]"
        if "[img]" in content:
            content = content.replace("[img]", tag, 1)
        else:
            prefix += tag
    return prefix + content


def _continued(source: str, dicts: list[dict[str, Any]], extra: dict[str, Any]) -> str:
    """A final assistant message left open, so the model continues it (Ollama's templates leave
    the last assistant turn unclosed): the render is cut after that message's content."""
    text = render_chat(source, dicts, add_generation_prompt=False, **extra)
    content = dicts[-1]["content"].strip()
    at = text.rfind(content)
    if at < 0:  # the template does not show it as given: answer after it instead
        return render_chat(source, dicts, **extra)
    return text[: at + len(content)]
