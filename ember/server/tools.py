"""Tool calls in model output: the format a chat template shows for them, and a stream parser
that turns them into Ollama's `tool_calls` ([{"function": {"index", "name", "arguments"}}]).

Call ids are the server's to add; thinking is split off before output reaches this parser."""

import json
from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, Literal

from ember.server.holdback import partial_tag
from ember.template import PROBE_SPECIALS, TemplateError, render_chat

ToolCall = dict[str, Any]  # {"function": {"index": int, "name": str, "arguments": dict}}


@dataclass(frozen=True, slots=True)
class ToolCallFormat:
    """How a model writes a call: `opening` before its JSON ("<tool_call>"), or "{" / "[" when
    calls are bare JSON; `closing` after it ("</tool_call>"), or ""; `arguments_key`, the key of
    the arguments beside "name" ("parameters" in Llama 3.1's template). style: "json" (the call
    is that JSON), "xml" (Qwen3-Coder's `<function=NAME>` with a `<parameter=KEY>` for each
    argument: xml_calls.py) or "named" (the name before the arguments' JSON, as Mistral's
    `[TOOL_CALLS]NAME[ARGS]{...}`: named_calls.py)."""

    opening: str
    closing: str = ""
    arguments_key: str = "arguments"
    style: Literal["json", "xml", "named"] = "json"

    @property
    def is_bare_json(self) -> bool:
        return _is_bare(self.opening)


BARE_JSON = ToolCallFormat("{")


def _is_bare(tag: str) -> bool:
    return tag in ("{", "[")


XML_FUNCTION, XML_FUNCTION_END = "<function=", "</function>"  # Qwen3-Coder's calls
_NAME = "ember_tool_sentinel"
_CALL_NAME = "ember_call_sentinel"  # not _NAME, which the rendered tool list also holds
_TOOL = {
    "type": "function",
    "function": {
        "name": _NAME,
        "description": "a tool",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
    },
}


def can_use_tools(template: str | None) -> bool:
    """Ollama's "tools" capability: the template shows the model the tools it is given."""
    if not template:
        return False
    try:
        messages = [{"role": "user", "content": "q"}]
        text = render_chat(template, messages, tools=[_TOOL], **PROBE_SPECIALS)
    except TemplateError:
        return False
    return _NAME in text


def tool_call_format(template: str | None) -> ToolCallFormat:
    """The call format a template shows for a past assistant call (Ollama reads the text before
    `{` in its Go template's ToolCalls block); BARE_JSON when it shows none."""
    if not template:
        return BARE_JSON
    try:
        # content that shares no first or last character with a tag: the renders part there
        plain = _render_turn(template, {"role": "assistant", "content": "§"})
    except TemplateError:
        return BARE_JSON
    # the arguments as an object (HF's form), else as JSON text (DeepSeek V3.1's template
    # joins them to its tags); an id as Mistral's templates require one (nine characters)
    for arguments in ({"x": 1}, '{"x": 1}'):
        call = {"id": "a1b2c3d4e", "function": {"name": _CALL_NAME, "arguments": arguments}}
        turn = {"role": "assistant", "content": "", "tool_calls": [call]}
        try:
            return _format_from(plain, _render_turn(template, turn))
        except TemplateError:
            continue
    return BARE_JSON


def _render_turn(template: str, turn: dict[str, Any]) -> str:
    messages = [{"role": "user", "content": "q"}, turn]
    return render_chat(
        template, messages, add_generation_prompt=False, tools=[_TOOL], **PROBE_SPECIALS
    )


def _format_from(plain: str, with_call: str) -> ToolCallFormat:
    # the call's text is what differs from the same turn rendered without it, whole tags
    head = _tag_start(with_call, _common_prefix(plain, with_call))
    tail = _tag_end(with_call, len(with_call) - _common_prefix(plain[::-1], with_call[::-1]))
    at = with_call.find(_CALL_NAME, head)
    if at < 0:
        return BARE_JSON
    if with_call[head:at].endswith(XML_FUNCTION) and "<parameter=" in with_call[at:tail]:
        return _xml_format(with_call, head, at, tail)
    start = with_call.find("{", head, at)  # as Ollama, the tag is what comes before the `{`
    if start < 0:
        return _named_format(with_call, head, at, tail)
    end = json_end(with_call, start)
    opening = with_call[head:start].strip()
    closing = with_call[end:tail].strip() if end is not None and end <= tail else ""
    key = _arguments_key(with_call[start:end]) if end is not None else None
    return ToolCallFormat(opening or "{", closing, key or "arguments")


def _xml_format(with_call: str, head: int, at: int, tail: int) -> ToolCallFormat:
    # the tags around <function=...>...</function>, if the template writes any
    end = with_call.find(XML_FUNCTION_END, at)
    opening = with_call[head : at - len(XML_FUNCTION)].strip()
    closing = with_call[end + len(XML_FUNCTION_END) : tail].strip() if end >= 0 else ""
    return ToolCallFormat(opening, closing if opening else "", style="xml")


def _named_format(with_call: str, head: int, at: int, tail: int) -> ToolCallFormat:
    # the name first, then the arguments' JSON: [TOOL_CALLS]NAME[ARGS]{...}
    opening = with_call[head:at].strip()
    start = with_call.find("{", at)
    end = json_end(with_call, start) if start >= 0 else None
    if not opening or end is None:  # a bare name cannot be told from text
        return BARE_JSON
    closing = with_call[end:tail].strip() if end <= tail else ""
    return ToolCallFormat(opening, closing, style="named")


def _tag_start(text: str, i: int) -> int:
    """i, or where the tag it falls inside starts ("<" or "[" not closed before i)."""
    for left, right in ("<>", "[]"):
        at = text.rfind(left, 0, i)
        if at >= 0 and text.rfind(right, 0, i) < at and "\n" not in text[at:i]:
            return at
    return i


def _tag_end(text: str, i: int) -> int:
    """i, or where the tag it falls inside ends (a ">" or "]" before any "<" or "[")."""
    for left, right in ("<>", "[]"):
        close, opening = text.find(right, i), text.find(left, i)
        if close >= 0 and (opening < 0 or close < opening) and "\n" not in text[i:close]:
            return close + 1
    return i


def _arguments_key(call: str) -> str | None:
    """The key the rendered call's arguments ({"x": 1}) sit under, when the call is flat JSON."""
    try:
        value = json.loads(call)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict):
        return None
    return next((k for k, v in value.items() if k != "name" and v == {"x": 1}), None)


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def json_end(text: str, start: int = 0) -> int | None:
    """Index just past the JSON object or array opening at text[start]; None if incomplete."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def parse_calls(text: str, names: Collection[str], *, is_tagged: bool) -> list[ToolCall] | None:
    """The calls in one JSON value (an object or a list of them), None if it is not calls.

    Accepted: {"name", "arguments" | "parameters"}, {"function": {...}} and {"<a tool's name>":
    arguments}; arguments may be a JSON string. A bare (untagged) value must name its arguments,
    so plain JSON answers stay content; with `names`, only those tools count."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    items = value if isinstance(value, list) else [value]
    calls = [_call(item, names, is_tagged=is_tagged) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    return [c for c in calls if c is not None]


def _call(item: Any, names: Collection[str], *, is_tagged: bool) -> ToolCall | None:
    if isinstance(item, dict) and isinstance(item.get("function"), dict):
        item = item["function"]
    if isinstance(item, dict) and len(item) == 1 and next(iter(item)) in names:
        # {"get_weather": {...}}: a tool's name as the key of its arguments, as Ollama reads it
        ((name, args),) = item.items()
        item = {"name": name, "arguments": args}
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    has_args = "arguments" in item or "parameters" in item
    if (names and item["name"] not in names) or not (has_args or is_tagged):
        return None
    args = item.get("arguments", item.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return {"function": {"name": item["name"], "arguments": args}}


_SEPARATORS = " \t\r\n,]"  # between the calls of a run, and a list's end
_LEADING_TAG_MAX = 48  # the longest tag a bare-JSON model may write before its calls


def _ends_calls(rest: str, fmt: ToolCallFormat) -> bool:
    """Whether what follows a run of calls at the end of output is only its end: separators, or
    the start of the closing (whose end may be a token the model stops on: Nemotron's template
    writes its end of turn after </TOOLCALL>)."""
    trimmed = rest.strip()
    return not trimmed.lstrip(_SEPARATORS) or bool(fmt.closing.startswith(trimmed))


class _State(Enum):
    START = auto()  # only whitespace so far: bare JSON calls may start here
    LOOKING = auto()  # content, watching for the opening tag
    CALLING = auto()  # inside a run of calls (tags, JSON values, separators)
    DONE = auto()  # content only, to the end


class ToolCallParser:
    """Fed output pieces, returns (content, completed calls). Text that may start a call (a
    partial opening tag, leading whitespace, unfinished JSON) is held back until it is decided;
    a call that does not parse is given back as content.

    Bare JSON is tried only at the start of the output, as Ollama does for `{`/`[` formats;
    a tagged format takes its tag anywhere."""

    def __init__(self, fmt: ToolCallFormat = BARE_JSON, names: Collection[str] = ()) -> None:
        self.fmt = fmt
        self.names = frozenset(names)
        self._state = _State.START
        self._buffer = ""
        self._opened = ""  # the opening tag of a call not yet parsed, given back if none comes
        self._is_tagged_run = False  # the run of calls began with the opening tag
        self._count = 0

    def add(self, text: str) -> tuple[str, list[ToolCall]]:
        self._buffer += text
        content, calls = "", []
        while self._buffer:
            step = self._step()
            if step is None:
                break
            content += step[0]
            calls += step[1]
        return content, calls

    def flush(self) -> tuple[str, list[ToolCall]]:
        """At the end of output: everything held back, as content; but a call the end cut
        short, after a call or an opening tag, is no content (as Ollama's parser, whose
        Content() is empty once a call or a tag was found): a client asked for calls."""
        rest, self._buffer = self._buffer, ""
        if self._state == _State.CALLING and (
            self._count or self._is_tagged_run or (not self._opened and _ends_calls(rest, self.fmt))
        ):
            self._opened = ""
            return "", []
        rest, self._opened = self._opened + rest, ""
        return rest, []

    def _step(self) -> tuple[str, list[ToolCall]] | None:
        if self._state == _State.START:
            return self._start()
        if self._state == _State.LOOKING:
            return self._looking()
        if self._state == _State.CALLING:
            return self._calling()
        out, self._buffer = self._buffer, ""
        return out, []

    def _start(self) -> tuple[str, list[ToolCall]] | None:
        trimmed = self._buffer.lstrip()
        if not trimmed:
            return None
        if trimmed[0] in "{[":
            self._buffer, self._state = trimmed, _State.CALLING
        elif self.fmt.is_bare_json and "<|".startswith(trimmed[:2]):
            return self._leading_tag(trimmed)
        else:
            self._state = _State.DONE if self.fmt.is_bare_json else _State.LOOKING
        return "", []

    def _leading_tag(self, trimmed: str) -> tuple[str, list[ToolCall]] | None:
        """A bare-JSON model's output that opens with a tag before its JSON calls: Granite 3.3
        writes `<|tool_call|>[...]`, which its template names only in prose, never in a call it
        renders. The tag opens a run of calls; anything else after it is content."""
        end = trimmed.find("|>")
        rest = trimmed[end + 2 :].lstrip() if end >= 0 else ""
        if not rest and len(trimmed) < _LEADING_TAG_MAX:
            return None  # the tag, or what follows it, is still coming
        if end >= 0 and rest[:1] in ("{", "["):
            self._buffer, self._opened, self._state = rest, trimmed[: end + 2], _State.CALLING
            self._is_tagged_run = True
        else:
            self._state = _State.DONE
        return "", []

    def _looking(self) -> tuple[str, list[ToolCall]] | None:
        before, found, after = self._buffer.partition(self.fmt.opening)
        if found:
            self._buffer, self._opened, self._state = after, found, _State.CALLING
            self._is_tagged_run = True
            return before, []
        hold = partial_tag(before, self.fmt.opening)
        content, self._buffer = before[: len(before) - hold], before[len(before) - hold :]
        return (content, []) if content else None

    def _calling(self) -> tuple[str, list[ToolCall]] | None:
        buf = self._buffer
        rest = buf.lstrip(_SEPARATORS)
        spaced = buf.lstrip()  # a closing may begin with a separator (`]</TOOLCALL>`)
        tags = [t for t in (self.fmt.closing, self.fmt.opening) if t and not _is_bare(t)]
        for tag in tags:
            for text in (spaced, rest):
                if text.startswith(tag):
                    self._buffer = text[len(tag) :]
                    self._opened = tag if tag == self.fmt.opening else ""
                    self._is_tagged_run = self._is_tagged_run or bool(self._opened)
                    return "", []
        if not rest or any(t.startswith(rest) or t.startswith(spaced) for t in tags):
            return None  # separators or a partial tag: wait
        if rest[0] in "{[":
            return self._json(rest, skipped=buf[: len(buf) - len(rest)])
        # other text: the run of calls is over
        content, self._opened = self._opened, ""
        self._buffer = rest
        self._state = _State.DONE if self.fmt.is_bare_json else _State.LOOKING
        return content, []

    def _json(self, rest: str, *, skipped: str) -> tuple[str, list[ToolCall]] | None:
        end = json_end(rest)
        if end is None:
            return None
        calls = parse_calls(rest[:end], self.names, is_tagged=self._is_tagged_run)
        self._buffer = rest[end:]
        if calls is None:
            content, self._opened = self._opened + skipped + rest[:end], ""
            self._state = _State.DONE if self.fmt.is_bare_json else _State.LOOKING
            return content, []
        self._opened = ""
        for call in calls:
            call["function"] = {"index": self._count, **call["function"]}
            self._count += 1
        return "", calls
