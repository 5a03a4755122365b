"""Go's text/template, the part of it Ollama's prompt templates use: Modelfile TEMPLATEs and a
request's `template` are written in it ("{{ .Prompt }}", "{{ range .Messages }}").

Actions `{{ }}` with the trim markers `{{- ` and ` -}}` and comments; if / else if / else, range
(over lists and maps, with `$i, $v :=`, else, break, continue), with; variables (`$x :=`, `$x
=`, `$`); pipelines (`a | f b`) and parenthesized ones; fields of maps (`.Messages`, `$m.Role`,
`(index .Messages 0).Content`); Go's builtins and, or, not, len, index, slice, eq, ne, lt, le,
gt, ge, print, printf, println; and Ollama's json, currentDate, yesterdayDate,
toTypeScriptType. `define`, `template` and `block` are refused (no recursion), and FUEL bounds the
work an untrusted template may do, as minijinja's fuel does for Jinja.

Data are Python dicts, lists, strings and numbers. A missing map key is nil (Ollama parses with
missingkey=zero) and nil prints "<no value>", as in Go; a `GoStruct` prints as the JSON its
`json` holds (Ollama's tool types print their JSON)."""

import datetime
import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from ember.errors import EmberError

FUEL = 2_000_000  # nodes, commands and loop turns one render may take
MAX_OUTPUT = 64 << 20  # bytes of text one render may write

_KEYWORDS = frozenset(
    ("if", "else", "end", "range", "with", "break", "continue", "define", "template", "block")
)
_SPACE = " \t\r\n"


class GoTemplateError(EmberError):
    """A Go template that does not parse or fails to render."""


class GoMap(dict[str, Any]):
    """A Go map that prints as its JSON (Ollama's tool-call arguments and tool properties)."""

    def __init__(self, fields: dict[str, Any], json_text: str) -> None:
        super().__init__(fields)
        self.json = json_text


class GoStruct(GoMap):
    """A Go struct (its fields as a dict) that prints as its JSON, as Ollama's tool types do:
    true even when empty, and no range over it."""


class GoList(list[Any]):
    """A Go slice that prints as its JSON (Ollama's tools)."""

    def __init__(self, items: list[Any], json_text: str) -> None:
        super().__init__(items)
        self.json = json_text


# ---------------------------------------------------------------- lexing


@dataclass(slots=True)
class _Token:
    kind: str  # field, var, dot, str, num, bool, nil, ident, ( ) | , := =, chain (".A" after ")")
    value: Any = None
    fields: tuple[str, ...] = ()  # a field's or variable's chain of names


_TOKEN = re.compile(
    r"""(?P<str>"(?:[^"\\\n]|\\.)*")
    | (?P<raw>`[^`]*`)
    | (?P<char>'(?:[^'\\\n]|\\[^'\n]+)')
    | (?P<punct>:=|[()|,=])
    | (?P<var>\$(?:[A-Za-z_]\w*)?(?:\.[A-Za-z_]\w*)*)
    | (?P<field>(?:\.[A-Za-z_]\w*)+)
    | (?P<num>[+-]?(?:0[xX][0-9a-fA-F_]+|(?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)(?:[eE][+-]?\d+)?))
    | (?P<dot>\.)
    | (?P<word>[A-Za-z_]\w*)""",
    re.X,
)


def _go_string(body: str) -> str:
    """A Go double-quoted string literal's value (body without the quotes)."""
    try:
        return json.loads('"' + body + '"')
    except ValueError:
        try:
            return body.encode("latin-1", "backslashreplace").decode("unicode_escape")
        except ValueError:
            raise GoTemplateError(f"bad string literal: {body[:40]!r}") from None


def _token(kind: str, text: str, after_paren: bool) -> _Token:
    if kind == "str":
        return _Token("str", _go_string(text[1:-1]))
    if kind == "raw":
        return _Token("str", text[1:-1])
    if kind == "char":
        return _Token("num", ord(_go_string(text[1:-1].replace('"', '\\"'))[:1] or "\0"))
    if kind == "punct":
        return _Token(text)
    if kind == "var":
        name, *fields = text.split(".")
        return _Token("var", name, tuple(fields))
    if kind == "field":  # right after a ")": fields of the parenthesized pipeline's value
        return _Token("chain" if after_paren else "field", None, tuple(text[1:].split(".")))
    if kind == "num":
        return _Token("num", _number(text))
    if kind == "dot":
        return _Token("dot")
    if text in ("true", "false"):
        return _Token("bool", text == "true")
    return _Token("nil") if text == "nil" else _Token("ident", text)


def _lex_action(text: str, at: int) -> tuple[list[_Token], int, bool]:
    """The tokens of the action whose inside starts at `at`; returns them, the position after
    its `}}`, and whether it ends with the ` -}}` trim marker."""
    tokens: list[_Token] = []
    i, n = at, len(text)
    while True:
        while i < n and text[i] in _SPACE:
            i += 1
        if i >= n:
            raise GoTemplateError("unclosed action")
        if text.startswith("}}", i):
            return tokens, i + 2, False
        if text.startswith("-}}", i) and i > at and text[i - 1] in _SPACE:
            return tokens, i + 3, True
        m = _TOKEN.match(text, i)
        if not m or m.lastgroup is None:
            raise GoTemplateError(f"unexpected {text[i : i + 12]!r} in action")
        after_paren = i > 0 and text[i - 1] == ")" and bool(tokens) and tokens[-1].kind == ")"
        tokens.append(_token(m.lastgroup, m.group(), after_paren))
        i = m.end()


def _number(s: str) -> int | float:
    s = s.replace("_", "")
    try:
        return int(s, 0)
    except ValueError:
        return float(s)


_COMMENT_OPENING = re.compile(r"\s*/\*")
_COMMENT_CLOSING = re.compile(r"\*/(\s-)?\}\}")


def _comment_end(source: str, at: int) -> tuple[int, bool]:
    """The position after the comment whose text starts at `at`, and whether it trims after."""
    end = source.find("*/", at)
    closing = _COMMENT_CLOSING.match(source, end) if end >= 0 else None
    if closing is None:
        raise GoTemplateError("unclosed comment")
    return closing.end(), closing.group(1) is not None


def _lex(source: str) -> Iterator[tuple[str, Any]]:
    """("text", str) and ("action", tokens) items, trim markers applied to the text."""
    i, n = 0, len(source)
    trim_next = False
    while i < n:
        j = source.find("{{", i)
        text = source[i:] if j < 0 else source[i:j]
        if trim_next:
            text = text.lstrip(_SPACE)
        if j < 0:
            if text:
                yield "text", text
            return
        inside = j + 2
        trim_before = source.startswith("- ", inside) or (
            source.startswith("-", inside) and inside + 1 < n and source[inside + 1] in _SPACE
        )
        if trim_before:
            text = text.rstrip(_SPACE)
            inside += 1
        if text:
            yield "text", text
        opening = _COMMENT_OPENING.match(source, inside)
        if opening:  # {{/* ... */}}, whose closing may trim too
            i, trim_next = _comment_end(source, opening.end())
            continue
        tokens, i, trim_next = _lex_action(source, inside)
        yield "action", tokens


# ---------------------------------------------------------------- parsing


@dataclass(slots=True)
class _Command:
    args: list[Any]  # operands: _Token, or _Pipe for a parenthesized pipeline


@dataclass(slots=True)
class _Pipe:
    decl: list[str] = field(default_factory=list)  # variables declared (:=) or assigned (=)
    assign: bool = False
    cmds: list[_Command] = field(default_factory=list)
    chain: tuple[str, ...] = ()  # fields taken of a parenthesized pipeline's value


@dataclass(frozen=True, slots=True)
class _Jump:
    kind: str  # break, continue


@dataclass(slots=True)
class _Branch:
    kind: str  # if, range, with
    pipe: _Pipe
    body: list[Any]
    orelse: list[Any] = field(default_factory=list)


class _Parser:
    def __init__(self, source: str) -> None:
        self.items = list(_lex(source))
        self.at = 0

    def parse(self) -> list[Any]:
        nodes, stop = self.list_until()
        if stop is not None:
            raise GoTemplateError(f"unexpected {{{{{stop[0]}}}}}")
        return nodes

    def list_until(self) -> tuple[list[Any], tuple[str, list[_Token]] | None]:
        """Nodes up to an `else` or `end` (returned with its tokens), or the end of input."""
        nodes: list[Any] = []
        while self.at < len(self.items):
            kind, value = self.items[self.at]
            self.at += 1
            if kind == "text":
                nodes.append(value)
                continue
            tokens: list[_Token] = value
            if not tokens:
                raise GoTemplateError("missing value for command")
            head = tokens[0]
            word = head.value if head.kind == "ident" and head.value in _KEYWORDS else None
            if word in ("else", "end"):
                return nodes, (word, tokens[1:])
            if word in ("if", "range", "with"):
                nodes.append(self.branch(word, tokens[1:]))
            elif word in ("break", "continue"):
                nodes.append(_Jump(word))
            elif word is not None:
                raise GoTemplateError(f"{{{{{word}}}}} is not supported")
            else:
                nodes.append(_pipe(tokens, declare=True))
        return nodes, None

    def branch(self, kind: str, tokens: list[_Token]) -> _Branch:
        node = _Branch(kind, _pipe(tokens, declare=True, range_vars=kind == "range"), [])
        node.body, stop = self.list_until()
        if stop is None:
            raise GoTemplateError(f"unexpected EOF: {{{{{kind}}}}} without {{{{end}}}}")
        word, rest = stop
        if word == "else":
            if rest and rest[0].kind == "ident" and rest[0].value in ("if", "with"):
                # else if / else with: a branch in the else list, closed by the same end
                node.orelse = [self.branch(rest[0].value, rest[1:])]
                return node
            if rest:
                raise GoTemplateError("unexpected tokens after else")
            node.orelse, stop = self.list_until()
            if stop is None or stop[0] != "end":
                raise GoTemplateError(f"expected {{{{end}}}} after {{{{else}}}} of {kind}")
        return node


def _pipe(tokens: list[_Token], *, declare: bool = False, range_vars: bool = False) -> _Pipe:
    pipe = _Pipe()
    i = 0

    def plain_var(j: int) -> bool:
        return j < len(tokens) and tokens[j].kind == "var" and not tokens[j].fields

    if declare and plain_var(0) and len(tokens) > 1 and tokens[1].kind in (":=", "="):
        pipe.decl, pipe.assign, i = [tokens[0].value], tokens[1].kind == "=", 2
    elif (  # range $i, $v := ...
        declare
        and range_vars
        and plain_var(0)
        and len(tokens) > 3
        and tokens[1].kind == ","
        and plain_var(2)
        and tokens[3].kind == ":="
    ):
        pipe.decl, i = [tokens[0].value, tokens[2].value], 4
    operands, rest = _operands(tokens[i:])
    if rest:
        raise GoTemplateError("unexpected ')'")
    pipe.cmds = operands
    if not pipe.cmds:
        raise GoTemplateError("missing value for command")
    return pipe


def _operands(tokens: list[_Token]) -> tuple[list[_Command], list[_Token]]:
    """Commands of a pipeline up to an unmatched ')' (returned with what follows it)."""
    cmds: list[_Command] = []
    args: list[Any] = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        i += 1
        if t.kind == ")":
            return _commands(cmds, args), tokens[i - 1 :]
        if t.kind == "|":
            if not args:
                raise GoTemplateError("missing command before '|'")
            cmds, args = [*cmds, _Command(args)], []
        elif t.kind == "(":
            sub, i = _parenthesized(tokens, i)
            args.append(sub)
        elif t.kind in ("field", "var", "dot", "str", "num", "bool", "nil", "ident"):
            args.append(t)
        else:
            raise GoTemplateError(f"unexpected {t.kind!r} in operand")
    return _commands(cmds, args), []


def _commands(cmds: list[_Command], args: list[Any]) -> list[_Command]:
    if args:
        return [*cmds, _Command(args)]
    if cmds:
        raise GoTemplateError("missing command after '|'")
    return cmds


def _parenthesized(tokens: list[_Token], i: int) -> tuple[_Pipe, int]:
    """The pipeline in parentheses opening before tokens[i], and the index after it (and after
    the fields taken of its value)."""
    inner, rest = _operands(tokens[i:])
    if not rest:
        raise GoTemplateError("unclosed left paren")
    if not inner:
        raise GoTemplateError("missing value for parenthesized pipeline")
    sub = _Pipe(cmds=inner)
    i = len(tokens) - len(rest) + 1
    if i < len(tokens) and tokens[i].kind == "chain":
        sub.chain = tokens[i].fields
        i += 1
    return sub, i


# ---------------------------------------------------------------- values


def truth(v: Any) -> bool:
    """Go's truth: false, 0, nil and empty strings, lists and maps are false."""
    if v is None:
        return False
    if isinstance(v, GoStruct):
        return True  # a struct is always true
    if isinstance(v, (bool, int, float, str, list, tuple, dict)):
        return bool(v)
    return True


def go_format(v: Any, top: bool = True) -> str:
    """fmt.Sprint's text of a value."""
    if v is None:
        return "<no value>" if top else "<nil>"
    if isinstance(v, (GoMap, GoList)):
        return v.json
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _go_float(v)
    if isinstance(v, (list, tuple)):
        return "[" + " ".join(go_format(x, False) for x in v) + "]"
    if isinstance(v, dict):
        return (
            "map["
            + " ".join(f"{go_format(k, False)}:{go_format(v[k], False)}" for k in sorted(v))
            + "]"
        )
    return str(v)


def _go_float(f: float) -> str:
    # fmt's %v of a float64: its shortest digits, in e-form where the exponent is below -4 or
    # from 6 on (strconv's 'g' with the shortest precision)
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    if math.isnan(f):
        return "NaN"
    if f == 0:
        return "0"
    number = Decimal(repr(f)).normalize()
    sign, digits, exponent = number.as_tuple()
    text = "".join(map(str, digits))
    exp = len(text) + int(exponent) - 1
    if -4 <= exp < 6:
        return format(number, "f")
    mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
    return f"{'-' if sign else ''}{mantissa}e{'+' if exp >= 0 else '-'}{abs(exp):02d}"


def go_json(v: Any) -> str:
    """Go's json.Marshal of a value: compact, a map's keys sorted (a dict is a map; a GoStruct
    keeps its own JSON), <, > and & escaped, whole floats without a fraction."""
    text = json.dumps(_json_ready(v), separators=(",", ":"), ensure_ascii=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _json_ready(v: Any) -> Any:
    if isinstance(v, (GoMap, GoList)):
        return json.loads(v.json)
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e21:
        return int(v)
    if isinstance(v, dict):  # a Go map: its keys sorted
        return {str(k): _json_ready(v[k]) for k in sorted(v, key=str)}
    if isinstance(v, (list, tuple)):
        return [_json_ready(x) for x in v]
    return v


_TS_TYPES = {"string": "string", "number": "number", "integer": "number", "boolean": "boolean"}
_TS_TYPES |= {"array": "any[]", "object": "Record<string, any>", "null": "null"}


def _ts_type(prop: Any) -> str:
    """Ollama's toTypeScriptType of a tool property."""
    if not isinstance(prop, dict):
        return "any"
    any_of = prop.get("AnyOf") or prop.get("anyOf")
    if any_of:
        return " | ".join(_ts_type(p) for p in any_of)
    types = prop.get("Type", prop.get("type"))
    if isinstance(types, str):
        types = [types]
    if not types:
        return "any"
    return " | ".join(_TS_TYPES.get(t, "any") for t in types)


def _sprintf(fmt: str, *args: Any) -> str:
    """fmt.Sprintf for the verbs templates use (%s %v %d %q %f %t %x %%)."""
    it = iter(args)

    def verb(m: re.Match[str]) -> str:
        flags, kind = m.group(1), m.group(2)
        if kind == "%":
            return "%"
        try:
            a = next(it)
        except StopIteration:
            return f"%!{kind}(MISSING)"
        if kind in "sv":
            text = go_format(a, False)
        elif kind == "q":
            text = json.dumps(go_format(a, False), ensure_ascii=False)
        elif kind == "d" and isinstance(a, int):
            text = str(a)
        elif kind in "feg" and isinstance(a, (int, float)):
            text = ("%" + flags + kind) % a
        elif kind == "t" and isinstance(a, bool):
            text = go_format(a)
        elif kind in "xX" and isinstance(a, (int, str)):
            text = format(a, kind) if isinstance(a, int) else a.encode().hex()
        else:
            return f"%!{kind}({go_format(a, False)})"
        return text

    return re.sub(r"%([-+# 0]*\d*(?:\.\d+)?)([a-zA-Z%])", verb, fmt)


# ---------------------------------------------------------------- execution


class _Break(Exception):
    pass


class _Continue(Exception):
    pass


class _Exec:
    def __init__(self, root: Any) -> None:
        self.out: list[str] = []
        self.size = 0
        self.fuel = FUEL
        self.scopes: list[dict[str, Any]] = [{"$": root}]

    def burn(self) -> None:
        self.fuel -= 1
        if self.fuel < 0:
            raise GoTemplateError("the template took too many steps (out of fuel)")

    def write(self, text: str) -> None:
        self.size += len(text)
        if self.size > MAX_OUTPUT:
            raise GoTemplateError("the template wrote too much text")
        self.out.append(text)

    def run(self, nodes: list[Any], dot: Any) -> None:
        for node in nodes:
            self.burn()
            if isinstance(node, str):
                self.write(node)
            elif isinstance(node, _Jump):
                raise _Break if node.kind == "break" else _Continue
            elif isinstance(node, _Pipe):
                value = self.pipe(node, dot)
                if not node.decl:
                    self.write(go_format(value))
            else:
                self.branch(node, dot)

    def branch(self, node: _Branch, dot: Any) -> None:
        self.scopes.append({})  # its variables last until its end
        try:
            if node.kind == "range":
                self.range(node, dot)
                return
            value = self.pipe(node.pipe, dot)
            if truth(value):
                self.run(node.body, value if node.kind == "with" else dot)
            else:
                self.run(node.orelse, dot)
        finally:
            self.scopes.pop()

    def range(self, node: _Branch, dot: Any) -> None:
        decl = node.pipe.decl
        value = self.pipe(node.pipe, dot, declare=False)
        if value is None:
            items: list[tuple[Any, Any]] = []
        elif isinstance(value, dict) and not isinstance(value, GoStruct):
            items = [(k, value[k]) for k in sorted(value)]
        elif isinstance(value, (list, tuple)):
            items = list(enumerate(value))
        elif isinstance(value, int) and not isinstance(value, bool):
            items = [(i, i) for i in range(value)]
        else:
            raise GoTemplateError(f"range can't iterate over {go_format(value)}")
        if not items:
            self.run(node.orelse, dot)
            return
        for key, element in items:
            self.burn()
            scope = self.scopes[-1]
            if len(decl) == 1:
                scope[decl[0]] = element
            elif len(decl) == 2:
                scope[decl[0]], scope[decl[1]] = key, element
            try:
                self.run(node.body, element)
            except _Continue:
                continue
            except _Break:
                break

    def pipe(self, pipe: _Pipe, dot: Any, *, declare: bool = True) -> Any:
        value: Any = None
        for i, cmd in enumerate(pipe.cmds):
            value = self.command(cmd, dot, value, piped=i > 0)
        for name in pipe.chain:
            value = _field(value, name)
        if pipe.decl and declare:
            name = pipe.decl[0]
            if pipe.assign:
                for scope in reversed(self.scopes):
                    if name in scope:
                        scope[name] = value
                        break
                else:
                    raise GoTemplateError(f"undefined variable: {name}")
            else:
                self.scopes[-1][name] = value
        return value

    def command(self, cmd: _Command, dot: Any, last: Any, *, piped: bool) -> Any:
        self.burn()
        head = cmd.args[0]
        if isinstance(head, _Token) and head.kind == "ident":
            name = head.value
            args = cmd.args[1:]
            if name in ("and", "or"):  # short-circuit, as Go 1.18
                operands: list[Any] = [*args, last] if piped else list(args)
                if not operands:
                    raise GoTemplateError(f"wrong number of args for {name}")
                result: Any = None
                for i, a in enumerate(operands):  # the piped value is already a value
                    result = a if piped and i == len(operands) - 1 else self.operand(a, dot)
                    if truth(result) != (name == "and"):
                        return result
                return result
            evaluated = [self.operand(a, dot) for a in args]
            if piped:
                evaluated.append(last)
            return _call(name, evaluated)
        if len(cmd.args) > 1 or piped:
            raise GoTemplateError(f"can't give arguments to a non-function {_describe(head)}")
        return self.operand(head, dot)

    def operand(self, arg: Any, dot: Any) -> Any:
        if isinstance(arg, _Pipe):
            return self.pipe(arg, dot)
        kind = arg.kind
        if kind in ("str", "num", "bool"):
            return arg.value
        if kind == "nil":
            return None
        if kind == "dot":
            return dot
        if kind == "field":
            value = dot
        elif kind == "var":
            for scope in reversed(self.scopes):
                if arg.value in scope:
                    value = scope[arg.value]
                    break
            else:
                raise GoTemplateError(f"undefined variable: {arg.value}")
        else:
            return _call(arg.value, [])
        for name in arg.fields:
            value = _field(value, name)
        return value


def _describe(arg: Any) -> str:
    if isinstance(arg, _Token):
        return arg.kind if arg.value is None else repr(arg.value)
    return "pipeline"


def _field(value: Any, name: str) -> Any:
    if isinstance(value, dict):
        return value.get(name)  # missingkey=zero: a missing key is nil
    if value is None:
        return None  # Go would fail on nil; a missing part of a message reads as nil here
    raise GoTemplateError(f"can't evaluate field {name} in type {type(value).__name__}")


def _length(v: Any) -> int:
    if isinstance(v, (str, list, tuple, dict)):
        return len(v.encode() if isinstance(v, str) else v)
    raise GoTemplateError(f"len of type {type(v).__name__}")


def _index(v: Any, *keys: Any) -> Any:
    for k in keys:
        if isinstance(v, dict):
            v = v.get(k)
        elif isinstance(v, (list, tuple, str)) and isinstance(k, int) and not isinstance(k, bool):
            if not 0 <= k < len(v):
                raise GoTemplateError(f"index out of range: {k}")
            v = v[k]
        else:
            raise GoTemplateError(f"can't index item of type {type(v).__name__}")
    return v


def _slice(v: Any, *bounds: Any) -> Any:
    if not isinstance(v, (str, list, tuple)):
        raise GoTemplateError(f"can't slice item of type {type(v).__name__}")
    if len(bounds) > 2 or not all(isinstance(b, int) for b in bounds):
        raise GoTemplateError("slice takes up to two integer bounds")
    lo = bounds[0] if bounds else 0
    hi = bounds[1] if len(bounds) > 1 else len(v)
    if not 0 <= lo <= hi <= len(v):
        raise GoTemplateError(f"slice bounds out of range [{lo}:{hi}]")
    return v[lo:hi]


def _compare(name: str, a: Any, b: Any) -> bool:
    if name in ("eq", "ne"):
        return (a == b) == (name == "eq")
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (a, b))
    if not (numbers or (isinstance(a, str) and isinstance(b, str))):
        raise GoTemplateError(
            f"incompatible types for comparison: {go_format(a)} {name} {go_format(b)}"
        )
    return {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}[name]


def _today(delta: int = 0) -> str:
    return (datetime.date.today() + datetime.timedelta(days=delta)).isoformat()


def _print(*args: Any) -> str:
    # fmt.Sprint: a space between two operands when neither is a string
    out = ""
    for i, a in enumerate(args):
        if i and not isinstance(a, str) and not isinstance(args[i - 1], str):
            out += " "
        out += go_format(a, False)
    return out


def _eq(first: Any, *others: Any) -> bool:
    if not others:
        raise GoTemplateError("missing argument for comparison")
    return any(first == b for b in others)


def _printf(fmt: Any, *args: Any) -> str:
    if not isinstance(fmt, str):
        raise GoTemplateError("printf needs a format string")
    return _sprintf(fmt, *args)


def _needs_some(fn: Callable[..., Any], what: str) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        if not args:
            raise GoTemplateError(f"{what} of nothing")
        return fn(*args)

    return call


# Go's builtins (and and or are the executor's: they short-circuit) and Ollama's functions
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "not": lambda v: not truth(v),
    "eq": _eq,
    "ne": lambda a, b: _compare("ne", a, b),
    "lt": lambda a, b: _compare("lt", a, b),
    "le": lambda a, b: _compare("le", a, b),
    "gt": lambda a, b: _compare("gt", a, b),
    "ge": lambda a, b: _compare("ge", a, b),
    "len": _length,
    "index": _needs_some(_index, "index"),
    "slice": _needs_some(_slice, "slice"),
    "print": _print,
    "println": lambda *args: " ".join(go_format(a, False) for a in args) + "\n",
    "printf": _needs_some(_printf, "printf"),
    "json": go_json,
    "currentDate": lambda *_: _today(),
    "yesterdayDate": lambda *_: _today(-1),
    "toTypeScriptType": _ts_type,
}


def _call(name: str, args: list[Any]) -> Any:
    fn = _FUNCTIONS.get(name)
    if fn is None:
        raise GoTemplateError(f'function "{name}" not defined')
    try:
        return fn(*args)
    except TypeError:  # the wrong count of arguments
        raise GoTemplateError(f"wrong number of args for {name}: {len(args)}") from None


# ---------------------------------------------------------------- templates


class GoTemplate:
    """A parsed Go template."""

    def __init__(self, source: str) -> None:
        try:
            self.nodes = _Parser(source).parse()
            self.identifiers = {name.lower() for name in _identifiers(self.nodes)}
        except RecursionError:
            raise GoTemplateError("the Go template does not parse: it nests too deeply") from None
        except GoTemplateError as e:
            raise GoTemplateError(f"the Go template does not parse: {e}") from None

    def render(self, data: dict[str, Any], nodes: list[Any] | None = None) -> str:
        run = _Exec(data)
        try:
            run.run(self.nodes if nodes is None else nodes, data)
        except (_Break, _Continue):
            raise GoTemplateError(
                "the Go template failed: break or continue outside range"
            ) from None
        except RecursionError:
            raise GoTemplateError("the Go template failed: it nests too deeply") from None
        except GoTemplateError as e:
            raise GoTemplateError(f"the Go template failed: {e}") from None
        return "".join(run.out)

    def ending_with_response(self) -> list[Any]:
        """The template's nodes, with `{{ .Response }}` added at the end where it has none (as
        Ollama's Parse touches up a template without .Messages or .Response)."""
        if "response" in self.identifiers:
            return self.nodes
        return [*self.nodes, _Pipe(cmds=[_Command([_Token("field", None, ("Response",))])])]

    def cut_after_response(self) -> list[Any]:
        """ending_with_response's nodes up to and with the first `.Response`, what follows
        dropped: Ollama's last turn of a template without .Messages, left open for the answer."""
        cut = False

        def walk(nodes: list[Any]) -> list[Any]:
            nonlocal cut
            kept: list[Any] = []
            for node in nodes:
                if cut:
                    break
                if isinstance(node, _Pipe):
                    kept.append(node)
                    cut = _has_response_field(node)
                elif isinstance(node, _Branch):
                    body = walk(node.body)
                    orelse = walk(node.orelse) if not cut else []
                    kept.append(_Branch(node.kind, node.pipe, body, orelse))
                else:
                    kept.append(node)
            return kept

        return walk(self.ending_with_response())


def _has_response_field(pipe: _Pipe) -> bool:
    for cmd in pipe.cmds:
        for arg in cmd.args:
            if isinstance(arg, _Pipe):
                if _has_response_field(arg):
                    return True
            elif arg.kind == "field" and "Response" in arg.fields:
                return True
    return False


def _identifiers(nodes: list[Any]) -> Iterator[str]:
    """The field and variable names a template mentions (Ollama's Vars)."""
    for node in nodes:
        if isinstance(node, _Pipe):
            for cmd in node.cmds:
                for arg in cmd.args:
                    if isinstance(arg, _Pipe):
                        yield from _identifiers([arg])
                    elif arg.kind == "field":
                        yield from arg.fields
                    elif arg.kind == "var":
                        yield arg.value.lstrip("$")
                        yield from arg.fields
        elif isinstance(node, _Branch):
            yield from _identifiers([node.pipe])
            yield from _identifiers(node.body)
            yield from _identifiers(node.orelse)


_GO_ACTION = re.compile(r"\{\{-?\s*(\.|\$|range\s|if\s|with\s|end\s*-?\}\}|/\*)")


def is_go_template(source: str) -> bool:
    """Whether a template is written in Go's syntax rather than Jinja's: an action that starts
    with a field, a variable or a Go keyword ("{{ .Prompt }}", "{{ range .Messages }}")."""
    return bool(_GO_ACTION.search(source)) and "{%" not in source
