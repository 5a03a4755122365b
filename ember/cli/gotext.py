"""Texts of Go's standard library that Ollama's CLI prints and Ember's repeats: a value quoted
as %q writes it, and time.ParseDuration's errors (Ember's envconfig does the parsing)."""

import json
import re

from ember import envconfig

_PART = re.compile(r"(\d+\.?\d*|\.\d+)([^\d.]*)")  # a number and its unit, as Go scans them


def go_quote(text: str) -> str:
    """Text as Go's %q writes it: double-quoted, with \\" and \\n escapes."""
    return json.dumps(text, ensure_ascii=False)


def check_duration(text: str) -> None:
    """ValueError with Go's message unless text is a Go duration ("5m", "1h30m", "0")."""
    try:
        if text != text.strip():  # Go's parser takes no spaces
            raise ValueError
        envconfig.parse_duration(text)
    except ValueError:
        raise ValueError(_duration_error(text)) from None


def _duration_error(text: str) -> str:
    quoted = go_quote(text)
    rest = text[1:] if text[:1] in ("+", "-") else text
    while rest:
        part = _PART.match(rest)
        if part is None:
            break
        unit = part.group(2)
        if not unit:
            return f"time: missing unit in duration {quoted}"
        if not _is_unit(unit):
            return f"time: unknown unit {go_quote(unit)} in duration {quoted}"
        rest = rest[part.end() :]
    return f"time: invalid duration {quoted}"


def _is_unit(unit: str) -> bool:
    try:
        envconfig.parse_duration("1" + unit)
    except ValueError:
        return False
    return True
