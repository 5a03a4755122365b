"""Tool calls that write the tool's name before the arguments' JSON, as Mistral's newer templates
(`[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}`, with a `[CALL_ID]...` between them in some)
and Kimi K2's (`<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{...}`):
the opening (tools.py reads it from the template), the name up to the first character no name
holds, anything up to the arguments' `{`, the JSON object, then the template's closing if any.
A call that does not parse is given back as content."""

import json
import re

from ember.server.call_stream import CallStream, Step
from ember.server.tools import ToolCall, ToolCallFormat, json_end

_NAME = re.compile(r"[^\s:\[\]<>{}()\"',]+")
_BETWEEN = 64  # the most text between a name and its arguments ([CALL_ID] and an id, an index)


class NamedCallParser(CallStream):
    """Fed output pieces, returns (content, completed calls), as ToolCallParser does."""

    def __init__(self, fmt: ToolCallFormat) -> None:
        super().__init__(fmt.opening)
        self.fmt = fmt
        self._closing_due = False  # a call just ended: its closing may follow

    def flush(self) -> tuple[str, list[ToolCall]]:
        rest, self._buffer = self._buffer, ""
        if self._closing_due and self.fmt.closing.startswith(rest.strip()):
            return "", []  # a closing cut short
        if self._in_call:  # a call cut off: its text, as it came
            self._in_call = False
            return self._given_back(rest), []
        return rest, []

    def _content(self) -> Step:
        if self._closing_due:
            rest, closing = self._buffer.lstrip(), self.fmt.closing
            if closing.startswith(rest) and len(rest) < len(closing):
                return None  # all of it may be the closing: wait
            self._closing_due = False
            if rest.startswith(closing):
                self._buffer = rest[len(closing) :]
                return "", []
        return super()._content()

    def _call(self) -> Step:
        """A whole call once its JSON is complete; its text as content if it is not a call."""
        buf = self._buffer
        name = _NAME.match(buf)
        start = buf.find("{", name.end() if name else 0)
        if start < 0 and len(buf) <= _BETWEEN + (name.end() if name else 0):
            return None  # the arguments may yet come
        end = json_end(buf, start) if name and start >= 0 else None
        if name and start >= 0 and end is None:
            return None  # the arguments are still coming
        arguments = _object(buf[start:end]) if name and end is not None else None
        if not name or end is None or arguments is None or start - name.end() > _BETWEEN:
            self._in_call = False  # not a call after all
            return self._given_back(""), []
        self._buffer, self._in_call = buf[end:], False
        self._closing_due = bool(self.fmt.closing)
        return "", [self._numbered(name.group(), arguments)]


def _object(text: str) -> dict[str, object] | None:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
