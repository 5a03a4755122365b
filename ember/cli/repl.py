"""The interactive `ember run` (Ollama's REPL): `>>> ` prompt with history, `\"\"\"` multi-line
input, /set, /show, /load, /save, /clear, /bye. Ctrl-C stops an answer, not the REPL; Ctrl-D or
/bye leaves. A model with vision takes image files by path, even a line that starts with one."""

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prompt_toolkit import PromptSession
from prompt_toolkit.history import FileHistory, History, InMemoryHistory

from ember import envconfig
from ember.cli import commands
from ember.cli.chat import Session, chat_turn
from ember.cli.client import Client, CLIError
from ember.cli.images import HELP as IMAGES_HELP
from ember.cli.images import has_vision, starts_with_image_path
from ember.errors import EmberError, OptionsError
from ember.options import Options
from ember.store.modelfile import DEPRECATED_PARAMETERS

HELP = """Available Commands:
  /set            Set session variables
  /show           Show model information
  /load <model>   Load a session or model
  /save <model>   Save your current session
  /clear          Clear session context
  /bye            Exit
  /?, /help       Help for a command

Use \"\"\" to begin a multi-line message.
"""
SET_HELP = """Available Commands:
  /set parameter ...     Set a parameter
  /set system <string>   Set system message
  /set format json       Enable JSON mode
  /set noformat          Disable formatting
  /set verbose           Show LLM stats
  /set quiet             Disable LLM stats
  /set think [level]     Enable thinking (a level: high, medium, low)
  /set nothink           Disable thinking
"""
SHOW_PARTS = ("info", "license", "modelfile", "parameters", "system", "template")
MULTILINE = '"""'


class Repl:
    def __init__(self, client: Client, session: Session) -> None:
        self.client, self.session = client, session
        self.prompt: PromptSession[str] = PromptSession(history=_history())

    def loop(self) -> None:
        while True:
            try:
                text = self._read()
            except KeyboardInterrupt:
                print("Use Ctrl + d or /bye to exit.")
                continue
            except EOFError:
                return
            if text.startswith("/") and not self._names_image(text):
                if self._command(text.strip()):
                    return
            elif text.strip():
                self._answer(text)

    def _read(self) -> str:
        line = self.prompt.prompt(">>> ", placeholder="Send a message (/? for help)")
        if not line.lstrip().startswith(MULTILINE):
            return line
        lines = [line.lstrip()[len(MULTILINE) :]]
        while not lines[-1].rstrip().endswith(MULTILINE):
            lines.append(self.prompt.prompt("... "))
        lines[-1] = lines[-1].rstrip()[: -len(MULTILINE)]
        return "\n".join(lines).strip("\n")

    def _names_image(self, text: str) -> bool:
        return self.session.vision and starts_with_image_path(text)

    def _answer(self, text: str) -> None:
        try:
            chat_turn(self.client, self.session, text)
        except KeyboardInterrupt:
            print()  # the answer stops; the REPL goes on
        except CLIError as e:
            print(f"Error: {e}")

    def _command(self, text: str) -> bool:
        """Runs a slash command; True when the REPL should end."""
        name, _, rest = text.partition(" ")
        if name in ("/bye", "/exit"):
            return True
        handlers: dict[str, Callable[[str], None]] = {
            "/set": self._set,
            "/show": self._show,
            "/load": self._load,
            "/save": self._save,
            "/clear": self._clear,
            "/?": self._help,
            "/help": self._help,
        }
        handler = handlers.get(name)
        if handler is None:
            print(f"Unknown command '{name}'. Type /? for help")
            return False
        try:
            handler(rest.strip())
        except EmberError as e:
            print(f"Error: {e}")
        return False

    def _help(self, rest: str) -> None:
        if rest == "set":
            print(SET_HELP)
        else:
            print(HELP + (IMAGES_HELP if self.session.vision else ""))

    def _set(self, rest: str) -> None:
        what, _, value = rest.partition(" ")
        flags = {
            "verbose": ("verbose", True, "Set 'verbose' mode."),
            "quiet": ("verbose", False, "Set 'quiet' mode."),
            "think": ("think", True, "Set 'think' mode."),
            "nothink": ("think", False, "Set 'nothink' mode."),
            "noformat": ("format", None, "Disabled format."),
        }
        if what == "think" and value.strip():  # a level: /set think high, as Ollama's
            self.session.think = value.strip()
            self._warn_without_thinking()
            print(f"Set 'think' mode to '{value.strip()}'.")
        elif what in flags:
            attr, flag, message = flags[what]
            setattr(self.session, attr, flag)
            if attr == "think":
                self._warn_without_thinking()
            print(message)
        elif what == "parameter":
            self._set_parameter(value)
        elif what == "system":
            self._set_system(value.strip())
        elif what == "format":
            if value.strip() == "json":
                self.session.format = "json"
                print("Set format to 'json' mode.")
            else:
                print("Invalid or missing format. For 'json' mode use '/set format json'")
        elif what:
            print(f"Unknown command '/set {what}'. Type /? for help")
        else:
            print(SET_HELP)

    def _warn_without_thinking(self) -> None:
        """As Ollama's: a model that cannot think is told at /set, not at the next message."""
        try:
            shown = self.client.request("POST", "/api/show", {"model": self.session.model})
        except CLIError:
            return
        if "thinking" not in (shown.get("capabilities") or []):
            model = self.session.model
            print(f'warning: model "{model}" does not support thinking output', file=sys.stderr)

    def _set_parameter(self, text: str) -> None:
        """As Ollama's: the words after the name are its value (stop takes each as one stop
        string), checked now rather than by every later message."""
        if len(text.split()) < 2:  # no name, or a name without a value: the help, as Ollama's
            print(PARAMETERS_HELP, file=sys.stderr)
            return
        name, *words = text.split()
        value = words if name == "stop" else parameter_value(words[0])
        try:
            if name not in DEPRECATED_PARAMETERS:  # accepted and ignored, as Ollama's
                Options.parse({name: value})
        except OptionsError as e:
            print(f"Couldn't set parameter: {e}")
            return
        self.session.options[name] = value
        print(f"Set parameter '{name}' to '{', '.join(words)}'")

    def _set_system(self, text: str) -> None:
        """/set system <text>, or a \"\"\"-quoted text over several lines, as Ollama's."""
        if text.startswith(MULTILINE):
            lines = [text[len(MULTILINE) :]]
            while not lines[-1].rstrip().endswith(MULTILINE):
                try:
                    lines.append(self.prompt.prompt("... "))
                except (KeyboardInterrupt, EOFError):
                    print("The system message was not changed.")
                    return
            lines[-1] = lines[-1].rstrip()[: -len(MULTILINE)]
            text = "\n".join(lines).strip()
        else:
            text = text.strip('"')
        if not text:
            print("Usage:\n  /set system <message> or /set system \"\"\"<message>\"\"\"")
            return
        self.session.system = text
        # where the chat is, as Ollama's: a system message in the history, or the last one
        # replaced when it is one
        messages = self.session.messages
        if messages and messages[-1]["role"] == "system":
            messages.pop()
        messages.append({"role": "system", "content": text})
        print("Set system message.")

    def _show(self, rest: str) -> None:
        part = rest or "info"
        if part not in SHOW_PARTS:
            print(f"Usage:\n  /show {' | '.join(SHOW_PARTS)}")
            return
        # the session's system and parameters, as Ollama's: they join /show modelfile's
        body: dict[str, Any] = {"model": self.session.model, "options": self.session.options}
        if self.session.system:
            body["system"] = self.session.system
        shown = self.client.request("POST", "/api/show", body)
        if part == "info":
            print(commands.format_show(shown))
            return
        if part == "parameters":
            print(_parameters(shown.get("parameters", ""), self.session.options))
            return
        value = (self.session.system if part == "system" else "") or shown.get(part, "")
        print(value or f"No {part} was specified for this model.")

    def _load(self, rest: str) -> None:
        if not rest:
            print("Usage:\n  /load <modelname>")
            return
        print(f"Loading model '{rest}'")
        shown = self.client.request("POST", "/api/show", {"model": rest})
        self.client.request("POST", "/api/chat", {"model": rest, "messages": [], "stream": False})
        self.session.model = rest
        self.session.vision = has_vision(shown)
        self.session.messages.clear()

    def _save(self, rest: str) -> None:
        if not rest:
            print("Usage:\n  /save <modelname>")
            return
        body = {"model": rest, "from": self.session.model, "stream": False}
        if self.session.system:
            body["system"] = self.session.system
        if self.session.options:
            body["parameters"] = self.session.options
        if self.session.messages:
            # the model's own messages first (a new list replaces them), as Ollama's /save
            shown = self.client.request("POST", "/api/show", {"model": self.session.model})
            body["messages"] = list(shown.get("messages") or []) + self.session.messages
        self.client.request("POST", "/api/create", body)
        print(f"Created new model '{rest}'")

    def _clear(self, _: str) -> None:
        self.session.messages.clear()
        if self.session.system:  # as Ollama's: the system message stays
            self.session.messages.append({"role": "system", "content": self.session.system})
        print("Cleared session context")


PARAMETERS_HELP = """Available Parameters:
  /set parameter seed <int>             Random number seed
  /set parameter num_predict <int>      Max number of tokens to predict
  /set parameter top_k <int>            Pick from top k num of tokens
  /set parameter top_p <float>          Pick token based on sum of probabilities
  /set parameter min_p <float>          Pick token based on top token probability * min_p
  /set parameter num_ctx <int>          Set the context size
  /set parameter temperature <float>    Set creativity level
  /set parameter repeat_penalty <float> How strongly to penalize repetitions
  /set parameter repeat_last_n <int>    Set how far back to look for repetitions
  /set parameter num_gpu <int>          The number of layers to send to the GPU
  /set parameter stop <string> <string> ...   Set the stop parameters
"""


def parameter_value(text: str) -> int | float | bool | str:
    """A /set parameter value as JSON types it (Options.parse then checks it)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def _parameters(model: str, session: dict[str, object]) -> str:
    """/show parameters, as Ollama's: the model's (its /api/show lines), then the session's
    (/set parameter), a list's values each on its own line."""
    lines = ["Model defined parameters:"]
    lines += [f"  {line}" for line in model.splitlines()] or [
        "  No additional parameters were specified for this model."
    ]
    if session:
        lines += ["", "User defined parameters:"]
        lines += [
            f"  {k:<30} {item}"
            for k, v in sorted(session.items())
            for item in (v if isinstance(v, list) else [v])
        ]
    return "\n".join(lines)


def _history() -> History:
    if envconfig.no_history():
        return InMemoryHistory()
    path = Path("~/.ember/history").expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError:
        return InMemoryHistory()  # no writable home: a session without saved history
    return FileHistory(str(path))
