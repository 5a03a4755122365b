"""The server's handle on one runner process: start it, load the model, stream completions.

Every call is async (the server is); the process is a child that dies with its handle's close().
Errors come back as RunnerError with the runner's own message and its HTTP status.
"""

import asyncio
import collections
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncGenerator
from dataclasses import asdict, dataclass
from typing import IO, Any

import httpx

from ember.errors import EmberError


class RunnerError(EmberError):
    """A runner that failed, died, or refused a request; status is the HTTP status (0: none)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class LoadSettings:
    parallel: int = 1
    batch_size: int = 512
    kv_size: int = 4096  # num_ctx × parallel
    kv_cache_type: str = ""  # "": the engine's default (f16)
    num_threads: int = 0
    flash_attention: bool | None = None
    multiuser_cache: bool = False
    draft_model: str = ""  # the GGUF path of a draft model ("": none)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RunnerOutput:
    """A runner's output, each line passed on to the server's stderr as it comes, as Ollama's
    server log holds its runners' (a runner's traceback must not vanish with it); the last
    lines kept for the error of a runner that exits."""

    def __init__(self, pipe: IO[bytes] | None) -> None:
        self.last: collections.deque[bytes] = collections.deque(maxlen=20)
        self.reader = threading.Thread(target=self._forward, args=(pipe,), daemon=True)
        if pipe is not None:
            self.reader.start()

    def _forward(self, pipe: IO[bytes]) -> None:
        with pipe:
            for line in iter(pipe.readline, b""):
                self.last.append(line)
                with contextlib.suppress(OSError, ValueError):  # the server's stderr is gone
                    sys.stderr.write(line.decode("utf-8", "replace"))
                    sys.stderr.flush()

    def tail(self, *, ended: bool = False) -> str:
        """The last line the runner wrote (its error); ended: the runner has exited, so its
        last lines are read to the end first."""
        if ended and self.reader.is_alive():
            self.reader.join(timeout=2)
        text = b"".join(self.last).decode("utf-8", "replace").strip()
        return text.splitlines()[-1] if text else "no output"


class RunnerClient:
    def __init__(
        self, process: subprocess.Popen[bytes], port: int, output: RunnerOutput | None = None
    ) -> None:
        self.process, self.port = process, port
        self.output = output or RunnerOutput(None)
        self.base = f"http://127.0.0.1:{port}"
        # no timeout on reads: a completion streams as long as it generates
        self.http = httpx.AsyncClient(base_url=self.base, timeout=httpx.Timeout(None, connect=5))

    @classmethod
    async def start(
        cls,
        model_path: str,
        *projectors: str,
        env: dict[str, str] | None = None,
        timeout: float = 60.0,
    ) -> "RunnerClient":
        """Starts `python -m ember runner` for model_path (and its mmproj file, if any) and
        waits until it answers."""
        port = free_port()
        args = ["runner", "--model", model_path, "--port", str(port)]
        args += ["--projector", projectors[0]] if projectors else []
        process = subprocess.Popen(
            [sys.executable, "-m", "ember", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        client = cls(process, port, RunnerOutput(process.stdout))
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                message = client.output_tail()
                await client.close()
                raise RunnerError(f"the runner exited with code {process.returncode}: {message}")
            with contextlib.suppress(httpx.TransportError):
                await client.health()
                return client
            if time.monotonic() > deadline:
                await client.close()
                raise RunnerError(f"the runner did not start within {timeout:.0f}s")
            await asyncio.sleep(0.05)

    def output_tail(self) -> str:
        """The last line the runner wrote (its error)."""
        return self.output.tail(ended=not self.alive())

    def alive(self) -> bool:
        return self.process.poll() is None

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self._check_open()
        try:
            response = await self.http.post(path, json=body)
        except httpx.TransportError as err:
            raise self._gone(err) from None
        return _json(response)

    def _check_open(self) -> None:
        # closed by the scheduler when it found the process dead, while a request still held
        # it: that request gets the dead runner's error, not httpx's RuntimeError
        if self.http.is_closed:
            raise RunnerError(f"the runner stopped (exit code {self.process.returncode})", 500)

    def _gone(self, err: Exception) -> RunnerError:
        if not self.alive():
            return RunnerError(f"the runner stopped (exit code {self.process.returncode})", 500)
        return RunnerError(f"the runner did not answer: {err}", 500)

    async def health(self) -> dict[str, Any]:
        response = await self.http.get("/health")
        return _json(response)

    async def load(self, settings: LoadSettings) -> dict[str, Any]:
        """Loads the model; a load that does not fit raises RunnerError (status 507)."""
        return await self._post("/load", asdict(settings))

    async def completion(self, prompt: str, **fields: Any) -> AsyncGenerator[dict[str, Any], None]:
        """The runner's NDJSON records: {"content", "logprobs"?} pieces, then one final record
        {"done": true, ...} (or {"error": ...}). fields: options, format, grammar, logit_bias,
        shift, truncate, logprobs, top_logprobs, images. Closing the iterator early cancels the
        generation."""
        body = {"prompt": prompt, **fields}
        self._check_open()
        try:
            async with self.http.stream("POST", "/completion", json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    _json(response)
                async for line in response.aiter_lines():
                    if line:
                        yield json.loads(line)
        except httpx.TransportError as err:
            raise self._gone(err) from None

    async def embedding(
        self, content: str | list[str], *, truncate: bool = True, cut_to: int = 0
    ) -> dict[str, Any]:
        """cut_to: the context a truncated input fits (0: the runner's)."""
        body = {"content": content, "truncate": truncate, "cut_to": cut_to}
        return await self._post("/embedding", body)

    async def rerank(
        self, query: str, documents: list[str], *, truncate: bool = True
    ) -> dict[str, Any]:
        """{"scores": each document's relevance to query, in order; "prompt_eval_count"}."""
        body = {"query": query, "documents": documents, "truncate": truncate}
        return await self._post("/rerank", body)

    async def tokenize(self, content: str, *, add_special: bool = True) -> list[int]:
        body = await self._post("/tokenize", {"content": content, "add_special": add_special})
        return list(body["tokens"])

    async def detokenize(self, tokens: list[int]) -> str:
        return str((await self._post("/detokenize", {"tokens": tokens}))["content"])

    async def close(self) -> None:
        """Ends the runner process (its memory goes with it)."""
        await self.http.aclose()
        if self.alive():
            self.process.terminate()
            try:
                await asyncio.to_thread(self.process.wait, 5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                await asyncio.to_thread(self.process.wait)


def _json(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = {"error": response.text.strip() or f"HTTP {response.status_code}"}
    if response.status_code != 200:
        raise RunnerError(str(body.get("error", body)), response.status_code)
    if not isinstance(body, dict):
        raise RunnerError("the runner sent an unexpected answer", 500)
    return body
