"""tool_choice as a grammar: the llguidance Lark text that holds a model to tool calls in its own
format (ToolCallFormat), each call's arguments valid against its tool's JSON schema; and a
thinking model's format, held once its thinking ends (format_grammar).

"required" allows only calls (one with parallel_tool_calls false); "auto" leaves the output free
until the call format's opening, then holds the call to a tool and its schema (a lazy grammar).
Thinking, when the model thinks, stays free: the grammar begins after its closing tag. This module
only writes grammar text; the runner compiles it (ember.sample.grammar)."""

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import llguidance

from ember.sample.grammar import ANY_JSON_OBJECT, JSON_OPTIONS, closed_objects
from ember.server.api import ChatRequest, RequestError, Tool
from ember.server.thinking import ThinkingTags, prompt_opens
from ember.server.tools import ToolCallFormat

Mode = Literal["auto", "required"]
# the control tokens of the model's vocabulary, by text: a tag that is one (Mistral's
# [TOOL_CALLS]) is matched as that token, never as text, which a control token cannot be
Specials = Mapping[str, int]
_NONE: Specials = {}

# whitespace around tags and between calls: bounded, so a model cannot pad its output forever
SPACE = r"/[ \t\r\n]{0,4}/"
_CALL_SEPARATOR = r"/[ \t\r\n]{0,4}(,[ \t\r\n]{0,4})?/"  # between the bare calls of a run
_TEXT = r"/(.|\n)*/"
_OPENS_JSON = r"/[ \t\r\n]*[{\[](.|\n)*/"  # what the parser takes for bare calls


@dataclass(frozen=True, slots=True)
class Thinking:
    """The model's thinking tags, and whether the prompt already opened them (Qwen3)."""

    tags: ThinkingTags
    is_open: bool = False


def call_schema(tools: Sequence[Tool], arguments_key: str = "arguments") -> dict[str, Any]:
    """The JSON schema of one call to any of tools: {"name": <a tool>, <arguments_key>: ...}.

    Each tool's parameters sit in $defs, their local $refs ("#/$defs/X", "#") rebased there, so
    Pydantic's schemas keep working. Lenient: a keyword or format llguidance does not implement
    is not enforced, rather than failing the request."""
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t.function.name},
                arguments_key: {"$ref": f"#/$defs/{_def_name(i)}"},
            },
            "required": ["name", arguments_key],
            "additionalProperties": False,
        }
        for i, t in enumerate(tools)
    ]
    schema: dict[str, Any] = calls[0] if len(calls) == 1 else {"anyOf": calls}
    defs = {
        _def_name(i): _rebased(closed_objects(t.function.parameters or {"type": "object"}), i)
        for i, t in enumerate(tools)
    }
    return {**schema, "$defs": defs, "x-guidance": JSON_OPTIONS}


def arguments_schema(tool: Tool) -> dict[str, Any]:
    """The JSON schema of one tool's arguments alone (lenient as call_schema's)."""
    return {
        **closed_objects(tool.function.parameters or {"type": "object"}),
        "x-guidance": JSON_OPTIONS,
    }


def _def_name(index: int) -> str:
    return f"ember_tool_{index}"


def _rebased(schema: Any, index: int) -> Any:
    """schema with each local $ref ("#...") pointing into its place in the call's $defs."""
    if isinstance(schema, list):
        return [_rebased(s, index) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _rebased(v, index) for k, v in schema.items()}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        out["$ref"] = f"#/$defs/{_def_name(index)}{ref[1:]}"
    return out


def tool_grammar(
    tools: Sequence[Tool],
    fmt: ToolCallFormat,
    *,
    mode: Mode,
    parallel: bool = True,
    thinking: Thinking | None = None,
    specials: Specials = _NONE,
) -> str:
    """The Lark grammar of tool_choice `mode` over tools (at least one) in the format fmt."""
    if not tools:
        raise ValueError("a tool grammar needs at least one tool")
    calls = "bare_calls" if fmt.is_bare_json else "tagged_calls"
    tagged = _tagged_rules(fmt, parallel, specials)
    rules = [
        f"fn: %json {json.dumps(call_schema(tools, fmt.arguments_key))}",
        *(_bare_rules(parallel) if fmt.is_bare_json else tagged),
        f"SPACE: {SPACE}",
    ]
    if mode == "required":
        body = f"SPACE {calls} SPACE"
    elif fmt.is_bare_json:  # as the parser, bare calls count only at the start of the output
        body = f"PLAIN | SPACE {calls} SPACE"
        rules.append(r"PLAIN: /[ \t\r\n]*([^ \t\r\n{\[](.|\n)*)?/")
    else:
        # As the parser, an output that opens with JSON is a call even in a tagged format
        # (small models leave the tag out): held to a tool as a tagged one, nothing after it,
        # so text never opens with JSON here.
        leading = " | SPACE bare_calls SPACE"
        rules += _bare_rules(parallel)
        text = f"{_free(thinking, specials)} & ~{_OPENS_JSON}"
        if _is_special(fmt.opening, specials):  # free text, which the tag's token ends
            body = "TEXT | TEXT? tagged_calls SPACE" + leading
            rules.append(f"TEXT: {text}")
        else:  # free text; its first opening tag starts the calls (a lazy lexeme ends there)
            body = "TEXT | before_calls tagged_rest SPACE" + leading
            rules += [f"before_calls[suffix={_literal(fmt.opening)}]: TEXT", f"TEXT: {text}"]
    start = f"start: {_thinking(thinking, rules, specials)}({body})"
    return "\n".join([start, *rules]) + "\n"


def _tagged_rules(fmt: ToolCallFormat, parallel: bool, specials: Specials) -> list[str]:
    """A call between the tags; several calls: one list inside one pair of tags when the opening
    opens a list (Mistral's "[TOOL_CALLS] ["), else one pair of tags each (Qwen's <tool_call>)."""
    closing = f" SPACE {tag(fmt.closing, specials)}" if fmt.closing else ""
    is_list = fmt.opening.endswith("[")
    inner = 'fn (SPACE "," SPACE fn)*' if parallel and is_list else "fn"
    repeat = " (SPACE tagged_calls)?" if parallel and not is_list else ""
    return [
        f"tagged_calls: {tag(fmt.opening, specials)} tagged_rest",
        f"tagged_rest: SPACE {inner}{closing}{repeat}",
    ]


def _bare_rules(parallel: bool) -> list[str]:
    return [
        "bare_calls: fn (CALL_SEPARATOR fn)*" if parallel else "bare_calls: fn",
        f"CALL_SEPARATOR: {_CALL_SEPARATOR}",
    ]


def _free(thinking: Thinking | None, specials: Specials) -> str:
    """Free text; when the output may open thinking, text that does not open it: else the lazy
    end of the text at the opening tag would also end a thought that mentions the tag (text
    never holds a control token, so an opening that is one needs no exclusion)."""
    if thinking is None or thinking.is_open or _is_special(thinking.tags.opening, specials):
        return _TEXT
    opening = re.escape(thinking.tags.opening).replace("/", "\\/")
    return f"{_TEXT} & ~/[ \\t\\r\\n]*{opening}(.|\\n)*/"


def thinking_prefix(tags: ThinkingTags, rules: list[str], specials: Specials) -> str:
    """The start rule's prefix for free thinking in tags the prompt has not opened."""
    return _thinking(Thinking(tags), rules, specials)


def _thinking(thinking: Thinking | None, rules: list[str], specials: Specials) -> str:
    """The start rule's prefix for free thinking (and adds its rules), "" without thinking."""
    if thinking is None:
        return ""
    closing = thinking.tags.closing
    if _is_special(closing, specials):  # the thought's text ends at the closing's token
        rules += [f"thought: THOUGHT? {tag(closing, specials)}", f"THOUGHT: {_TEXT}"]
    else:
        rules.append(f"thought[suffix={_literal(closing)}]: {_TEXT}")
    if thinking.is_open:  # the prompt opened it: the output begins inside the thinking
        return "thought SPACE "
    rules.append(f"thinking: SPACE {tag(thinking.tags.opening, specials)} thought SPACE")
    return "thinking? "


def _literal(text: str) -> str:
    return json.dumps(text)  # a Lark string literal: JSON's escapes are Lark's


def _is_special(tag: str, specials: Specials) -> bool:
    """Whether the tag begins with a control token."""
    return any(tag.startswith(s) for s in _within(tag, specials))


def _within(text: str, specials: Specials) -> list[str]:
    return sorted((s for s in specials if s and s in text), key=len, reverse=True)


def tag(text: str, specials: Specials) -> str:
    """A tag in the grammar: its text, each control token in it as that token (`<[id]>`)."""
    found = _within(text, specials)
    if not found:
        return _literal(text)
    pieces: list[str] = []
    plain, i = "", 0
    while i < len(text):
        token = next((s for s in found if text.startswith(s, i)), None)
        if token is None:
            plain, i = plain + text[i], i + 1
            continue
        if plain:
            pieces.append(_literal(plain))
        pieces.append(f"<[{specials[token]}]>")
        plain, i = "", i + len(token)
    if plain:
        pieces.append(_literal(plain))
    return pieces[0] if len(pieces) == 1 else f"({' '.join(pieces)})"


def choice_mode(req: ChatRequest) -> Mode | None:
    """The grammar tool_choice asks for: "required" (also a named function, which chosen_tools
    has left alone), "auto", or None without tools. With a format, "auto" leaves the output to
    the format, and a forced call is a 400: the two grammars would contradict each other."""
    if not req.tools:
        return None
    mode: Mode = (
        "required" if req.tool_choice == "required" or isinstance(req.tool_choice, dict) else "auto"
    )
    if req.format is None:
        return mode
    if mode == "required":
        raise RequestError(
            'tool_choice "required" or a named function cannot be combined with a format '
            "(response_format): a forced tool call is not the format's JSON",
            "tool_choice",
        )
    return None


def chat_grammar(
    req: ChatRequest,
    fmt: ToolCallFormat,
    thinking: ThinkingTags | None,
    *,
    prompt: str,
    specials: Specials = _NONE,
) -> str | None:
    """The grammar of a chat request with tools (see choice_mode), None when it needs none.
    thinking: the tags of the model's thinking when the output may hold some."""
    mode = choice_mode(req)
    if mode is None:
        return None
    free = Thinking(thinking, prompt_opens(prompt, thinking)) if thinking else None
    parallel = req.parallel_tool_calls
    text = tool_grammar(
        req.tools, fmt, mode=mode, parallel=parallel, thinking=free, specials=specials
    )
    check(text)
    return text


def format_grammar(
    fmt: Any,
    tags: ThinkingTags,
    *,
    prompt: str,
    specials: Specials = _NONE,
    answer_opening: str = "",
) -> str | None:
    """A format (`format`, response_format) held after free thinking: the model thinks first,
    then its answer is the format's JSON (Ollama lets a thinking model think before it applies
    the format, by asking again; here one grammar does both). answer_opening: the tag the
    answer follows (gpt-oss's final channel). None for what only the runner's format takes (a
    regex or a Lark grammar: the Python API's)."""
    answer = json_answer(fmt)
    if answer is None:
        return None
    rules = [answer, f"SPACE: {SPACE}"]
    free = Thinking(tags, prompt_opens(prompt, tags))
    opening = f"{tag(answer_opening, specials)} " if answer_opening else ""
    start = f"start: {_thinking(free, rules, specials)}{opening}answer"
    text = "\n".join([start, *rules]) + "\n"
    check(text, field="format")
    return text


def json_answer(fmt: Any) -> str | None:
    """The rule `answer` of a format's JSON (as the runner's format holds it: closed objects,
    compact separators); None for a regex or Lark format, which only the runner takes."""
    schema = ANY_JSON_OBJECT if fmt == "json" else fmt
    if not isinstance(schema, dict) or (
        len(schema) == 1 and ("regex" in schema or "lark" in schema)
    ):
        return None
    return f"answer: %json {json.dumps({**closed_objects(schema), 'x-guidance': JSON_OPTIONS})}"


def check(grammar: str, *, field: str = "tools") -> None:
    """RequestError (400) naming the problem when llguidance cannot compile grammar (a tool's
    schema with an external $ref, say), before the runner is asked."""
    error = llguidance.LLMatcher.validate_grammar(llguidance.LLMatcher.grammar_from_lark(grammar))
    if error and not error.startswith("WARNING"):
        reason = re.sub(r"^at \d+\(\d+\): ", "", error.splitlines()[0])
        what = "the format" if field == "format" else "the tools' parameters"
        raise RequestError(f"{what} cannot be enforced: {reason}", field)
