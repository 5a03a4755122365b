"""A request's JSON body read as Go's decoder reads it, into a pydantic model, and any fault of
it as one short line (RequestError: the server's 400)."""

import json
import re
from typing import Any, TypeVar

import pydantic_core
from pydantic import BaseModel, ValidationError

from ember.errors import EmberError


class RequestError(EmberError):
    """A request body that cannot be used: the server answers 400 with `message`. `param` is
    the field's path ("options.temperature"), for OpenAI's error object."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


T = TypeVar("T", bound=BaseModel)


def parse_body(model: type[T], body: bytes | str) -> T:
    """The request model of a JSON body; RequestError with one short line if it is not one.

    As Go's decoder: NaN and Infinity are not JSON (pydantic's parser takes them), and a lone
    UTF-16 surrogate escape or a byte that is not UTF-8 reads as U+FFFD (pydantic's refuses
    them; a front end that cut a string inside an emoji sends one)."""
    if isinstance(body, str):  # what a route built itself
        body = body.encode()
    if not body.strip():
        raise RequestError("missing request body")
    try:
        parsed = model.model_validate_json(body, strict=True)
    except ValidationError as err:
        repaired = _repaired(body) if err.errors()[0]["type"] == "json_invalid" else None
        if repaired is None:
            raise RequestError(validation_message(err), _param(err)) from None
        try:
            return model.model_validate_json(repaired, strict=True)
        except ValidationError as again:
            raise RequestError(validation_message(again), _param(again)) from None
    if (b"NaN" in body or b"Infinity" in body) and _has_nan_or_infinity(body):
        raise RequestError("invalid JSON: NaN and Infinity are not JSON numbers")
    return parsed


def _has_nan_or_infinity(body: bytes) -> bool:
    try:
        pydantic_core.from_json(body, allow_inf_nan=False)
    except ValueError:
        return True
    return False


_SURROGATE = re.compile("[\ud800-\udfff]")


def _repaired(body: bytes) -> bytes | None:
    """body with lone surrogates and bytes that are not UTF-8 as U+FFFD; None when it is not
    JSON even so (or nothing needed repair)."""

    def no_constants(name: str) -> None:
        raise ValueError(name)

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            return _SURROGATE.sub("\ufffd", value)
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, dict):
            return {clean(k): clean(v) for k, v in value.items()}
        return value

    try:
        value = json.loads(body.decode("utf-8", "replace"), parse_constant=no_constants)
        repaired = json.dumps(clean(value), ensure_ascii=False).encode()
    except (ValueError, RecursionError):
        return None
    return None if repaired == body else repaired


def validation_message(err: ValidationError) -> str:
    """The first error of err as one line: `invalid value for "options.temperature": input
    should be a valid number (got "hot")`, `model is required`, `invalid JSON: ...`."""
    first = err.errors()[0]
    path = field_path(first["loc"])
    kind, msg = first["type"], first["msg"].removeprefix("Value error, ")
    if kind == "json_invalid":
        return msg[0].lower() + msg[1:]
    if kind == "missing":
        return f"{path} is required"
    if not path:
        return "the request body must be a JSON object" if kind == "model_type" else msg
    got = json.dumps(first.get("input"), default=str)
    got = got if len(got) <= 40 else got[:37] + "..."
    return f'invalid value for "{path}": {msg[0].lower() + msg[1:]} (got {got})'


def field_path(loc: tuple[int | str, ...]) -> str:
    """("messages", 0, "role") -> "messages[0].role"."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path


def _param(err: ValidationError) -> str | None:
    return field_path(err.errors()[0]["loc"]) or None


# --- field types ---
