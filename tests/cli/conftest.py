"""Fixtures of the CLI tests: a fake Ollama-API server, a tiny GGUF, and `ember` run as a user
runs it (a subprocess pointed at the server with EMBER_HOST, in a home of its own)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import EMBER, Ember, cli_env
from fake_server import FakeServer

# `ember serve` as a child process (serve_process.Server) is shared with the server's tests
sys.path.append(str(Path(__file__).resolve().parents[1] / "server"))


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
