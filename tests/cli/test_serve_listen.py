"""`ember serve` binds its address before it starts anything: an address it cannot listen on is
a one-line error and exit 1, as Ollama's `listen tcp ...: bind: ...`, never a "Listening on"
line followed by uvicorn's failure."""

import socket
from pathlib import Path

import pytest

from ember.cli.app import main


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("EMBER_TLS_CERT", "EMBER_TLS_KEY", "EMBER_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("EMBER_MODELS", str(tmp_path / "models"))
    return tmp_path


def test_a_port_in_use_is_a_one_line_error(monkeypatch, capsys, home) -> None:
    (home / "server.pid").write_text("4242\n")  # the server that holds the port
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        monkeypatch.setenv("EMBER_HOST", f"127.0.0.1:{port}")
        assert main(["serve"]) == 1
    captured = capsys.readouterr()
    assert captured.err == f"Error: listen tcp 127.0.0.1:{port}: bind: address already in use\n"
    assert captured.out == ""
    # a start that lost the port leaves the running server's pid (a race of two `ember run`)
    assert (home / "server.pid").read_text() == "4242\n"


def test_an_address_not_of_this_machine_is_a_one_line_error(monkeypatch, capsys) -> None:
    monkeypatch.setenv("EMBER_HOST", "192.0.2.1:11434")  # TEST-NET-1: no interface has it
    assert main(["serve"]) == 1
    err = capsys.readouterr().err
    assert err == "Error: listen tcp 192.0.2.1:11434: bind: cannot assign requested address\n"


def test_a_store_that_cannot_be_made_is_a_one_line_error(monkeypatch, capsys, home) -> None:
    (home / "a-file").write_text("not a folder")
    monkeypatch.setenv("EMBER_MODELS", str(home / "a-file"))
    monkeypatch.setenv("EMBER_HOST", "127.0.0.1:0")
    assert main(["serve"]) == 1
    err = capsys.readouterr().err
    assert err == f"Error: mkdir {home / 'a-file' / 'manifests'}: not a directory\n"
