"""Tool calls written as Qwen3-Coder writes them, read as Ollama's qwen3-coder parser reads them:

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Each parameter's text becomes a value of the type its tool's schema gives it (a number, a
boolean, JSON for arrays and objects; "null" is null), a string when the schema says nothing or
the text is not of that type. The opening and closing tags are the template's (tools.py reads
them); a call that does not parse is given back as content."""

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from ember.server.call_stream import CallStream, Step
from ember.server.tools import XML_FUNCTION, XML_FUNCTION_END, ToolCall, ToolCallFormat

_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|$)", re.DOTALL)
_ORDER = ("boolean", "integer", "number", "array", "object")  # most specific first, then string


class XmlCallParser(CallStream):
    """Fed output pieces, returns (content, completed calls), as ToolCallParser does. tools:
    each tool's name and its parameters' JSON schema (the "properties" object)."""

    def __init__(self, fmt: ToolCallFormat, tools: Mapping[str, Mapping[str, Any]]) -> None:
        super().__init__(fmt.opening or XML_FUNCTION)  # or no tags of its own around calls
        self.fmt = fmt
        self.tools = tools
        self._closing = fmt.closing or XML_FUNCTION_END

    def flush(self) -> tuple[str, list[ToolCall]]:
        """At the end of output: a call left open is parsed as it is, else given back."""
        rest, self._buffer = self._buffer, ""
        if not self._in_call:
            return rest, []
        self._in_call = False
        call = self._parse(rest)
        return ("", [call]) if call else (self._given_back(rest), [])

    def _call(self) -> Step:
        raw, found, after = self._buffer.partition(self._closing)
        if not found:
            return None
        self._in_call = False
        call = self._parse(raw)
        if call is None:
            self._buffer = after
            return self._given_back(raw + self._closing), []
        self._buffer = after.lstrip()  # as Ollama: nor is the space after it
        return "", [call]

    def _parse(self, raw: str) -> ToolCall | None:
        text = raw if self.fmt.opening else XML_FUNCTION + raw
        match = _FUNCTION.search(text)
        if match is None:
            return None
        name = match.group(1).strip()
        schema = self.tools.get(name) or {}
        arguments = {
            key.strip(): typed(_strip_newline(value), schema.get(key.strip()))
            for key, value in _PARAMETER.findall(match.group(2))
        }
        return self._numbered(name, arguments)


def _strip_newline(value: str) -> str:
    # one newline after the tag and one before the closing tag, as the template writes them
    return value.removeprefix("\n").removesuffix("\n")


def typed(text: str, schema: Any) -> Any:
    """text as the value schema's type(s) make it; the string itself where none fits."""
    if text.lower() == "null":
        return None
    types = _types(schema)
    for kind in _ORDER:
        if kind in types:
            value = _as(kind, text)
            if value is not None:
                return value
    if types == {"boolean"}:  # as Ollama's (and Qwen's own) parser
        return False
    return text


def _types(schema: Any) -> set[str]:
    if not isinstance(schema, Mapping):
        return set()
    found: set[str] = set()
    for option in [schema, *(schema.get("anyOf") or [])]:
        kind = option.get("type") if isinstance(option, Mapping) else None
        found.update([kind] if isinstance(kind, str) else kind if isinstance(kind, list) else [])
    return found


def _as(kind: str, text: str) -> Any:
    """text as kind, None when it is not one."""
    if kind == "boolean":
        return {"true": True, "false": False}.get(text.lower())
    if kind == "integer":
        return int(text) if re.fullmatch(r"[+-]?\d+", text) else None
    if kind == "number":
        try:
            number = float(text)
        except ValueError:
            return None
        if not math.isfinite(number):  # nan and inf are not JSON
            return None
        return int(number) if number.is_integer() else number
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, list if kind == "array" else dict) else None
