"""The REPL's /set commands on a session, without a terminal or a server: what they print and
keep (the whole REPL in a real terminal: test_repl_tmux.py)."""

from collections.abc import Iterator

import pytest
from prompt_toolkit.input import create_pipe_input
from prompt_toolkit.output import DummyOutput

from ember.cli.chat import Session
from ember.cli.client import Client
from ember.cli.repl import Repl


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


def test_set_parameter_checks_the_value_at_once(repl: Repl, capsys) -> None:
    repl._command("/set parameter temperature hot")
    said = capsys.readouterr().out
    assert "Couldn't set parameter: option 'temperature' must be a number" in said
    repl._command("/set parameter foo 1")
    assert "Couldn't set parameter: unknown option 'foo'" in capsys.readouterr().out
    assert repl.session.options == {}
    repl._command("/set parameter temperature 0.5")
    assert "Set parameter 'temperature' to '0.5'" in capsys.readouterr().out
    repl._command("/set parameter penalize_newline true")  # Ollama's, deprecated: ignored
    assert repl.session.options == {"temperature": 0.5, "penalize_newline": True}


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
    repl._command("/set system")  # no text: the usage, the message kept
    assert "Usage" in capsys.readouterr().out and repl.session.system == "One line."


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
