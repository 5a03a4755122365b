"""Go's text/template, the language (gotemplate.py executes it): an action's tokens, and the
tree of text, pipelines and branches (if, range, with) a template parses to. `define`, `template`
and `block` are refused."""

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ember.errors import EmberError

_KEYWORDS = frozenset(
    ("if", "else", "end", "range", "with", "break", "continue", "define", "template", "block")
)
_SPACE = " \t\r\n"


class GoTemplateError(EmberError):
    """A Go template that does not parse or fails to render."""


# ---------------------------------------------------------------- lexing


@dataclass(slots=True)
class Token:
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


def _token(kind: str, text: str, after_paren: bool) -> Token:
    if kind == "str":
        return Token("str", _go_string(text[1:-1]))
    if kind == "raw":
        return Token("str", text[1:-1])
    if kind == "char":
        return Token("num", ord(_go_string(text[1:-1].replace('"', '\\"'))[:1] or "\0"))
    if kind == "punct":
        return Token(text)
    if kind == "var":
        name, *fields = text.split(".")
        return Token("var", name, tuple(fields))
    if kind == "field":  # right after a ")": fields of the parenthesized pipeline's value
        return Token("chain" if after_paren else "field", None, tuple(text[1:].split(".")))
    if kind == "num":
        return Token("num", _number(text))
    if kind == "dot":
        return Token("dot")
    if text in ("true", "false"):
        return Token("bool", text == "true")
    return Token("nil") if text == "nil" else Token("ident", text)


def _lex_action(text: str, at: int) -> tuple[list[Token], int, bool]:
    """The tokens of the action whose inside starts at `at`; returns them, the position after
    its `}}`, and whether it ends with the ` -}}` trim marker."""
    tokens: list[Token] = []
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
class Command:
    args: list[Any]  # operands: Token, or Pipe for a parenthesized pipeline


@dataclass(slots=True)
class Pipe:
    decl: list[str] = field(default_factory=list)  # variables declared (:=) or assigned (=)
    assign: bool = False
    cmds: list[Command] = field(default_factory=list)
    chain: tuple[str, ...] = ()  # fields taken of a parenthesized pipeline's value


@dataclass(frozen=True, slots=True)
class Jump:
    kind: str  # break, continue


@dataclass(slots=True)
class Branch:
    kind: str  # if, range, with
    pipe: Pipe
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

    def list_until(self) -> tuple[list[Any], tuple[str, list[Token]] | None]:
        """Nodes up to an `else` or `end` (returned with its tokens), or the end of input."""
        nodes: list[Any] = []
        while self.at < len(self.items):
            kind, value = self.items[self.at]
            self.at += 1
            if kind == "text":
                nodes.append(value)
                continue
            tokens: list[Token] = value
            if not tokens:
                raise GoTemplateError("missing value for command")
            head = tokens[0]
            word = head.value if head.kind == "ident" and head.value in _KEYWORDS else None
            if word in ("else", "end"):
                return nodes, (word, tokens[1:])
            if word in ("if", "range", "with"):
                nodes.append(self.branch(word, tokens[1:]))
            elif word in ("break", "continue"):
                nodes.append(Jump(word))
            elif word is not None:
                raise GoTemplateError(f"{{{{{word}}}}} is not supported")
            else:
                nodes.append(_pipe(tokens, declare=True))
        return nodes, None

    def branch(self, kind: str, tokens: list[Token]) -> Branch:
        node = Branch(kind, _pipe(tokens, declare=True, range_vars=kind == "range"), [])
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


def _pipe(tokens: list[Token], *, declare: bool = False, range_vars: bool = False) -> Pipe:
    pipe = Pipe()
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


def _operands(tokens: list[Token]) -> tuple[list[Command], list[Token]]:
    """Commands of a pipeline up to an unmatched ')' (returned with what follows it)."""
    cmds: list[Command] = []
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
            cmds, args = [*cmds, Command(args)], []
        elif t.kind == "(":
            sub, i = _parenthesized(tokens, i)
            args.append(sub)
        elif t.kind in ("field", "var", "dot", "str", "num", "bool", "nil", "ident"):
            args.append(t)
        else:
            raise GoTemplateError(f"unexpected {t.kind!r} in operand")
    return _commands(cmds, args), []


def _commands(cmds: list[Command], args: list[Any]) -> list[Command]:
    if args:
        return [*cmds, Command(args)]
    if cmds:
        raise GoTemplateError("missing command after '|'")
    return cmds


def _parenthesized(tokens: list[Token], i: int) -> tuple[Pipe, int]:
    """The pipeline in parentheses opening before tokens[i], and the index after it (and after
    the fields taken of its value)."""
    inner, rest = _operands(tokens[i:])
    if not rest:
        raise GoTemplateError("unclosed left paren")
    if not inner:
        raise GoTemplateError("missing value for parenthesized pipeline")
    sub = Pipe(cmds=inner)
    i = len(tokens) - len(rest) + 1
    if i < len(tokens) and tokens[i].kind == "chain":
        sub.chain = tokens[i].fields
        i += 1
    return sub, i


def parse(source: str) -> list[Any]:
    """A template's nodes: text (str), Pipe, Jump and Branch."""
    return _Parser(source).parse()
