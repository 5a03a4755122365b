"""The interactive `ember run` (Ollama's REPL): `>>> ` prompt with history, `\"\"\"` multi-line
input, /set, /show, /load, /save, /clear, /bye. Ctrl-C stops an answer, not the REPL; Ctrl-D or
/bye leaves. A model with vision takes image files by path, even a line that starts with one."""

import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from prompt_toolkit import PromptSession
from prompt_toolkit.history import FileHistory, History

from ember import envconfig
from ember.cli import commands
from ember.cli.chat import Session, chat_turn, load_model
from ember.cli.client import Client, CLIError
from ember.cli.gotext import go_quote
from ember.cli.images import HELP as IMAGES_HELP
from ember.cli.images import has_vision, starts_with_image_path
from ember.cli.parameters import ParameterError, format_param
from ember.errors import EmberError

# Ollama's help texts, printed to stderr as its REPL prints them
HELP = """Available Commands:
  /set            Set session variables
  /show           Show model information
  /load <model>   Load a session or model
  /save <model>   Save your current session
  /clear          Clear session context
  /bye            Exit
  /?, /help       Help for a command
  /? shortcuts    Help for keyboard shortcuts

Use \"\"\" to begin a multi-line message.
"""
SET_HELP = """Available Commands:
  /set parameter ...     Set a parameter
  /set system <string>   Set system message
  /set history           Enable history
  /set nohistory         Disable history
  /set wordwrap          Enable wordwrap
  /set nowordwrap        Disable wordwrap
  /set format json       Enable JSON mode
  /set noformat          Disable formatting
  /set verbose           Show LLM stats
  /set quiet             Disable LLM stats
  /set think             Enable thinking
  /set nothink           Disable thinking
"""
SHOW_HELP = """Available Commands:
  /show info         Show details for this model
  /show license      Show model license
  /show modelfile    Show Modelfile for this model
  /show parameters   Show parameters for this model
  /show system       Show system message
  /show template     Show prompt template
"""
# Ollama's list less Ctrl + g (an external editor), which this prompt does not bind
SHORTCUTS_HELP = """Available keyboard shortcuts:
  Ctrl + a            Move to the beginning of the line (Home)
  Ctrl + e            Move to the end of the line (End)
   Alt + b            Move back (left) one word
   Alt + f            Move forward (right) one word
  Ctrl + k            Delete the sentence after the cursor
  Ctrl + u            Delete the sentence before the cursor
  Ctrl + w            Delete the word before the cursor

  Ctrl + l            Clear the screen
  Ctrl + c            Stop the model from responding
  Ctrl + d            Exit ember (/bye)
"""
# /? TOPIC: Ollama's topics; another prints nothing, as Ollama's
HELP_TOPICS = {"set": SET_HELP, "/set": SET_HELP, "show": SHOW_HELP, "/show": SHOW_HELP}
HELP_TOPICS |= {"shortcut": SHORTCUTS_HELP, "shortcuts": SHORTCUTS_HELP}
MULTILINE = '"""'


class Repl:
    def __init__(self, client: Client, session: Session) -> None:
        self.client, self.session = client, session
        self.history = SessionHistory(Path("~/.ember/history").expanduser())
        self.prompt: PromptSession[str] = PromptSession(history=self.history)

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
        if not rest:
            _usage(HELP + (IMAGES_HELP if self.session.vision else ""))
        elif rest.split()[0] in HELP_TOPICS:
            _usage(HELP_TOPICS[rest.split()[0]])

    def _set(self, rest: str) -> None:
        what, _, value = rest.partition(" ")
        flags = {
            "verbose": ("verbose", True, "Set 'verbose' mode."),
            "quiet": ("verbose", False, "Set 'quiet' mode."),
            "think": ("think", True, "Set 'think' mode."),
            "nothink": ("think", False, "Set 'nothink' mode."),
            "noformat": ("format", None, "Disabled format."),
            "wordwrap": ("word_wrap", True, "Set 'wordwrap' mode."),
            "nowordwrap": ("word_wrap", False, "Set 'nowordwrap' mode."),
        }
        if what in ("history", "nohistory"):  # silent, as Ollama's
            self.history.saving = what == "history"
        elif what == "think" and value.strip():  # a level: /set think high, as Ollama's
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
        elif what == "system" and not value.strip():
            _usage(SET_HELP)  # as Ollama's: no text is the help, not an empty message
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
            _usage(SET_HELP)

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
            _usage(PARAMETERS_HELP)
            return
        name, *words = text.split()
        try:
            self.session.options[name] = format_param(name, words)
        except ParameterError as e:
            print(f"Couldn't set parameter: {go_quote(str(e))}")
            return
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
        if not rest:
            _usage(SHOW_HELP)
            return
        # the session's system and parameters, as Ollama's: they join /show modelfile's
        body: dict[str, Any] = {"model": self.session.model, "options": self.session.options}
        if self.session.system:
            body["system"] = self.session.system
        shown = self.client.request("POST", "/api/show", body)
        part = rest.split()[0]
        # info goes where Ollama's goes (stderr, with the help texts); the rest to stdout
        print(self._shown_part(part, shown), file=sys.stderr if part == "info" else sys.stdout)

    def _shown_part(self, part: str, shown: dict[str, Any]) -> str:
        """/show PART's text, with Ollama's words for what the model does not have."""
        if part == "info":
            return commands.format_show(shown)
        if part == "parameters":
            return _parameters(shown.get("parameters", ""), self.session.options)
        if part == "system":
            system = self.session.system or shown.get("system")
            return system + "\n" if system else "No system message was specified for this model."
        if part == "template":
            return shown.get("template") or "No prompt template was specified for this model."
        if part == "license":
            return shown.get("license") or "No license was specified for this model."
        if part == "modelfile":
            return str(shown.get("modelfile", ""))
        return f"Unknown command '/show {part}'. Type /? for help"

    def _load(self, rest: str) -> None:
        """/load MODEL, as Ollama's: a model that is not there leaves the session as it was."""
        if len(rest.split()) != 1:
            print("Usage:\n  /load <modelname>")
            return
        print(f"Loading model '{rest}'")
        before = (self.session.model, self.session.messages, self.session.vision)
        self.session.model, self.session.messages = rest, []
        try:
            shown = self.client.request("POST", "/api/show", {"model": rest})
            self.session.vision = has_vision(shown)
            load_model(self.client, self.session)
        except CLIError as e:
            if "not found" in str(e):
                print(f"Couldn't find model '{rest}'")
                self.session.model, self.session.messages, self.session.vision = before
            elif "does not support thinking" in str(e):
                print(f"error: {e}")  # the model stays chosen, as Ollama's
            else:
                raise

    def _save(self, rest: str) -> None:
        if len(rest.split()) != 1:
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
        try:
            self.client.request("POST", "/api/create", body)
        except CLIError as e:
            if "invalid model name" not in str(e):
                raise
            print(f"error: The model name '{rest}' is invalid")
            return
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


def _usage(text: str) -> None:
    print(text, file=sys.stderr)


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


class SessionHistory(History):
    """The REPL's history, kept in ~/.ember/history while `saving`: EMBER_NOHISTORY and
    /set nohistory stop writing it, /set history resumes (Ollama's HistoryDisable and
    HistoryEnable); the lines of the session are recalled either way."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path, self.file = path, FileHistory(str(path))
        self.saving = not envconfig.no_history()

    def load_history_strings(self) -> Iterable[str]:
        try:
            return list(self.file.load_history_strings())
        except OSError:
            return []

    def store_string(self, string: str) -> None:
        if not self.saving:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.file.store_string(string)
        except OSError:
            pass  # no writable home: a session without saved history
