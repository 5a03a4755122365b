"""One answer from the server, printed as it streams: a chat turn (the REPL) or a single
generate (`ember run MODEL PROMPT`, piped stdin), with the timings of --verbose. For a model
with vision, the image files a prompt names go with it (images.py)."""

import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

from ember.cli.client import Client
from ember.cli.images import attach_images
from ember.cli.wordwrap import WordWrap


@dataclass
class Session:
    """What a `run` carries from one answer to the next (the REPL's /set changes it)."""

    model: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    system: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    format: str | dict[str, Any] | None = None  # "json" or a schema
    keep_alive: str | None = None
    think: bool | str | None = None
    hide_thinking: bool = False
    verbose: bool = False
    word_wrap: bool = False  # Ollama's wordwrap: on in a terminal unless --nowordwrap
    vision: bool = False  # the model reads images: paths in a prompt attach them

    def common(self) -> dict[str, Any]:
        """The request fields every generation of this session sends."""
        body: dict[str, Any] = {"model": self.model, "options": self.options}
        if self.format:
            body["format"] = self.format
        if self.keep_alive is not None:
            body["keep_alive"] = self.keep_alive
        if self.think is not None:
            body["think"] = self.think
        return body


def load_model(client: Client, session: Session) -> None:
    """Loads the session's model before a REPL, as Ollama's loadOrUnloadModel: with its
    keep_alive and think, so that a model that cannot think fails here, not at the first
    message."""
    body: dict[str, Any] = {"model": session.model, "stream": False}
    if session.keep_alive is not None:
        body["keep_alive"] = session.keep_alive
    if session.think is not None:
        body["think"] = session.think
    client.request("POST", "/api/generate", body)


def chat_turn(client: Client, session: Session, text: str, out: TextIO = sys.stdout) -> None:
    """Sends `text` as the next user message and prints the answer; the answer joins the
    history only when it ended (Ctrl-C drops it, as Ollama's, and propagates). An image that
    cannot be sent is a CLIError before anything joins the history."""
    prompt, images = _with_images(session, text)
    session.messages.append({"role": "user", "content": prompt} | _images(images))
    body = session.common() | {"messages": session.messages, "stream": True}
    content, thinking, final = _print_stream(client, "/api/chat", body, session, out)
    message = {"role": "assistant", "content": content}
    if thinking:
        message["thinking"] = thinking
    session.messages.append(message)
    if session.verbose and final is not None:
        print_timings(final)


def generate_once(client: Client, session: Session, prompt: str, out: TextIO = sys.stdout) -> None:
    """Answers one prompt (the non-interactive `run`)."""
    prompt, images = _with_images(session, prompt)
    body = session.common() | {"prompt": prompt, "stream": True} | _images(images)
    if session.system:
        body["system"] = session.system
    _, _, final = _print_stream(client, "/api/generate", body, session, out)
    if session.verbose and final is not None:
        print_timings(final)


def _with_images(session: Session, text: str) -> tuple[str, list[str]]:
    """The text to send and the images it names (none for a model without vision)."""
    return attach_images(text) if session.vision else (text, [])


def _images(images: list[str]) -> dict[str, list[str]]:
    return {"images": images} if images else {}


def _print_stream(
    client: Client, path: str, body: dict[str, Any], session: Session, out: TextIO
) -> tuple[str, str, dict[str, Any] | None]:
    """Prints pieces as they come; returns (content, thinking, final record)."""
    content, thinking, final = [], [], None
    is_thinking = False
    display = WordWrap(out, session.word_wrap)
    for record in client.stream(path, body):
        message = record.get("message") or {}
        piece = message.get("content", "") if message else record.get("response", "")
        thought = message.get("thinking", "") if message else record.get("thinking", "")
        if thought:
            thinking.append(thought)
            if not session.hide_thinking:
                if not is_thinking:
                    out.write("Thinking...\n")
                    is_thinking = True
                display.write(thought)
        if piece:
            if is_thinking:  # a line of its own, as Ollama's
                ends_line = "".join(thinking).endswith("\n")
                out.write(("" if ends_line else "\n") + "...done thinking.\n\n")
                is_thinking = False
                display = WordWrap(out, session.word_wrap)  # the answer starts a line
            content.append(piece)
            display.write(piece)
        out.flush()
        if record.get("done"):
            final = record
    out.write("\n\n")  # as Ollama's run, a terminal or not: the answer's line, a blank one
    out.flush()
    return "".join(content), "".join(thinking), final


def print_timings(final: dict[str, Any], err: TextIO = sys.stderr) -> None:
    """Ollama's --verbose summary (Metrics.Summary): each line only where its value is above
    zero, durations as Go prints them."""
    counts = {key: int(final.get(key) or 0) for key in _TIMED}
    lines = []
    for name, key in (("total duration", "total_duration"), ("load duration", "load_duration")):
        if counts[key] > 0:
            lines.append((name, go_duration(counts[key])))
    for what, prefix in (("prompt eval", "prompt_eval_"), ("eval", "eval_")):
        count, duration = counts[prefix + "count"], counts[prefix + "duration"]
        if count > 0:
            lines.append((f"{what} count", f"{count} token(s)"))
        if duration > 0:
            lines.append((f"{what} duration", go_duration(duration)))
            lines.append((f"{what} rate", f"{count / (duration / 1e9):.2f} tokens/s"))
    for name, value in lines:
        err.write(f"{name + ':':<22}{value}\n")
    err.flush()


_TIMED = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration",
          "eval_count", "eval_duration")  # fmt: skip


def go_duration(ns: int) -> str:
    """A duration in nanoseconds as Go's time.Duration prints it: 271.006ms, 100µs, 1m6.9s."""
    if ns < 1000:
        return f"{ns}ns" if ns else "0s"
    if ns < 1_000_000:
        return _decimal(ns, 1000) + "µs"
    if ns < 1_000_000_000:
        return _decimal(ns, 1_000_000) + "ms"
    hours, rest = divmod(ns, 3_600_000_000_000)
    minutes, rest = divmod(rest, 60_000_000_000)
    head = f"{hours}h{minutes}m" if hours else f"{minutes}m" if minutes else ""
    return head + _decimal(rest, 1_000_000_000) + "s"


def _decimal(value: int, unit: int) -> str:
    whole, fraction = divmod(value, unit)
    digits = str(fraction).rjust(len(str(unit)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}" if digits else str(whole)
