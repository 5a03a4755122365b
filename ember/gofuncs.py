"""The values a Go template works on and the functions it calls (gotemplate.py executes it):
Go's truth, fmt.Sprint's text and json.Marshal's JSON of Python values, Go's builtins and
Ollama's json, currentDate, yesterdayDate and toTypeScriptType."""

import datetime
import json
import math
import re
import urllib.parse
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from ember.goparse import GoTemplateError


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
    """Go's json.Marshal of a value (go_json_text), a map's keys sorted (a dict is a map; a
    GoStruct keeps its own JSON), whole floats without a fraction; "" where Go's fails (NaN), as
    Ollama's json function returns."""
    try:
        return go_json_text(_json_ready(v))
    except ValueError:
        return ""


def go_json_text(value: Any) -> str:
    """JSON as Go's encoding/json writes it: compact, HTML characters and the line separators
    escaped; NaN and infinities a ValueError."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    for char, escaped in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e")):
        text = text.replace(char, escaped)  # only inside strings: JSON syntax has none of them
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
        width, _, precision = flags.lstrip("-+# 0").partition(".")
        if len(width) > 6 and int(width) > 1_000_000:  # Go's fmt refuses such sizes
            return "%!(BADWIDTH)"
        if len(precision) > 6 and int(precision) > 1_000_000:
            return "%!(BADPREC)"
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


def field_of(value: Any, name: str) -> Any:
    """value.name in a template: a map's key."""
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
    "html": lambda *args: _html(_text_of(args)),
    "js": lambda *args: _js(_text_of(args)),
    "urlquery": lambda *args: urllib.parse.quote_plus(_text_of(args)),
}


def is_function(name: str) -> bool:
    """Whether a template may call `name`: Go's parse refuses any other (and and or are the
    executor's)."""
    return name in _FUNCTIONS or name in ("and", "or")


def _text_of(args: tuple[Any, ...]) -> str:
    # Go's evalArgs: one string as itself, else fmt.Sprint of them all
    return args[0] if len(args) == 1 and isinstance(args[0], str) else _print(*args)


_HTML = {'"': "&#34;", "'": "&#39;", "&": "&amp;", "<": "&lt;", ">": "&gt;", "\0": "\ufffd"}
_JS = {"\\": "\\\\", "'": "\\'", '"': '\\"', "<": "\\u003C", ">": "\\u003E"}
_JS |= {"&": "\\u0026", "=": "\\u003D"}


def _html(text: str) -> str:
    """text/template's HTMLEscapeString."""
    return "".join(_HTML.get(c, c) for c in text)


def _js(text: str) -> str:
    """text/template's JSEscapeString: quotes, backslash and HTML's characters escaped, control
    characters and unprintable ones as \\uXXXX."""
    out = []
    for c in text:
        if c in _JS:
            out.append(_JS[c])
        elif c < " " or not c.isprintable():
            out.append(f"\\u{ord(c):04X}")
        else:
            out.append(c)
    return "".join(out)


def call(name: str, args: list[Any]) -> Any:
    """The function `name` (a builtin, or Ollama's) of args."""
    fn = _FUNCTIONS.get(name)
    if fn is None:
        raise GoTemplateError(f'function "{name}" not defined')
    try:
        return fn(*args)
    except TypeError:  # the wrong count of arguments
        raise GoTemplateError(f"wrong number of args for {name}: {len(args)}") from None
