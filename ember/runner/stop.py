"""Stop sequences in a text stream: never emitted, may end mid-token, held back while partial."""

from dataclasses import dataclass, field


@dataclass(slots=True)
class StopMatcher:
    """Feeds generated text in; returns what is safe to emit and whether a stop string was hit."""

    stops: tuple[str, ...]
    pending: str = field(default="")
    is_stopped: bool = field(default=False)
    matched: str = field(default="")  # the stop string that ended the text (Anthropic reports it)

    def push(self, text: str) -> str:
        self.pending += text
        found = [(at, s) for s in self.stops if (at := self.pending.find(s)) >= 0]
        if found:
            cut, self.matched = min(found, key=lambda hit: hit[0])
            self.is_stopped = True
            out, self.pending = self.pending[:cut], ""
            return out
        hold = max((_overlap(self.pending, s) for s in self.stops), default=0)
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(out) :]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return "" if self.is_stopped else out


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of stop."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
