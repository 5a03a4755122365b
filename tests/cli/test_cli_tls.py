"""The CLI's side of HTTPS, in-process: EMBER_TLS_CERT without EMBER_TLS_KEY (or files that
are no certificate) is a one-line error before `ember serve` starts anything, an unreadable
SSL_CERT_FILE is one too, and `ember run` starts no local server for an https host it cannot
serve. (The real clients over TLS: tests/server/test_tls_e2e.py.)"""

from pathlib import Path

import pytest

from ember.cli.app import main
from ember.runner.client import free_port


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("EMBER_TLS_CERT", "EMBER_TLS_KEY", "SSL_CERT_FILE", "EMBER_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("EMBER_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("EMBER_HOST", f"127.0.0.1:{free_port()}")
    return tmp_path


def one_line_error(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and err.count("\n") == 1, err
    return err


def test_a_certificate_without_its_key_is_a_one_line_error(monkeypatch, capsys, home) -> None:
    monkeypatch.setenv("EMBER_TLS_CERT", str(home / "server.pem"))
    assert main(["serve"]) == 1
    err = one_line_error(capsys)
    assert "EMBER_TLS_CERT and EMBER_TLS_KEY go together: EMBER_TLS_KEY is not set" in err
    monkeypatch.delenv("EMBER_TLS_CERT")
    monkeypatch.setenv("EMBER_TLS_KEY", str(home / "server.key"))
    assert main(["serve"]) == 1
    assert "EMBER_TLS_CERT is not set" in one_line_error(capsys)


def test_files_that_are_missing_or_no_certificate_are_one_line_errors(
    monkeypatch, capsys, home
) -> None:
    monkeypatch.setenv("EMBER_TLS_CERT", str(home / "missing.pem"))
    monkeypatch.setenv("EMBER_TLS_KEY", str(home / "missing.key"))
    assert main(["serve"]) == 1
    assert "no such file" in one_line_error(capsys)
    (home / "junk.pem").write_text("not a certificate\n")
    monkeypatch.setenv("EMBER_TLS_CERT", str(home / "junk.pem"))
    monkeypatch.setenv("EMBER_TLS_KEY", str(home / "junk.pem"))
    assert main(["serve"]) == 1
    assert "cannot use" in one_line_error(capsys)


def test_an_unreadable_ssl_cert_file_is_a_one_line_error(monkeypatch, capsys, home) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(home / "no-ca.pem"))
    assert main(["ps"]) == 1
    assert "SSL_CERT_FILE" in one_line_error(capsys)


def test_run_starts_no_local_server_for_an_https_host(monkeypatch, capsys, home) -> None:
    monkeypatch.setenv("EMBER_HOST", f"https://127.0.0.1:{free_port()}")
    assert main(["run", "smollm2:135m", "hi"]) == 1
    err = one_line_error(capsys)
    assert "could not connect" in err and "EMBER_TLS_CERT" in err
    assert not (home / "server.log").exists()  # nothing was started
