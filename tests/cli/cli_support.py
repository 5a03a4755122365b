"""What the CLI tests share besides fixtures: how `ember` is started and the environment it gets
(a module of its own: `from conftest import` would pick whichever conftest pytest loaded last)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

EMBER = [sys.executable, "-m", "ember"]

Ember = Callable[..., subprocess.CompletedProcess[str]]


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


def one_line_error(stderr: str) -> bool:
    """What every failing command prints: `Error: ...` on one line, no traceback."""
    return stderr.startswith("Error: ") and stderr.count("\n") == 1 and "Traceback" not in stderr
