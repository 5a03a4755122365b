"""`ember serve` as a child process on a free loopback port, with a model store of its own: for
the server's end-to-end tests and the CLI's (a module of its own, with a name no other test
folder uses, so that either folder can import it)."""

import os
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

from ember.runner.client import free_port


class Server:
    """A `python -m ember serve` child process and its address."""

    def __init__(self, tmp: Path, *, ca: Path | None = None, **env: str) -> None:
        """ca: the server serves HTTPS (env names its EMBER_TLS_CERT and EMBER_TLS_KEY), with a
        certificate this CA signed."""
        port = free_port()
        self.url = f"{'https' if ca else 'http'}://127.0.0.1:{port}"
        self.verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca) if ca else True
        self.log = (tmp / f"server-{port}.log").open("wb")
        environ = {
            **os.environ,
            "EMBER_HOST": self.url,
            "EMBER_MODELS": str(tmp / "models"),
            "EMBER_CONTEXT_LENGTH": "2048",  # smaller KV caches: faster loads
            **env,
        }
        if "EMBER_API_KEY" not in env:  # the developer's own key would lock the tests out
            environ.pop("EMBER_API_KEY", None)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ember", "serve"],
            env=environ,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self._wait(env.get("EMBER_API_KEY"))

    def _wait(self, key: str | None) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "ember serve exited at startup"
            try:
                answer = httpx.get(self.url, headers=headers, timeout=1, verify=self.verify)
                if answer.status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
        raise TimeoutError("ember serve did not answer within 60s")

    def runner_pids(self) -> list[int]:
        children = psutil.Process(self.process.pid).children()
        return [c.pid for c in children if "runner" in c.cmdline()]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
