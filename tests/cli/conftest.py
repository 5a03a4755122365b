"""Fixtures of the CLI tests: a fake Ollama-API server, a tiny GGUF, and `ember` run as a user
runs it (a subprocess pointed at the server with EMBER_HOST, in a home of its own)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fake_server import FakeServer

EMBER = [sys.executable, "-m", "ember"]

Ember = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers", reason="tiny models are built with HF transformers")
    import tinymodels

    path = tmp_path_factory.mktemp("cli-gguf") / "tiny.gguf"
    tinymodels.write_tiny_gguf("llama", path, ggml_type="Q8_0")
    return path


@pytest.fixture
def fake(tmp_path: Path, tiny_gguf: Path) -> Iterator[FakeServer]:
    with FakeServer(tmp_path / "server", gguf=tiny_gguf) as server:
        yield server


def cli_env(home: Path, host: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EMBER_")}
    env.update(
        HOME=str(home),
        EMBER_HOST=host,
        EMBER_MODELS=str(home / ".ember" / "models"),
        EMBER_NOHISTORY="1",
        NO_COLOR="1",
    )
    return env


@pytest.fixture
def ember(tmp_path: Path, fake: FakeServer) -> Ember:
    """ember(*args, stdin="...") against the fake server."""
    home = tmp_path / "home"
    home.mkdir()

    def run(
        *args: str, stdin: str = "", cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*EMBER, *args],
            input=stdin,
            text=True,
            capture_output=True,
            timeout=120,
            env=cli_env(home, fake.url),
            cwd=cwd,
        )

    return run
