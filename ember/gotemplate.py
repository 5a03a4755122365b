"""Go's text/template, the part of it Ollama's prompt templates use: Modelfile TEMPLATEs and a
request's `template` are written in it ("{{ .Prompt }}", "{{ range .Messages }}"). The language
is goparse.py's, the values and functions gofuncs.py's; this runs a parsed template over data.

FUEL bounds the work an untrusted template may do (as minijinja's fuel does for Jinja) and
MAX_OUTPUT the text it writes. Data are Python dicts, lists, strings and numbers: a missing map
key is nil (Ollama parses with missingkey=zero) and nil prints "<no value>", as in Go."""

import re
from collections.abc import Iterable, Iterator
from typing import Any

from ember.gofuncs import GoStruct, call, field_of, go_format, is_function, truth
from ember.goparse import Branch, Command, GoTemplateError, Jump, Pipe, Token, parse

__all__ = ["GoTemplate", "GoTemplateError", "is_go_template"]

FUEL = 2_000_000  # nodes, commands and loop turns one render may take
MAX_OUTPUT = 64 << 20  # bytes of text one render may write


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
            elif isinstance(node, Jump):
                raise _Break if node.kind == "break" else _Continue
            elif isinstance(node, Pipe):
                value = self.pipe(node, dot)
                if not node.decl:
                    self.write(go_format(value))
            else:
                self.branch(node, dot)

    def branch(self, node: Branch, dot: Any) -> None:
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

    def range(self, node: Branch, dot: Any) -> None:
        decl = node.pipe.decl
        value = self.pipe(node.pipe, dot, declare=False)
        items: Iterable[tuple[Any, Any]]
        if value is None:
            items, empty = (), True
        elif isinstance(value, dict) and not isinstance(value, GoStruct):
            items, empty = [(k, value[k]) for k in sorted(value)], not value
        elif isinstance(value, (list, tuple)):
            items, empty = enumerate(value), not value
        elif isinstance(value, int) and not isinstance(value, bool):
            # turn by turn, as Go's: `range 100000000` burns fuel, not memory
            items, empty = ((i, i) for i in range(value)), value <= 0
        else:
            raise GoTemplateError(f"range can't iterate over {go_format(value)}")
        if empty:
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

    def pipe(self, pipe: Pipe, dot: Any, *, declare: bool = True) -> Any:
        value: Any = None
        for i, cmd in enumerate(pipe.cmds):
            value = self.command(cmd, dot, value, piped=i > 0)
        for name in pipe.chain:
            value = field_of(value, name)
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

    def command(self, cmd: Command, dot: Any, last: Any, *, piped: bool) -> Any:
        self.burn()
        head = cmd.args[0]
        if isinstance(head, Token) and head.kind == "ident":
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
            return call(name, evaluated)
        if len(cmd.args) > 1 or piped:
            raise GoTemplateError(f"can't give arguments to a non-function {_describe(head)}")
        return self.operand(head, dot)

    def operand(self, arg: Any, dot: Any) -> Any:
        if isinstance(arg, Pipe):
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
            return call(arg.value, [])
        for name in arg.fields:
            value = field_of(value, name)
        return value


def _describe(arg: Any) -> str:
    if isinstance(arg, Token):
        return arg.kind if arg.value is None else repr(arg.value)
    return "pipeline"


# ---------------------------------------------------------------- templates


class GoTemplate:
    """A parsed Go template."""

    def __init__(self, source: str) -> None:
        try:
            self.nodes = parse(source)
            self.identifiers = {name.lower() for name in _identifiers(self.nodes)}
            for name in _functions(self.nodes):  # as Go's parse: at create, not each request
                if not is_function(name):
                    raise GoTemplateError(f'function "{name}" not defined')
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
        return [*self.nodes, Pipe(cmds=[Command([Token("field", None, ("Response",))])])]

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
                if isinstance(node, Pipe):
                    kept.append(node)
                    cut = _has_response_field(node)
                elif isinstance(node, Branch):
                    body = walk(node.body)
                    orelse = walk(node.orelse) if not cut else []
                    kept.append(Branch(node.kind, node.pipe, body, orelse))
                else:
                    kept.append(node)
            return kept

        return walk(self.ending_with_response())


def _has_response_field(pipe: Pipe) -> bool:
    for cmd in pipe.cmds:
        for arg in cmd.args:
            if isinstance(arg, Pipe):
                if _has_response_field(arg):
                    return True
            elif arg.kind == "field" and "Response" in arg.fields:
                return True
    return False


def _tokens(nodes: list[Any]) -> Iterator[Token]:
    """Every operand token of a template's actions, nested pipelines' too."""
    for node in nodes:
        if isinstance(node, Pipe):
            for cmd in node.cmds:
                for arg in cmd.args:
                    if isinstance(arg, Pipe):
                        yield from _tokens([arg])
                    else:
                        yield arg
        elif isinstance(node, Branch):
            yield from _tokens([node.pipe, *node.body, *node.orelse])


def _functions(nodes: list[Any]) -> Iterator[str]:
    """The function names a template calls."""
    return (t.value for t in _tokens(nodes) if t.kind == "ident")


def _identifiers(nodes: list[Any]) -> Iterator[str]:
    """The field and variable names a template mentions (Ollama's Vars)."""
    for token in _tokens(nodes):
        if token.kind == "var":
            yield token.value.lstrip("$")
        if token.kind in ("field", "var"):
            yield from token.fields


_GO_ACTION = re.compile(r"\{\{-?\s*(\.|\$|range\s|if\s|with\s|end\s*-?\}\}|/\*)")


def is_go_template(source: str) -> bool:
    """Whether a template is written in Go's syntax rather than Jinja's: an action that starts
    with a field, a variable or a Go keyword ("{{ .Prompt }}", "{{ range .Messages }}")."""
    return bool(_GO_ACTION.search(source)) and "{%" not in source
