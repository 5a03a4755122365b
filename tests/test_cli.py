"""The `ember` command as a user runs it: answers, errors in one line, exit codes."""

import subprocess
import sys

import pytest


def ember(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ember", *args],
        input=stdin,
        text=True,
        capture_output=True,
        timeout=300,
    )


def test_version():
    result = ember("--version")
    assert result.returncode == 0 and result.stdout.startswith("ember version ")


@pytest.mark.model
@pytest.mark.e2e
def test_run_answers_a_prompt_from_stdin():
    result = ember(
        "run",
        "smollm2:135m",
        "--temperature",
        "0",
        "--num-predict",
        "12",
        "--verbose",
        stdin="Why is the sky blue?",
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip()) > 10
    assert "eval rate:" in result.stderr


def test_unknown_model_is_one_line_and_nonzero():
    result = ember("run", "nosuchmodel:7b", "hello")
    assert result.returncode == 1
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


def test_crafted_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 60)
    result = ember("run", str(bad), "hello")
    assert result.returncode == 1 and result.stderr.startswith("Error: ")
    assert "Traceback" not in result.stderr
