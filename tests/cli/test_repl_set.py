"""The REPL's commands (/set, /show, /load, /save, /?) on a session, without a terminal or a
server: what they print and keep, as Ollama's REPL (the whole REPL in a real terminal:
test_repl_tmux.py)."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from ember.cli.chat import Session
from ember.cli.client import Client, CLIError
from ember.cli.repl import SET_HELP, SHORTCUTS_HELP, SHOW_HELP, Repl, SessionHistory


@pytest.fixture
def repl() -> Iterator[Repl]:
    with create_pipe_input() as pipe:
        r = Repl(Client("http://127.0.0.1:9"), Session("tiny"))  # never called
        r.prompt.app.input, r.prompt.app.output = pipe, DummyOutput()
        yield r


def continued(repl: Repl, *lines: str) -> None:
    """The lines the REPL reads after the command (its `... ` prompts)."""
    rest = iter(lines)
    repl.prompt.prompt = lambda *_a, **_k: next(rest)  # type: ignore[method-assign]


@pytest.mark.parametrize(
    ("command", "error"),
    [
        ("/set parameter num_ctx 2.5", '"invalid int value [2.5]"'),
        ("/set parameter seed x 2", '"invalid int value [x 2]"'),  # Go's %s of the words
        ("/set parameter temperature abc", '"invalid float value [abc]"'),
        ("/set parameter use_mmap maybe", '"invalid bool value [maybe]"'),
        ("/set parameter foo 1", "\"unknown parameter 'foo'\""),
        ("/set parameter penalize_newline true", "\"unknown parameter 'penalize_newline'\""),
        ("/set parameter num_ctx 0", "\"option 'num_ctx' must be at least 1, got 0\""),
    ],
)
def test_set_parameter_refuses_a_bad_value_as_ollama(
    repl: Repl, capsys, command: str, error: str
) -> None:
    """As Ollama's api.FormatParams, its error printed with %q; a bad value is not kept (a
    kept one failed every later message)."""
    repl._command(command)
    assert capsys.readouterr().out == f"Couldn't set parameter: {error}\n"
    assert repl.session.options == {}


def test_set_parameter_types_the_value(repl: Repl, capsys) -> None:
    for command in ("temperature 0.5", "num_ctx 2048", "use_mmap false", "main_gpu 1"):
        repl._command(f"/set parameter {command}")
    assert "Set parameter 'main_gpu' to '1'" in capsys.readouterr().out
    options = {"temperature": 0.5, "num_ctx": 2048, "use_mmap": False, "main_gpu": 1}
    assert repl.session.options == options
    repl._command("/set parameter top_p 1")  # sent as Go's JSON writes a whole float32: 1
    assert json.dumps(repl.session.options["top_p"]) == "1"


def test_set_parameter_stop_takes_each_word_as_a_stop_string(repl: Repl, capsys) -> None:
    repl._command("/set parameter stop a b c")
    assert repl.session.options["stop"] == ["a", "b", "c"]
    assert "Set parameter 'stop' to 'a, b, c'" in capsys.readouterr().out
    repl._command("/set parameter stop END")  # replaces the list, as Ollama's
    assert repl.session.options["stop"] == ["END"]


def test_set_system_over_several_lines(repl: Repl, capsys) -> None:
    continued(repl, "Always bark.", 'Never meow."""')
    repl._command('/set system """You are a dog.')
    assert repl.session.system == "You are a dog.\nAlways bark.\nNever meow."
    assert "Set system message." in capsys.readouterr().out
    repl._command('/set system """One line."""')
    assert repl.session.system == "One line."
    capsys.readouterr()
    repl._command("/set system")  # no text: /set's help, as Ollama's; the message kept
    assert capsys.readouterr().err == SET_HELP + "\n" and repl.session.system == "One line."


def test_unknown_set_commands_and_formats_are_named(repl: Repl, capsys) -> None:
    repl._command("/set foo")
    assert "Unknown command '/set foo'. Type /? for help" in capsys.readouterr().out
    repl._command("/set format xml")
    assert "Invalid or missing format" in capsys.readouterr().out and repl.session.format is None


class ShowOnly:
    """A client whose /api/show answers a model with one parameter."""

    def request(self, method: str, path: str, body: object = None) -> dict[str, str]:
        return {"parameters": "num_ctx                        512"}


def test_show_parameters_names_the_models_and_the_sessions(repl: Repl, capsys) -> None:
    repl.client = ShowOnly()  # type: ignore[assignment]
    repl._command("/set parameter stop a b")
    capsys.readouterr()
    repl._command("/show parameters")
    assert capsys.readouterr().out.splitlines() == [
        "Model defined parameters:",
        "  num_ctx                        512",
        "",
        "User defined parameters:",
        f"  {'stop':<30} a",
        f"  {'stop':<30} b",
    ]


def test_set_think_warns_of_a_model_that_cannot_think(repl: Repl, capsys) -> None:
    repl.client = ShowOnly()  # no capabilities: no thinking
    repl._command("/set think")
    said = capsys.readouterr()
    assert 'warning: model "tiny" does not support thinking output' in said.err
    assert "Set 'think' mode." in said.out and repl.session.think is True


class Recorder:
    """A client that records what the REPL sends; /api/show answers a model with a MESSAGE."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []

    def request(self, method: str, path: str, body: object = None) -> dict[str, object]:
        self.sent.append((path, body))
        return {"messages": [{"role": "user", "content": "Hello"}]} if path == "/api/show" else {}


def test_save_keeps_the_models_messages_before_the_sessions(repl: Repl, capsys) -> None:
    repl.client = recorder = Recorder()  # type: ignore[assignment]
    repl.session.messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hi!"},
    ]
    repl._command("/save saved")
    assert "Created new model 'saved'" in capsys.readouterr().out
    path, body = recorder.sent[-1]
    assert path == "/api/create" and isinstance(body, dict)
    # a create's messages replace the model's: Ollama's /save sends the model's first
    assert body["messages"] == [{"role": "user", "content": "Hello"}, *repl.session.messages]


def test_show_sends_the_sessions_system_and_parameters(repl: Repl, capsys) -> None:
    repl.client = recorder = Recorder()  # type: ignore[assignment]
    repl._command("/set system Be brief.")
    repl._command("/set parameter seed 3")
    repl._command("/show modelfile")
    assert recorder.sent[-1] == (
        "/api/show",
        {"model": "tiny", "options": {"seed": 3}, "system": "Be brief."},
    )


def test_set_parameter_without_a_value_prints_the_parameters(repl: Repl, capsys) -> None:
    for command in ("/set parameter", "/set parameter seed"):  # the first had crashed the REPL
        repl._command(command)
        assert capsys.readouterr().err.startswith("Available Parameters:\n  /set parameter seed")
    assert repl.session.options == {}


def test_set_system_joins_the_history_where_the_chat_is(repl: Repl, capsys) -> None:
    """As Ollama's REPL: a system message at that point, the last one replaced when it is one;
    /clear keeps it."""
    said = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]
    repl.session.messages = list(said)
    repl._command("/set system Be brief.")
    repl._command("/set system Be very brief.")
    assert repl.session.messages[2:] == [{"role": "system", "content": "Be very brief."}]
    assert len(repl.session.messages) == 3
    repl._command("/clear")
    assert repl.session.messages == [{"role": "system", "content": "Be very brief."}]


def test_help_topics_as_ollamas(repl: Repl, capsys) -> None:
    repl._command("/?")
    general = capsys.readouterr().err
    assert '  /? shortcuts    Help for keyboard shortcuts\n\nUse """' in general
    for command, text in [
        ("/? show", SHOW_HELP),
        ("/help show", SHOW_HELP),
        ("/? /show", SHOW_HELP),
        ("/? shortcuts", SHORTCUTS_HELP),
        ("/? shortcut", SHORTCUTS_HELP),
        ("/? set", SET_HELP),
        ("/? /set", SET_HELP),
        ("/set", SET_HELP),
        ("/show", SHOW_HELP),  # no part: the help, asking nothing of the server
    ]:
        repl._command(command)
        assert capsys.readouterr() == ("", text + "\n"), command
    repl._command("/? nothing")  # another topic: nothing, as Ollama's
    assert capsys.readouterr() == ("", "")
    assert "  /set wordwrap          Enable wordwrap\n" in SET_HELP
    assert "  /set think             Enable thinking\n" in SET_HELP


class Shows:
    """A client whose /api/show answers `shown` (a model without system or template)."""

    def __init__(self, shown: dict[str, Any] | None = None) -> None:
        self.shown = shown or {}

    def request(self, method: str, path: str, body: object = None) -> dict[str, Any]:
        return self.shown


def test_show_says_what_the_model_does_not_have(repl: Repl, capsys) -> None:
    repl.client = Shows()  # type: ignore[assignment]
    for part, said in [
        ("system", "No system message was specified for this model."),
        ("template", "No prompt template was specified for this model."),
        ("license", "No license was specified for this model."),
        ("foo", "Unknown command '/show foo'. Type /? for help"),
    ]:
        repl._command(f"/show {part}")
        assert capsys.readouterr().out == said + "\n"
    repl.client = Shows({"system": "Be kind.", "template": "{{ .Prompt }}"})  # type: ignore
    repl._command("/show system")
    assert capsys.readouterr().out == "Be kind.\n\n"  # Ollama's blank line after it
    repl._command("/show template")
    assert capsys.readouterr().out == "{{ .Prompt }}\n"


def test_set_wordwrap_and_history(repl: Repl, capsys) -> None:
    repl._command("/set nowordwrap")
    assert capsys.readouterr().out == "Set 'nowordwrap' mode.\n" and not repl.session.word_wrap
    repl._command("/set wordwrap")
    assert capsys.readouterr().out == "Set 'wordwrap' mode.\n" and repl.session.word_wrap
    repl._command("/set nohistory")
    assert capsys.readouterr() == ("", "") and not repl.history.saving
    repl._command("/set history")
    assert capsys.readouterr() == ("", "") and repl.history.saving


def test_nohistory_stops_writing_the_history_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("EMBER_NOHISTORY", raising=False)
    path = tmp_path / "home" / ".ember" / "history"
    history = SessionHistory(path)
    history.append_string("kept")
    history.saving = False  # /set nohistory
    history.append_string("not kept")
    assert history.get_strings() == ["kept", "not kept"]  # recalled in the session either way
    history.saving = True  # /set history
    history.append_string("kept again")
    assert list(SessionHistory(path).load_history_strings()) == ["kept again", "kept"]


class Models:
    """A client that knows the models in `known` (any other is not found, as the server says)
    and records what it is sent; `thinking` may say that a model cannot think."""

    def __init__(self, *known: str, thinking: bool = True) -> None:
        self.known, self.thinking = known, thinking
        self.sent: list[tuple[str, Any]] = []

    def request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        self.sent.append((path, body))
        name = body.get("model", "")
        if path in ("/api/show", "/api/generate") and name not in self.known:
            raise CLIError(f"model '{name}' not found")
        if path == "/api/generate" and body.get("think") and not self.thinking:
            raise CLIError(f'"{name}" does not support thinking')
        if path == "/api/create" and "!" in name:
            raise CLIError(f"invalid model name {name!r}: the name has a character not allowed")
        return {}


def test_load_of_a_missing_model_keeps_the_session(repl: Repl, capsys) -> None:
    repl.client = Models("tiny", "other")  # type: ignore[assignment]
    repl.session.messages = [{"role": "user", "content": "Hi"}]
    repl.session.options = {"seed": 3}
    repl._command("/load nosuch")
    assert capsys.readouterr().out == "Loading model 'nosuch'\nCouldn't find model 'nosuch'\n"
    assert repl.session.model == "tiny" and repl.session.messages[0]["content"] == "Hi"
    assert repl.session.options == {"seed": 3}
    repl._command("/load a b")
    assert capsys.readouterr().out == "Usage:\n  /load <modelname>\n"
    repl.session.keep_alive, repl.session.think = "10m", "high"
    repl._command("/load other")
    assert repl.session.model == "other" and repl.session.messages == []
    # loaded as Ollama's loadOrUnloadModel: with keep_alive and think
    body = {"model": "other", "stream": False, "keep_alive": "10m", "think": "high"}
    assert repl.client.sent[-1] == ("/api/generate", body)  # type: ignore[attr-defined]


def test_load_of_a_model_that_cannot_think_says_so(repl: Repl, capsys) -> None:
    repl.client = Models("tiny", "other", thinking=False)  # type: ignore[assignment]
    repl.session.think = True
    repl._command("/load other")
    said = capsys.readouterr().out
    assert said == "Loading model 'other'\nerror: \"other\" does not support thinking\n"


def test_save_names_an_invalid_name_and_takes_one_name(repl: Repl, capsys) -> None:
    repl.client = Models("tiny")  # type: ignore[assignment]
    repl._command("/save bad!name")
    assert capsys.readouterr().out == "error: The model name 'bad!name' is invalid\n"
    repl._command("/save a b")
    assert capsys.readouterr().out == "Usage:\n  /save <modelname>\n"
    assert [path for path, _ in repl.client.sent] == ["/api/create"]  # type: ignore[attr-defined]
