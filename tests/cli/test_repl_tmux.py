"""The interactive `ember run` in a real terminal (tmux), against the fake server: two turns with
history, `/set parameter temperature 0`, Ctrl-C in the middle of an answer, `\"\"\"` multi-line
input, and `/bye`."""

import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cli_support import EMBER, cli_env
from fake_server import FakeServer

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]


class Terminal:
    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.name = f"ember-test-{uuid.uuid4().hex[:8]}"
        exports = " ".join(
            f"{k}={shlex.quote(v)}"
            for k, v in env.items()
            if k.startswith(("EMBER_", "HOME", "NO_COLOR", "PATH"))
        )
        script = f"env {exports} {shlex.join(command)}; echo EXITED $?; sleep 600"
        subprocess.run(
            ["tmux", "new-session", "-d", "-s", self.name, "-x", "160", "-y", "50", script],
            check=True,
        )

    def screen(self) -> str:
        done = subprocess.run(
            ["tmux", "capture-pane", "-p", "-S", "-200", "-t", self.name],
            capture_output=True,
            text=True,
        )
        return done.stdout

    def send(self, *keys: str) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *keys], check=True)

    def wait_for(self, test: Callable[[str], bool], timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if test(screen):
                return screen
            time.sleep(0.1)
        raise AssertionError(f"timed out; the screen was:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


@pytest.fixture
def terminal(tmp_path: Path, fake: FakeServer) -> Iterator[Terminal]:
    home = tmp_path / "home"
    home.mkdir()
    term = Terminal([*EMBER, "run", "tiny"], cli_env(home, fake.url))
    try:
        yield term
    finally:
        term.close()


def prompts(screen: str) -> int:
    return sum(1 for line in screen.splitlines() if line.startswith(">>> "))


def test_repl_two_turns_set_parameter_ctrl_c_and_bye(terminal: Terminal, fake: FakeServer) -> None:
    terminal.wait_for(lambda s: "Send a message" in s)
    terminal.send("hello there", "Enter")
    terminal.wait_for(lambda s: "You said: hello there (temperature None)" in s)
    terminal.send("/set parameter temperature 0", "Enter")
    terminal.wait_for(lambda s: "Set parameter 'temperature' to '0'" in s)
    terminal.send("and again", "Enter")
    terminal.wait_for(lambda s: "You said: and again (temperature 0)" in s)
    chat = fake.bodies("/api/chat")[-1]
    assert [m["role"] for m in chat["messages"]] == ["user", "assistant", "user"]
    assert chat["messages"][1]["content"].startswith("You said: hello there")
    assert chat["options"] == {"temperature": 0}

    # Ctrl-C stops the answer, not the REPL
    terminal.send("tell me a story", "Enter")
    terminal.wait_for(lambda s: "word5 " in s)
    terminal.send("C-c")
    before = terminal.wait_for(lambda s: prompts(s) >= 5 and s.rstrip().endswith("(/? for help)"))
    assert "word399" not in before
    terminal.send('"""first line', "Enter", 'second line"""', "Enter")
    terminal.wait_for(lambda s: "You said: first line\nsecond line (temperature 0)" in s)
    last = fake.bodies("/api/chat")[-1]["messages"]
    # the interrupted answer was dropped; its question stays, as Ollama's
    assert [m["content"] for m in last if m["role"] == "user"][-2:] == [
        "tell me a story",
        "first line\nsecond line",
    ]
    terminal.send("/bye", "Enter")
    terminal.wait_for(lambda s: "EXITED 0" in s)
