"""The REPL's `/set parameter NAME VALUE...` typed and checked as Ollama's api.FormatParams does,
with its error texts, so that a bad value is refused there and never stored (a stored one would
fail every later message)."""

from typing import Any

from ember.errors import OptionsError
from ember.options import Options
from ember.store.errors import ModelfileError
from ember.store.modelfile import parameter_types, typed_parameter

_INT64 = range(-(2**63), 2**63)  # Go's strconv.ParseInt(text, 10, 64)
_FLOAT32_MAX = 3.4028234663852886e38  # Go's strconv.ParseFloat(text, 32): past it, an error


class ParameterError(ValueError):
    """A value /set parameter refuses; printed as Ollama prints it (its message Go-quoted)."""


def format_param(name: str, words: list[str]) -> Any:
    """The value of parameter `name` from the words after it: a list for a list option (stop),
    else the first word typed (int, float, bool or string), as FormatParams; then checked by
    Ember's own option rules (num_ctx at least 1, ...), which the server would apply."""
    kind = parameter_types().get(name)
    if kind is None:
        raise ParameterError(f"unknown parameter '{name}'")
    value = words if kind not in (int, float, bool, str) else _typed(name, kind, words)
    try:
        Options.parse({name: value})
    except OptionsError as e:
        raise ParameterError(str(e)) from None
    return value


def _typed(name: str, kind: type, words: list[str]) -> Any:
    invalid = ParameterError(f"invalid {kind.__name__} value [{' '.join(words)}]")  # Go's %s
    try:
        value: Any = typed_parameter(name, words[0])
    except ModelfileError:
        raise invalid from None
    if (kind is int and value not in _INT64) or (kind is float and abs(value) > _FLOAT32_MAX):
        raise invalid
    if kind is float and value.is_integer() and abs(value) < 1e21:
        return int(value)  # Go's JSON and %v write a whole float32 as 0, not 0.0
    return value
