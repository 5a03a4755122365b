"""The interactive `ember run` in a real terminal (tmux): against the fake server (two turns with
history, `/set parameter temperature 0`, Ctrl-C in the middle of an answer, `\"\"\"` multi-line
input, `/bye`; an image by path for a model with vision), and the same chat with the default
model through a real `ember serve`."""

import re
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
from PIL import Image
from serve_process import Server

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed"),
]

READY = "(/? for help)"  # the placeholder of an empty `>>> ` prompt


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
        """The whole pane, scrollback included."""
        done = subprocess.run(
            ["tmux", "capture-pane", "-p", "-S", "-", "-t", self.name],
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
def ember_run(tmp_path: Path) -> Iterator[Callable[..., Terminal]]:
    """ember_run(server_url, *args): `ember run *args` in a terminal of its own."""
    home = tmp_path / "home"
    home.mkdir()
    terminals: list[Terminal] = []

    def start(url: str, *args: str) -> Terminal:
        terminals.append(Terminal([*EMBER, "run", *args], cli_env(home, url)))
        return terminals[-1]

    yield start
    for term in terminals:
        term.close()


def prompts(screen: str) -> int:
    return sum(1 for line in screen.splitlines() if line.startswith(">>> "))


def ready(screen: str) -> bool:
    return screen.rstrip().endswith(READY)


def test_repl_two_turns_set_parameter_ctrl_c_and_bye(
    ember_run: Callable[..., Terminal], fake: FakeServer
) -> None:
    terminal = ember_run(fake.url, "tiny")
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
    terminal.send("/set think high", "Enter")  # a level, as Ollama's
    terminal.wait_for(lambda s: "Set 'think' mode to 'high'." in s)
    terminal.send("/set nothink", "Enter")
    terminal.wait_for(lambda s: "Set 'nothink' mode." in s)

    # Ctrl-C stops the answer, not the REPL
    terminal.send("tell me a story", "Enter")
    terminal.wait_for(lambda s: "word5 " in s)
    terminal.send("C-c")
    before = terminal.wait_for(lambda s: prompts(s) >= 5 and ready(s))
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


def test_repl_sends_an_image_named_by_path_to_a_vision_model(
    ember_run: Callable[..., Terminal], fake: FakeServer, tmp_path: Path
) -> None:
    fake.vision.add("vismodel")
    Image.new("RGB", (4, 3), "blue").save(tmp_path / "pic.png")
    (tmp_path / "notes.png").write_text("not an image")
    terminal = ember_run(fake.url, "vismodel")
    terminal.wait_for(lambda s: "Send a message" in s)
    terminal.send("/?", "Enter")
    terminal.wait_for(lambda s: "Use /path/to/file to include .jpg, .png, or .webp images." in s)
    # a line that starts with an image's path is a message, not a command
    terminal.send(f"{tmp_path}/pic.png what is this?", "Enter")
    terminal.wait_for(lambda s: "You said: what is this? (temperature None, 1 images)" in s)
    assert f"Added image '{tmp_path}/pic.png'" in terminal.screen()
    [user] = [m for m in fake.bodies("/api/chat")[-1]["messages"] if m["role"] == "user"]
    assert user["content"] == "what is this?" and len(user["images"]) == 1

    # a file that is not an image: one line, nothing sent, the REPL goes on
    chats = len(fake.bodies("/api/chat"))
    terminal.send(f"and {tmp_path}/notes.png", "Enter")
    terminal.wait_for(lambda s: f"Error: '{tmp_path}/notes.png' is not a JPEG" in s and ready(s))
    assert len(fake.bodies("/api/chat")) == chats
    terminal.send("/bye", "Enter")
    terminal.wait_for(lambda s: "EXITED 0" in s)


# ---------------------------------------------------------------- the default model, for real

ANSWER = 180.0  # seconds an answer may take on a busy two-core machine
STAT = re.compile(r"^(prompt eval count|eval count):\s+(\d+) token", re.MULTILINE)


@pytest.fixture
def real_server(tmp_path: Path, smollm2_path: Path) -> Iterator[Server]:
    """`ember serve` on a free loopback port, its store empty: `run` pulls the default model from
    its package."""
    server = Server(tmp_path)
    yield server
    server.stop()


def counts(screen: str) -> list[tuple[int, int]]:
    """(prompt tokens, answer tokens) of each finished answer (`/set verbose` prints them)."""
    values = [int(match[2]) for match in STAT.finditer(screen)]
    return list(zip(values[::2], values[1::2], strict=False))  # the last may be half printed


def answer_after(screen: str, question: str) -> str:
    """What the model wrote after `question` was asked, up to its timings or the next prompt."""
    _, asked, text = screen.rpartition(f">>> {question}\n")
    if not asked:
        return ""
    return re.split(r"^(?:total duration:|>>> )", text, flags=re.MULTILINE)[0].strip()


def ask(terminal: Terminal, question: str, answers: int) -> str:
    """Asks, waits for the `answers`-th finished answer and the next prompt, returns the answer."""
    terminal.send(question, "Enter")
    screen = terminal.wait_for(lambda s: len(counts(s)) >= answers and ready(s), ANSWER)
    return answer_after(screen, question)


def set_parameter(terminal: Terminal, name: str, value: str) -> None:
    terminal.send(f"/set parameter {name} {value}", "Enter")
    terminal.wait_for(lambda s: f"Set parameter '{name}' to '{value}'" in s)


@pytest.mark.model
@pytest.mark.slow
def test_repl_with_the_default_model_through_a_real_server(
    real_server: Server, ember_run: Callable[..., Terminal]
) -> None:
    # the server first: the terminal closes before it stops, no answer keeps it waiting
    terminal = ember_run(real_server.url)  # no model: the default, pulled then loaded
    terminal.wait_for(lambda s: "Send a message" in s, timeout=300)
    set_parameter(terminal, "num_predict", "60")  # a tiny model may never stop by itself
    terminal.send("/set verbose", "Enter")
    terminal.wait_for(lambda s: "Set 'verbose' mode." in s)

    assert ask(terminal, "My name is Zorblax. Say hello to me.", answers=1)
    set_parameter(terminal, "temperature", "0")
    assert ask(terminal, "What is my name?", answers=2)
    (first_prompt, first_answer), (second_prompt, _) = counts(terminal.screen())
    # the second prompt carried the first question and answer: two turns of history (a few
    # tokens of slack: the answer is tokenized anew)
    assert second_prompt > first_prompt + first_answer - 5

    # Ctrl-C while the model writes: the answer stops, the REPL stays
    set_parameter(terminal, "num_predict", "400")
    story = "Write a long story about a dragon."
    terminal.send(story, "Enter")
    terminal.wait_for(lambda s: len(answer_after(s, story)) > 80, ANSWER)
    terminal.send("C-c")
    stopped = terminal.wait_for(ready, ANSWER)
    assert len(answer_after(stopped, story)) > 80
    assert_still(terminal, stopped, seconds=1.5)
    assert len(counts(stopped)) == 2  # the story never finished: no timings for it
    assert "Use Ctrl + d or /bye to exit." not in stopped  # Ctrl-C came before the prompt did

    set_parameter(terminal, "num_predict", "60")
    assert ask(terminal, "What is 2 + 2?", answers=3)
    terminal.send("/bye", "Enter")
    terminal.wait_for(lambda s: "EXITED 0" in s)


def assert_still(terminal: Terminal, screen: str, seconds: float) -> None:
    """The screen stays as it is for `seconds`: nothing writes to it any more."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert terminal.screen() == screen, "the screen still changes after Ctrl-C"
        time.sleep(0.1)
