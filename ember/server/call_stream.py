"""The stream both text-written call formats share (xml_calls.py, named_calls.py): content up to
the call's opening tag, the space before the tag held back (it is not content when a call
follows, and is given back when none does), then the format's own reading of the call."""

from typing import Any

from ember.server.holdback import partial_tag, trailing_space
from ember.server.tools import ToolCall

Step = tuple[str, list[ToolCall]] | None  # (content, calls), or None: wait for more output


class CallStream:
    """Fed output pieces, returns (content, completed calls), as ToolCallParser does. A format
    reads a call in _call (None while it is undecided) and ends the output in flush."""

    def __init__(self, opening: str) -> None:
        self._opening = opening
        self._buffer = ""
        self._in_call = False
        self._space = ""  # the space before the open call's tag: content again if it fails
        self._count = 0

    def add(self, text: str) -> tuple[str, list[ToolCall]]:
        self._buffer += text
        content = ""
        calls: list[ToolCall] = []
        while True:
            step = self._call() if self._in_call else self._content()
            if step is None:
                return content, calls
            content += step[0]
            calls += step[1]

    def flush(self) -> tuple[str, list[ToolCall]]:
        raise NotImplementedError

    def _call(self) -> Step:
        raise NotImplementedError

    def _content(self) -> Step:
        before, found, after = self._buffer.partition(self._opening)
        if found:
            self._buffer, self._in_call = after, True
            self._space = before[len(before.rstrip()) :]
            return before.rstrip(), []
        hold = partial_tag(before, self._opening)
        hold += trailing_space(before[: len(before) - hold])
        content, self._buffer = before[: len(before) - hold], before[len(before) - hold :]
        return (content, []) if content else None

    def _given_back(self, text: str) -> str:
        """A call's text that was not a call, as content (with the space before its tag)."""
        return self._space + self._opening + text

    def _numbered(self, name: str, arguments: dict[str, Any]) -> ToolCall:
        call = {"function": {"index": self._count, "name": name, "arguments": arguments}}
        self._count += 1
        return call
