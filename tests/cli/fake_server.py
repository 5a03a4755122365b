"""A small Ollama-API server for CLI tests: the real model routes (model_routes.py) on a store in
a temporary folder, plus fake /api/chat, /api/generate, /api/ps and catalogue /api/pull that
answer without a model (a load with think on fails for a model not in `thinkers`, as the
server's capability check). Runs under uvicorn on a free loopback port in a thread.

The fake answer echoes the last user message and the temperature it was sent with (and how many
images came with it); a message containing "story" streams 400 words slowly, so a test can
interrupt it. The models named in `vision` report the vision capability."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from ember.server import model_routes
from ember.store import CreateRequest, Store, create_model


class FakeServer:
    def __init__(self, root: Path, gguf: Path | None = None) -> None:
        self.store = Store(root / "models")
        self.gguf = gguf  # what a pull of any name installs
        self.requests: list[tuple[str, dict[str, Any]]] = []  # (path, body)
        self.loaded: set[str] = set()
        self.vision: set[str] = set()  # models whose /api/show lists "vision"
        self.embedders: set[str] = set()  # models whose /api/show lists only "embedding"
        self.thinkers: set[str] = set()  # models that may load with think on
        self.url = ""
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle

    def start(self) -> FakeServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app(), log_level="critical", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, "the fake server did not start"
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def bodies(self, path: str) -> list[dict[str, Any]]:
        return [body for p, body in self.requests if p == path]

    # ------------------------------------------------------------ the app

    def app(self) -> FastAPI:
        app = FastAPI()
        app.state.store = self.store

        @app.get("/")
        def root() -> Response:
            return Response("Ollama is running")

        @app.post("/api/chat")
        async def chat(request: Request) -> Response:
            body = await self._record(request, "/api/chat")
            messages = body.get("messages") or []
            if not messages:
                self.loaded.add(body["model"])
                return JSONResponse(self._final(body, "load"))
            text = self._answer(messages[-1]["content"], body, messages[-1].get("images"))
            return self._stream(body, text, chat=True)

        @app.post("/api/generate")
        async def generate(request: Request) -> Response:
            body = await self._record(request, "/api/generate")
            if not body.get("prompt") and not body.get("images"):
                return await self._load_or_unload(request, body)
            self.loaded.add(body["model"])
            text = self._answer(body["prompt"], body, body.get("images"))
            return self._stream(body, text, chat=False)

        @app.post("/api/show")
        async def show(request: Request) -> Response:
            body = await self._record(request, "/api/show")
            answer = await model_routes.show(request)
            name = body["model"].removesuffix(":latest")
            if answer.status_code != 200 or name not in self.vision | self.embedders:
                return answer
            shown = json.loads(bytes(answer.body))
            if name in self.embedders:
                return JSONResponse(shown | {"capabilities": ["embedding"]})
            return JSONResponse(shown | {"capabilities": [*shown["capabilities"], "vision"]})

        @app.post("/api/embed")
        async def embed(request: Request) -> Response:
            body = await self._record(request, "/api/embed")
            size = body.get("dimensions") or 4
            return JSONResponse({"model": body["model"], "embeddings": [[0.5] * size]})

        @app.get("/api/ps")
        def ps() -> Response:
            models = [
                {
                    "name": name,
                    "model": name,
                    "size": 100_000_000,
                    "digest": "ab" * 32,
                    "size_vram": 0,
                    "context_length": 4096,
                    "expires_at": "2999-01-01T00:00:00Z",
                    "num_parallel": 4,  # Ember's own fields
                    "slots_in_use": 1,
                    "kv_cache_type": "q8_0",
                }
                for name in sorted(self.loaded)
            ]
            return JSONResponse({"models": models})

        @app.post("/api/pull")
        async def pull(request: Request) -> Response:
            body = await self._record(request, "/api/pull")
            return StreamingResponse(self._pull(body["model"]), media_type="application/x-ndjson")

        app.include_router(model_routes.router)  # after ours: the fake pull and show win
        return app

    async def _record(self, request: Request, path: str) -> dict[str, Any]:
        body = json.loads(await request.body() or b"{}")
        self.requests.append((path, body))
        return body

    @staticmethod
    def _answer(prompt: str, body: dict[str, Any], images: list[str] | None) -> str:
        if "story" in prompt:
            return " ".join(f"word{i}" for i in range(400))
        temperature = (body.get("options") or {}).get("temperature")
        seen = f", {len(images)} images" if images else ""
        return f"You said: {prompt.strip()} (temperature {temperature}{seen})"

    async def _load_or_unload(self, request: Request, body: dict[str, Any]) -> Response:
        if body.get("think") not in (None, False) and body["model"] not in self.thinkers:
            error = f'"{body["model"]}" does not support thinking'  # the server's 400
            return JSONResponse({"error": error}, status_code=400)
        reason = "unload" if body.get("keep_alive") == 0 else "load"
        if reason == "unload" and body["model"] not in self.loaded:
            shown = await model_routes.show(request)  # a model not stored: its 404
            if shown.status_code == 404:
                return shown
        (self.loaded.discard if reason == "unload" else self.loaded.add)(body["model"])
        return JSONResponse(self._final(body, reason))

    @staticmethod
    def _final(body: dict[str, Any], reason: str) -> dict[str, Any]:
        return {
            "model": body["model"],
            "created_at": "2025-01-01T00:00:00Z",
            "done": True,
            "done_reason": reason,
            "total_duration": 2_000_000_000,
            "load_duration": 1_000_000,
            "prompt_eval_count": 10,
            "prompt_eval_duration": 100_000_000,
            "eval_count": 20,
            "eval_duration": 400_000_000,
        }

    def _stream(self, body: dict[str, Any], text: str, *, chat: bool) -> StreamingResponse:
        slow = len(text) > 1000

        async def pieces() -> AsyncIterator[bytes]:
            for word in text.split(" "):
                piece = word + " "
                chunk: dict[str, Any] = {"model": body["model"], "done": False}
                if chat:
                    chunk["message"] = {"role": "assistant", "content": piece}
                else:
                    chunk["response"] = piece
                yield (json.dumps(chunk) + "\n").encode()
                await asyncio.sleep(0.05 if slow else 0)
            final = self._final(body, "stop")
            final.update({"message": {"role": "assistant", "content": ""}} if chat else {})
            yield (json.dumps(final) + "\n").encode()

        return StreamingResponse(pieces(), media_type="application/x-ndjson")

    def _pull(self, name: str) -> Any:
        yield b'{"status": "pulling manifest"}\n'
        if self.gguf is None:
            yield b'{"error": "pull model manifest: file does not exist"}\n'
            return
        info = self.store.write_blob(self.gguf.read_bytes())
        size = info.size
        for done in (0, size // 2, size):
            record = {"status": f"pulling {info.digest.short}", "digest": str(info.digest)}
            yield (json.dumps(record | {"total": size, "completed": done}) + "\n").encode()
        request = CreateRequest(files={"model.gguf": str(info.digest)})
        for record in create_model(self.store, name, request):
            if record["status"] in ("writing manifest", "success"):
                yield (json.dumps(record) + "\n").encode()
