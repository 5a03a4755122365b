"""The Modelfile: parsed rune by rune as Ollama's parser/parser.go, typed PARAMETER values, and
a stored model written back as Modelfile text (for /api/show).

Parsing only checks syntax; what a create can do with the commands is create.py's business.
"""

import codecs
import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any

from ember.options import Options
from ember.store.errors import ModelfileError
from ember.store.models import StoredModel

COMMANDS = frozenset(
    {"from", "license", "template", "system", "adapter", "draft", "renderer", "parser"}
    | {"parameter", "message", "requires"}
)
ROLES = ("system", "user", "assistant")
# Accepted by Ollama with a warning and ignored (parser.go deprecatedParameters).
DEPRECATED_PARAMETERS = frozenset(
    {"penalize_newline", "low_vram", "f16_kv", "logits_all", "vocab_only", "use_mlock"}
    | {"mirostat", "mirostat_tau", "mirostat_eta"}
)


@dataclass(frozen=True, slots=True)
class Command:
    """One instruction: `name` is "model" for FROM, the lower-cased command otherwise, or a
    PARAMETER's name; a MESSAGE's args are "role: text" (as Ollama)."""

    name: str
    args: str

    def __str__(self) -> str:
        if self.name == "model":
            return f"FROM {self.args}"
        if self.name == "message":
            role, _, text = self.args.partition(": ")
            return f"MESSAGE {role} {quote(text)}"
        if self.name in COMMANDS:
            return f"{self.name.upper()} {quote(self.args)}"
        return f"PARAMETER {self.name} {quote(self.args)}"


class _State(Enum):
    NIL = auto()
    NAME = auto()
    VALUE = auto()
    PARAMETER = auto()
    MESSAGE = auto()
    COMMENT = auto()


def parse_modelfile(source: str | bytes) -> list[Command]:
    """The commands of a Modelfile; raises ModelfileError (with the line) on a syntax error."""
    parser = _Parser()
    for char in decode(source):
        parser.feed(char)
    commands = parser.finish()
    if not any(c.name == "model" for c in commands):
        raise ModelfileError("no FROM line")
    return commands


def decode(source: str | bytes) -> str:
    """Text of a Modelfile: UTF-8, or UTF-16 with a byte order mark (as Ollama reads it)."""
    if isinstance(source, str):
        return source.removeprefix("\ufeff")
    if source.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return source.decode("utf-16", "replace")
    return source.removeprefix(codecs.BOM_UTF8).decode("utf-8", "replace")


class _Parser:
    """The state machine of Ollama's ParseFile, one character at a time."""

    def __init__(self) -> None:
        self.state = _State.NIL
        self.buf: list[str] = []
        self.name = ""
        self.role = ""
        self.line = 1
        self.commands: list[Command] = []

    def feed(self, char: str) -> None:
        self._feed(char)
        if char == "\n":  # after it: an error at a line's end is that line's (CRLF counts once)
            self.line += 1

    def _feed(self, char: str) -> None:
        nxt, keep = self._next(char)
        if nxt != self.state:
            entered = self._leave(nxt, char)
            if entered is None:  # the value goes on: a space, or an open quote
                self.buf.append(char)
                return
            self.buf.clear()
            self.state = entered
        if keep and char.isprintable():
            self.buf.append(char)

    def _next(self, char: str) -> tuple[_State, bool]:
        """(next state, whether the character belongs to the text being read)."""
        space, newline = char in " \t", char in "\r\n"
        state = self.state
        if state is _State.NIL:
            if char == "#":
                return _State.COMMENT, False
            return (_State.NIL, False) if space or newline else (_State.NAME, True)
        if state is _State.COMMENT:
            return (_State.NIL if newline else _State.COMMENT), False
        if state is _State.VALUE:
            return (_State.NIL if space or newline else _State.VALUE), True
        if space:
            return _State.VALUE, False
        if char.isascii() and (char.isalpha() or (state is _State.PARAMETER and _word(char))):
            return state, True
        raise self._bad_word(char)

    def _bad_word(self, char: str) -> ModelfileError:
        word = "".join(self.buf)
        if char in "\r\n" and (self.state is not _State.NAME or word.lower() in COMMANDS):
            return ModelfileError(f"{self._command_text(word)} needs a value", self.line)
        if self.state is _State.NAME:
            return ModelfileError(_invalid_command(), self.line)
        what = "parameter name" if self.state is _State.PARAMETER else "message role"
        return ModelfileError(f"unexpected {char!r} in the {what} {word!r}", self.line)

    def _command_text(self, word: str) -> str:
        if self.state is _State.PARAMETER:
            return f"PARAMETER {word}"
        if self.state is _State.MESSAGE:
            return f"MESSAGE {word}"
        return word.upper()

    def _leave(self, nxt: _State, char: str) -> _State | None:
        """Acts on the end of the current state; returns the state to enter (None: stay)."""
        word = "".join(self.buf)
        if self.state is _State.NAME:
            if word.lower() not in COMMANDS:
                raise ModelfileError(_invalid_command(), self.line)
            command = word.lower()
            self.name = "model" if command == "from" else command
            if command == "parameter":
                return _State.PARAMETER
            if command == "message":
                return _State.MESSAGE
        elif self.state is _State.PARAMETER:
            self.name = word
        elif self.state is _State.MESSAGE:
            if word not in ROLES:
                raise ModelfileError(_invalid_role(), self.line)
            self.role = word
        elif self.state is _State.VALUE:
            value = unquote(word.strip())
            if value is None or char in " \t":
                return None
            self._emit(value)
        return nxt

    def _emit(self, value: str) -> None:
        if self.role:
            value, self.role = f"{self.role}: {value}", ""
        self.commands.append(Command(self.name, value))

    def finish(self) -> list[Command]:
        if self.state is _State.VALUE:
            value = unquote("".join(self.buf).strip())
            if value is None:
                raise ModelfileError("unexpected end of the Modelfile in a quoted value")
            self._emit(value)
        elif self.state not in (_State.NIL, _State.COMMENT):
            word = self._command_text("".join(self.buf))
            raise ModelfileError(f"unexpected end of the Modelfile: {word} needs a value")
        return self.commands


def _word(char: str) -> bool:
    return char.isalnum() or char == "_"


def _invalid_command() -> str:
    names = ", ".join(f'"{c}"' for c in sorted(COMMANDS))
    return f"command must be one of {names}"


def _invalid_role() -> str:
    return 'message role must be one of "system", "user", or "assistant"'


def unquote(text: str) -> str | None:
    """A value without its `"` or `\"\"\"` quotes; None while a quote is still open."""
    if text.startswith('"""'):
        return text[3:-3] if len(text) >= 6 and text.endswith('"""') else None
    if text.startswith('"'):
        return text[1:-1] if len(text) >= 2 and text.endswith('"') else None
    return text


def quote(text: str) -> str:
    """As Ollama's quote, plus quoting empty values and values that begin with a quote, so
    that every string survives a round trip through the parser."""
    if "\n" in text or text.startswith((" ", '"')) or text.endswith(" ") or not text:
        return f'"""{text}"""' if '"' in text else f'"{text}"'
    return text


# ---------------------------------------------------------------- typed parameters

_INT = re.compile(r"[+-]?[0-9]+")
_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")


def parameter_types() -> dict[str, Any]:
    """Option name -> type: Ember's Options fields, plus Ollama's GPU and mmap options (kept so
    that Modelfiles written for Ollama still create; the engine ignores them)."""
    types: dict[str, Any] = {f.name: f.type for f in dataclasses.fields(Options)}
    types.update(num_gpu=int, main_gpu=int, use_mmap=bool)
    return types


def typed_parameter(name: str, text: str) -> int | float | bool | str:
    """A PARAMETER value typed as Ollama's api.FormatParams types it (stop stays a string)."""
    kind = parameter_types().get(name)
    if kind is None:
        raise ModelfileError(f"unknown parameter '{name}'")
    if kind is int:
        if not _INT.fullmatch(text):
            raise ModelfileError(f"invalid int value {text!r} for parameter '{name}'")
        return int(text)
    if kind is float:
        try:
            if "_" in text or text != text.strip():
                raise ValueError
            return float(text)
        except ValueError:
            raise ModelfileError(f"invalid float value {text!r} for parameter '{name}'") from None
    if kind is bool:
        if text not in _TRUE + _FALSE:
            raise ModelfileError(f"invalid bool value {text!r} for parameter '{name}'")
        return text in _TRUE
    return text


def collect_parameters(commands: Iterable[Command]) -> dict[str, Any]:
    """The typed PARAMETERs of a Modelfile; `stop` collects a list, deprecated names drop."""
    params: dict[str, Any] = {}
    for command in commands:
        if command.name in COMMANDS or command.name in ("model", "message"):
            continue
        if command.name in DEPRECATED_PARAMETERS:
            continue
        value = typed_parameter(command.name, command.args)
        if command.name == "stop":
            params.setdefault("stop", []).append(value)
        else:
            params[command.name] = value
    return params


# ---------------------------------------------------------------- writing a model back


def render_modelfile(model: StoredModel) -> str:
    """The Modelfile of a stored model, as /api/show's `modelfile` (FROM names the blob)."""
    short = model.name.display_shortest()
    head = (
        '# Modelfile generated by "ember show"\n'
        "# To build a new Modelfile based on this, replace FROM with:\n"
        f"# FROM {short}\n\n"
    )
    return head + "".join(f"{c}\n" for c in model_commands(model))


def model_commands(model: StoredModel) -> list[Command]:
    """The commands that recreate `model`, in Ollama's order."""
    commands = [Command("model", str(model.model_path or model.name.display_shortest()))]
    commands += [Command("adapter", str(p)) for p in model.adapter_paths]
    commands += [Command("model", str(p)) for p in model.projector_paths]
    if model.template is not None:
        commands.append(Command("template", model.template))
    if model.system:
        commands.append(Command("system", model.system))
    for key in ("renderer", "parser", "draft"):
        if isinstance(model.config.get(key), str) and model.config[key]:
            commands.append(Command(key, model.config[key]))
    for name, value in sorted(model.parameters.items()):
        for item in value if isinstance(value, list) else [value]:
            commands.append(Command(name, _go_value(item)))
    commands += [Command("license", text) for text in model.license]
    commands += [Command("message", f"{m['role']}: {m['content']}") for m in model.messages]
    return commands


def format_parameters(params: Mapping[str, Any]) -> str:
    """/api/show's `parameters`: one `name value` line per value, the name padded to 30."""
    lines = []
    for name, value in sorted(params.items()):
        for item in value if isinstance(value, list) else [value]:
            # a string as Go's %#v quotes it: printable Unicode as itself, not \u escapes
            quoted = json.dumps(item, ensure_ascii=False) if isinstance(item, str) else None
            shown = quoted or _go_value(item)
            lines.append(f"{name:<30} {shown}")
    return "\n".join(lines)


def _go_value(value: Any) -> str:
    """A value as Go's %v prints it: whole floats without `.0`, booleans lower-case."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
