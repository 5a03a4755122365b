"""Times as Ollama's JSON writes them: Go's time.Time marshals as RFC 3339 with nanoseconds,
the fraction's trailing zeros trimmed (none at all for a whole second) and `Z` for UTC, so
`2026-12-06T16:36:33.7Z`, never Python's `.700000+00:00`."""

from datetime import UTC, datetime


def rfc3339_nano(when: datetime) -> str:
    """when in its own zone (a naive one: the machine's), as Go's RFC3339Nano."""
    if when.tzinfo is None:
        when = when.astimezone()
    text = when.strftime("%Y-%m-%dT%H:%M:%S")
    if when.microsecond:
        text += f".{when.microsecond:06d}".rstrip("0")
    offset = when.utcoffset()
    if not offset:
        return text + "Z"
    zone = when.strftime("%z")  # +hhmm
    return f"{text}{zone[:3]}:{zone[3:]}"


def utc_now() -> str:
    """The present moment in UTC, as Ollama's created_at."""
    return rfc3339_nano(datetime.now(UTC))
