"""Model output as the API returns it: the runner's text pieces split into thinking, content and
tool calls (with server-made call ids), and its logprobs in Ollama's form."""

import secrets
import string
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ember.server.named_calls import NamedCallParser
from ember.server.thinking import ThinkingParser, ThinkingTags
from ember.server.tools import ToolCallFormat, ToolCallParser
from ember.server.xml_calls import XmlCallParser

_ID_CHARS = string.ascii_lowercase + string.digits


@dataclass(slots=True)
class Part:
    content: str = ""
    thinking: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.thinking or self.tool_calls)


def call_id() -> str:
    """A tool call id as Ollama makes them: call_ and 8 random characters."""
    return "call_" + "".join(secrets.choice(_ID_CHARS) for _ in range(8))


class Parser(Protocol):
    """Model output, piece by piece, as the API's parts."""

    def add(self, text: str) -> Part: ...

    def flush(self) -> Part: ...


class OutputParser:
    """Feeds pieces through the thinking parser (when the model thinks) and then the tool call
    parser (when the request has tools)."""

    def __init__(
        self,
        *,
        thinking: ThinkingTags | None = None,
        prompt: str = "",
        tools: ToolCallFormat | None = None,
        tool_names: Collection[str] = (),
        tool_params: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """tool_params: each tool's parameters (their JSON schemas by name), which type the
        arguments of a format that writes them as text (xml_calls.py)."""
        self._thinking = ThinkingParser(thinking, prompt=prompt) if thinking else None
        self._tools: ToolCallParser | XmlCallParser | NamedCallParser | None = None
        if tools is not None and tools.style == "xml":
            self._tools = XmlCallParser(tools, tool_params or {})
        elif tools is not None and tools.style == "named":
            self._tools = NamedCallParser(tools)
        elif tools is not None:
            self._tools = ToolCallParser(tools, tool_names)

    def add(self, text: str) -> Part:
        thinking, content = self._thinking.add(text) if self._thinking else ("", text)
        return self._content(thinking, content, final=False)

    def flush(self) -> Part:
        thinking, content = self._thinking.flush() if self._thinking else ("", "")
        return self._content(thinking, content, final=True)

    def _content(self, thinking: str, content: str, *, final: bool) -> Part:
        if self._tools is None:
            return Part(content, thinking)
        text, calls = self._tools.add(content) if content else ("", [])
        if final:
            rest, more = self._tools.flush()
            text, calls = text + rest, calls + more
        return Part(text, thinking, [{"id": call_id(), **call} for call in calls])


def logprobs(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The runner's logprob records in Ollama's form (with each token's UTF-8 bytes)."""
    out = []
    for lp in records:
        entry: dict[str, Any] = _token(lp["token"], lp["logprob"])
        top = lp.get("top_logprobs") or []
        if top:
            entry["top_logprobs"] = [_token(t["token"], t["logprob"]) for t in top]
        out.append(entry)
    return out


def _token(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}
