"""gpt-oss's output format, Harmony, read as Ollama reads it (its harmony parser): messages of
`<|start|>{header}<|message|>{text}<|end|>`, whose header names a role, a channel and sometimes
a recipient. The analysis channel is thinking; final (and commentary without a recipient) is
content; a message to `functions.NAME` is a call of tool NAME, its text the JSON arguments.

`<|return|>` and `<|call|>` end generation (the runner stops on them, so they never reach here);
`<|end|>` only ends a message. Tool names that are not TypeScript identifiers are renamed for the
template (HarmonyNames) and mapped back in the calls, as Ollama does."""

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ember.server import tool_grammar
from ember.server.api import Tool
from ember.server.holdback import partial_tag
from ember.server.output import Part, call_id
from ember.server.prompt import Message, Prompt
from ember.server.thinking import ThinkingTags

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN = "<|constrain|>"
FINAL = f"{START}assistant{CHANNEL}final{MESSAGE}"  # a final answer's opening
FAMILIES = ("gptoss", "gpt-oss")
_BUILTIN_TOOLS = ("browser.open", "browser.search", "browser.find", "python")


def uses_harmony(architecture: str, template: str | None) -> bool:
    """Ollama's rule: a gpt-oss model whose template writes Harmony's message tags."""
    return architecture in FAMILIES and START in (template or "") and END in (template or "")


class HarmonyNames:
    """Tool names as the template shows them (TypeScript identifiers, unique) and back."""

    def __init__(self, names: Iterable[str] = ()) -> None:
        self._to_harmony: dict[str, str] = {}
        self._to_user: dict[str, str] = {}
        for name in names:
            self.add(name)

    def add(self, name: str) -> str:
        if name in self._to_harmony:
            return self._to_harmony[name]
        harmony = name if name in _BUILTIN_TOOLS else self._unique(_identifier(name))
        self._to_harmony[name] = harmony
        self._to_user[harmony] = name
        return harmony

    def harmony(self, name: str) -> str:
        return self._to_harmony.get(name, name)

    def user(self, harmony: str) -> str:
        return self._to_user.get(harmony, harmony)

    def _unique(self, candidate: str) -> str:
        name, n = candidate, 2
        while name in self._to_user:
            name, n = f"{candidate}_{n}", n + 1
        return name


def _identifier(name: str) -> str:
    # spaces, dashes and dots become underscores; what is not a letter, digit, _ or $ goes
    out = "".join(
        "_" if c in " -." else c for c in name if c in " -._$" or c.isalpha() or c.isdigit()
    )
    if not out:
        return "unnamed"
    return "_" + out if out[0].isdigit() else out


def renamed(items: Sequence[dict[str, Any]], rename: Callable[[str], str]) -> list[dict[str, Any]]:
    """Tools or tool calls (template dicts) with each function's name as rename gives it."""
    out = []
    for item in items:
        if _named(item):
            function = item["function"]
            item = {**item, "function": {**function, "name": rename(function["name"])}}
        out.append(item)
    return out


def think_for_template(think: bool | str | None) -> bool | str | None:
    """The template's reasoning effort for a request's think: gpt-oss always reasons, so false
    asks for the least (its thinking is then left out of the answer), and "max" for "high" (as
    Ollama: Harmony knows low, medium and high)."""
    if think is False:
        return "low"
    return "high" if think == "max" else think


def chat_inputs(
    messages: Sequence[Message],
    tools: list[dict[str, Any]] | None,
    think: bool | str | None,
) -> tuple[list[Message], list[dict[str, Any]] | None, bool | str | None]:
    """A chat's messages, tools and think as a Harmony template takes them: tool names as
    identifiers (in the tools and in earlier calls alike), think as a reasoning effort."""
    names = HarmonyNames(t["function"]["name"] for t in tools or () if _named(t))
    if tools:
        tools = renamed(tools, names.add)
    messages = [
        replace(m, tool_calls=tuple(renamed(m.tool_calls, names.harmony))) if m.tool_calls else m
        for m in messages
    ]
    return messages, tools, think_for_template(think)


def _named(item: dict[str, Any]) -> bool:
    function = item.get("function")
    return isinstance(function, dict) and isinstance(function.get("name"), str)


ANALYSIS = ThinkingTags(f"{CHANNEL}analysis{MESSAGE}", f"{END}{START}assistant")


def format_grammar(fmt: Any, specials: Mapping[str, int]) -> str | None:
    """A format after gpt-oss's analysis: the analysis message stays free, then the final
    message's text is the format's JSON (the prompt ends by opening the assistant's message)."""
    final = FINAL.removeprefix(f"{START}assistant")
    return tool_grammar.format_grammar(
        fmt, ANALYSIS, prompt="", specials=specials, answer_opening=final
    )


def call_grammar(
    tools: Sequence[Tool],
    names: HarmonyNames,
    specials: Mapping[str, int],
    *,
    analysis: bool = True,
) -> str:
    """A forced call (tool_choice "required" or a named function): the analysis free (unless
    analysis is False: think false), then one message to `functions.NAME` of a tool,
    `<|constrain|>json`, and arguments valid against its schema; <|call|> (an end of generation)
    follows."""
    rules = [f"SPACE: {tool_grammar.SPACE}"]
    start = tool_grammar.thinking_prefix(ANALYSIS, rules, specials) if analysis else ""
    calls = []
    for i, tool in enumerate(tools):
        name = names.harmony(tool.function.name)
        header = f"{CHANNEL}commentary to=functions.{name} {CONSTRAIN}json{MESSAGE}"
        calls.append(f"{tool_grammar.tag(header, specials)} args_{i}")
        rules.append(f"args_{i}: %json {json.dumps(tool_grammar.arguments_schema(tool))}")
    text = "\n".join([f"start: {start}({' | '.join(calls)})", *rules]) + "\n"
    tool_grammar.check(text)
    return text


def answering(prompt: Prompt) -> Prompt:
    """The prompt with the final answer's channel opened (for a format without thinking, which
    holds the whole output to its JSON: the answer comes without the analysis)."""
    if prefill(prompt.text) != f"{START}assistant":
        return prompt
    return replace(prompt, text=prompt.text + FINAL.removeprefix(f"{START}assistant"))


def prefill(prompt: str) -> str:
    """Where the prompt leaves the output: inside the header it opened at its last <|start|>
    (`<|start|>assistant`), or in the text of the message it opened (up to its <|message|>, as
    a continued final answer), or outside any message ("")."""
    at = prompt.rfind(START)
    if at < 0:
        return ""
    tail = prompt[at:]
    if END in tail:
        return ""
    body = tail.find(MESSAGE)
    return tail if body < 0 else tail[: body + len(MESSAGE)]


class HarmonyParser:
    """Output pieces to thinking, content and tool calls (OutputParser's interface). The prompt
    ended by opening an assistant message (`<|start|>assistant`), or inside one it continues
    (prefill: FINAL, or the analysis channel's opening). thinking False drops the analysis: the
    request asked for none, and gpt-oss cannot leave it out."""

    def __init__(
        self,
        names: HarmonyNames | None = None,
        *,
        prefill: str = f"{START}assistant",
        thinking: bool = True,
    ) -> None:
        self._names = names or HarmonyNames()
        self._keep_thinking = thinking
        self._acc = prefill
        self._in_header = False
        self._in_message = False
        self._channel = ""  # of the message being read: "thinking", "content" or "call"
        self._call_text: list[str] = []
        self._call_name = ""

    def add(self, text: str) -> Part:
        self._acc += text
        part = Part()
        while self._step(part):
            pass
        return part

    def flush(self) -> Part:
        part = Part()
        if self._in_message and self._acc:  # a message cut off by EOS or a limit
            self._emit(part, self._acc)
        self._acc = ""
        if self._call_name:
            self._finish_call(part)
        return part

    def _step(self, part: Part) -> bool:
        """One state change, or the text that is safe to emit; whether to go on."""
        if self._in_message:
            at = self._acc.find(END)
            if at >= 0:
                self._emit(part, self._acc[:at])
                self._acc = self._acc[at + len(END) :]
                self._in_message = False
                return True
            keep = partial_tag(self._acc, END)
            self._emit(part, self._acc[: len(self._acc) - keep])
            self._acc = self._acc[len(self._acc) - keep :]
            return False
        if self._in_header:
            at = self._acc.find(MESSAGE)
            if at < 0:
                return False
            self._open(self._acc[:at])
            self._acc = self._acc[at + len(MESSAGE) :]
            self._in_header, self._in_message = False, True
            return True
        at = self._acc.find(START)
        if at < 0:
            return False
        self._acc = self._acc[at + len(START) :]  # text outside a message is dropped
        self._in_header = True
        return True

    def _open(self, raw: str) -> None:
        channel, recipient = _header(raw)
        if recipient and channel in ("analysis", "commentary"):
            self._channel = "call"
            if self._call_name:  # one call a generation; a second one replaces it
                self._call_text = []
            self._call_name = recipient
        elif channel == "analysis":
            self._channel = "thinking"
        else:
            self._channel = "content"

    def _emit(self, part: Part, text: str) -> None:
        if not text:
            return
        if self._channel == "thinking":
            if self._keep_thinking:
                part.thinking += text
        elif self._channel == "call":
            self._call_text.append(text)
        else:
            part.content += text

    def _finish_call(self, part: Part) -> None:
        name = self._names.user(self._call_name.removeprefix("functions."))
        raw = "".join(self._call_text)
        self._call_name, self._call_text = "", []
        try:
            arguments = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):  # not a call's arguments: the text stays the answer's
            part.content += raw
            return
        call = {"name": name, "arguments": arguments}
        part.tool_calls.append({"id": call_id(), "function": call})


def _header(raw: str) -> tuple[str, str]:
    """(channel, recipient) of a header such as `assistant<|channel|>commentary to=functions.f
    <|constrain|>json` or `assistant to=functions.f<|channel|>commentary json`."""
    channel = ""
    match = re.search(re.escape(CHANNEL) + r"(\S*?)(?=\s|<\||$)", raw)
    if match:
        channel = match.group(1)
        raw = raw[: match.start()] + " " + raw[match.end() :]
    recipient = ""
    for word in raw.replace("<|constrain|>", " ").split():
        if word.startswith("to="):
            recipient = word[3:]
            break
    return channel, recipient
