"""Thinking: whether a template can think, its tags, and a stream parser splitting model output
into `thinking` and `content` (Ollama's thinking.Parser). It does not build prompts."""

import re
from dataclasses import dataclass
from enum import Enum, auto

from ember.gotemplate import is_go_template
from ember.server.holdback import partial_tag
from ember.template import PROBE_SPECIALS, TemplateError, render_chat


@dataclass(frozen=True, slots=True)
class ThinkingTags:
    opening: str
    closing: str


THINK = ThinkingTags("<think>", "</think>")

_SENTINEL = "EMBER_THINKING_SENTINEL"
# "<think>", "<|begin_of_thought|>", Magistral's "[THINK]", Kimi's "◁think▷"
_TAG = re.compile(r"<[^<>\s]{1,40}>|\[[^\[\]\s]{1,40}\]|◁[^◁▷\s]{1,40}▷")
# closing tags a template may name in its text without rendering a thinking field (DeepSeek-R1)
_NAMED_CLOSING = re.compile(r"</(think|thinking|thought|reasoning)>")


def infer_tags(template: str | None) -> ThinkingTags | None:
    """The tags around thinking that a chat template writes, or None if it has none.

    Rendered first (a past assistant turn with a sentinel as its thinking), as Ollama reads them
    from its Go template; else a closing tag a Jinja template's text names, such as `</think>`
    (DeepSeek-R1's drops past thinking)."""
    if not template:
        return None
    for text in _renders_with_thinking(template):
        tags = _tags_around(text, _SENTINEL)
        if tags is not None:
            return tags
    if is_go_template(template):  # Ollama reads only what surrounds .Thinking
        return None
    named = _NAMED_CLOSING.search(template)
    return ThinkingTags(f"<{named.group(1)}>", named.group(0)) if named else None


def can_think(template: str | None) -> bool:
    """Ollama's "thinking" capability: the template writes thinking between tags."""
    return infer_tags(template) is not None


def no_thinking_message(model: str) -> str:
    """The 400 error text for think=true sent to a model that cannot think."""
    return f'"{model}" does not support thinking'


def _renders_with_thinking(template: str) -> list[str]:
    # Qwen3 writes reasoning_content only after the last user turn; others for every turn.
    past = {
        "role": "assistant",
        "content": "answer",
        "reasoning_content": _SENTINEL,
        "thinking": _SENTINEL,
    }
    user = {"role": "user", "content": "question"}
    renders = []
    for messages, gen in (([user, past], False), ([user, past, user], True)):
        try:
            renders.append(
                render_chat(template, messages, add_generation_prompt=gen, **PROBE_SPECIALS)
            )
        except TemplateError:
            continue
    return renders


def _tags_around(text: str, sentinel: str) -> ThinkingTags | None:
    at = text.find(sentinel)
    if at < 0:
        return None
    before, after = text[:at].rstrip(), text[at + len(sentinel) :].lstrip()
    opening = next(reversed(list(_TAG.finditer(before))), None)
    closing = _TAG.match(after)
    if opening is None or closing is None or opening.end() != len(before):
        return None
    return ThinkingTags(opening.group(0), closing.group(0))


class _State(Enum):
    LOOKING = auto()  # before the opening tag: only whitespace seen so far
    STARTING = auto()  # after the opening tag, eating whitespace
    THINKING = auto()
    ENDING = auto()  # after the closing tag, eating whitespace
    DONE = auto()  # everything from here on is content


def prompt_opens(prompt: str, tags: ThinkingTags) -> bool:
    """Whether the prompt leaves the output inside thinking: a template whose generation prompt
    ends with the opening tag (Qwen3, DeepSeek-R1)."""
    return prompt.rstrip().endswith(tags.opening)


class ThinkingParser:
    """Splits streamed output into (thinking, content). Thinking counts only when the output
    opens with the opening tag (after whitespace), or when the prompt already opened it.

    Whitespace right inside and after the tags is dropped, as Ollama does; a piece that may be
    the start of a tag is held back until the next piece tells."""

    def __init__(self, tags: ThinkingTags = THINK, *, prompt: str = "") -> None:
        self.tags = tags
        self._buffer = ""
        self._state = _State.STARTING if prompt_opens(prompt, tags) else _State.LOOKING

    def add(self, text: str) -> tuple[str, str]:
        """Feeds a piece of output; returns the (thinking, content) that is now certain."""
        self._buffer += text
        thinking, content = "", ""
        while self._buffer:
            step = self._step()
            if step is None:
                break
            thinking, content = thinking + step[0], content + step[1]
        return thinking, content

    def flush(self) -> tuple[str, str]:
        """At the end of output: what was held back (unclosed thinking stays thinking)."""
        rest, self._buffer = self._buffer, ""
        if self._state in (_State.STARTING, _State.THINKING):
            return rest.strip(), ""
        if self._state == _State.ENDING:
            return "", ""
        return "", rest

    def _step(self) -> tuple[str, str] | None:
        """One transition over the buffer; None when it must wait for more text."""
        if self._state == _State.LOOKING:
            return self._looking()
        if self._state in (_State.STARTING, _State.ENDING):
            return self._eat_space()
        if self._state == _State.THINKING:
            return self._thinking()
        out, self._buffer = self._buffer, ""
        return "", out

    def _looking(self) -> tuple[str, str] | None:
        trimmed = self._buffer.lstrip()
        if trimmed.startswith(self.tags.opening):
            self._buffer = trimmed[len(self.tags.opening) :]
            self._state = _State.STARTING
            return "", ""
        if self.tags.opening.startswith(trimmed):
            return None  # whitespace or a partial opening tag: wait
        self._state = _State.DONE
        return "", ""

    def _eat_space(self) -> tuple[str, str] | None:
        self._buffer = self._buffer.lstrip()
        if not self._buffer:
            return None
        self._state = _State.THINKING if self._state == _State.STARTING else _State.DONE
        return "", ""

    def _thinking(self) -> tuple[str, str] | None:
        before, found, after = self._buffer.partition(self.tags.closing)
        if found:  # the space before the closing tag stays thinking, as Ollama's parser
            self._buffer, self._state = after, _State.ENDING
            return before, ""
        hold = partial_tag(before, self.tags.closing)  # held back: it may be the closing tag
        certain, self._buffer = before[: len(before) - hold], before[len(before) - hold :]
        return (certain, "") if certain else None
