"""`ember serve` (delegated to ember.server) and starting a server in the background when `run`
finds none: a detached `ember serve`, its output in ~/.ember/server.log, waited for."""

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

from ember import envconfig
from ember.cli.client import Client, CLIError

START_TIMEOUT = 60.0  # seconds a background server may take to answer


def serve() -> int:
    """Runs the server in this process until it is stopped: ember.server's serve() when the
    server offers one, else its app factory under uvicorn."""
    package_serve = getattr(importlib.import_module("ember.server"), "serve", None)
    if callable(package_serve):
        return _status(package_serve())
    try:
        app_module = importlib.import_module("ember.server.app")
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("ember.server"):
            raise CLIError("this build of ember has no server (ember.server.app is missing)") from e
        raise
    main = getattr(app_module, "serve", None) or getattr(app_module, "main", None)
    if callable(main):
        return _status(main())
    if not hasattr(app_module, "create_app"):
        raise CLIError("ember.server.app has neither serve() nor create_app()")
    import uvicorn

    address = envconfig.host()
    uvicorn.run(
        "ember.server.app:create_app",
        factory=True,
        host=address.host or "127.0.0.1",
        port=address.port,
        log_level="warning",
    )
    return 0


def _status(result: object) -> int:
    return result if isinstance(result, int) else 0


def log_path() -> Path:
    """Where a background server writes its output (beside the model store)."""
    return envconfig.models_dir().parent / "server.log"


def ensure_server(client: Client) -> None:
    """Starts `ember serve` in the background when no server answers, and waits for it. Only
    for a local address (a remote server is someone else's to start), and for https only with
    a certificate to serve it with."""
    if client.is_running():
        return
    address = envconfig.host()
    if not address.is_loopback and address.host not in ("", "0.0.0.0", "::"):
        raise CLIError(f"could not connect to ember server at {client.base_url}")
    if address.scheme == "https" and envconfig.tls_files() is None:
        raise CLIError(
            f"could not connect to ember server at {client.base_url} (a local server is started "
            "for https only with EMBER_TLS_CERT and EMBER_TLS_KEY set)"
        )
    process = _spawn()
    deadline = time.monotonic() + START_TIMEOUT
    while not client.is_running():
        if process.poll() is not None:
            raise CLIError(f"the ember server did not start: {_last_log_line()}")
        if time.monotonic() > deadline:
            raise CLIError(f"the ember server did not answer within {START_TIMEOUT:.0f}s")
        time.sleep(0.2)


def _spawn() -> subprocess.Popen[bytes]:
    path = log_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "ember", "serve"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # the server outlives this command and its Ctrl-C
            env=os.environ.copy(),
        )
    return process  # the server writes server.pid itself once it listens


def _last_log_line() -> str:
    try:
        lines = log_path().read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return lines[-1] if lines else f"see {log_path()}"
