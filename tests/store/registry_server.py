"""A small real OCI/Ollama registry for tests: FastAPI served by uvicorn on a free 127.0.0.1
port in a thread, storing what is pushed in a directory.

Besides the protocol (manifests, blobs with Range, monolithic uploads, blob redirects to its
/cdn/) it can misbehave on purpose: serve raw manifest bytes, replace a blob's body (wrong
bytes, an endless stream), break the connection after some bytes, or ignore Range requests.
"""

from __future__ import annotations

import hashlib
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse

DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
CHUNK = 64 * 1024

Body = Callable[[], Iterator[bytes]]


class BrokenBody(Exception):
    """Raised inside a response body: uvicorn then drops the connection mid-body."""


class RegistryServer:
    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        (root / "uploads").mkdir(exist_ok=True)
        self.manifests: dict[tuple[str, str, str], bytes] = {}  # (ns, model, tag) -> raw
        self.bodies: dict[str, Body] = {}  # digest -> replacement body
        self.break_after: dict[str, int] = {}  # digest -> bytes sent before the connection breaks
        self.ignore_range = False
        self.redirects: dict[str, str] = {}  # digest -> where a GET of the blob redirects
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range)
        self._uploads: dict[str, Path] = {}
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # ------------------------------------------------------------ content

    def blob_path(self, digest: str) -> Path:
        match = DIGEST.fullmatch(digest)
        assert match, digest
        return self.root / "blobs" / f"sha256-{match.group(1)}"

    def add_blob(self, data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self.blob_path(digest).write_bytes(data)
        return digest

    def blob_count(self, digest: str) -> int:
        return sum(1 for m, p, _ in self.requests if m == "GET" and p.endswith(digest))

    # ------------------------------------------------------------ lifecycle

    def start(self) -> RegistryServer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(self._app(), log_level="critical", lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the test registry did not start")
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=5)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout=5)

    def __enter__(self) -> RegistryServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------ the app

    def _app(self) -> FastAPI:
        app = FastAPI()

        @app.middleware("http")
        async def record(request: Request, call_next):  # type: ignore[no-untyped-def]
            self.requests.append((request.method, request.url.path, request.headers.get("range")))
            return await call_next(request)

        self._manifest_routes(app)
        self._blob_routes(app)
        return app

    def _manifest_routes(self, app: FastAPI) -> None:
        base = "/v2/{ns}/{model}"

        @app.api_route(base + "/manifests/{tag}", methods=["GET", "HEAD"])
        def get_manifest(ns: str, model: str, tag: str) -> Response:
            raw = self.manifests.get((ns, model, tag))
            if raw is None:
                return Response(status_code=404)
            media = "application/vnd.docker.distribution.manifest.v2+json"
            return Response(raw, media_type=media)

        @app.put(base + "/manifests/{tag}")
        async def put_manifest(ns: str, model: str, tag: str, request: Request) -> Response:
            raw = await request.body()
            missing = [d for d in DIGEST.findall(raw.decode()) if not self._has(d)]
            if missing or not all(PART.fullmatch(p) for p in (ns, model, tag)):
                return Response(status_code=400, content=b"MANIFEST_BLOB_UNKNOWN")
            self.manifests[(ns, model, tag)] = raw
            return Response(status_code=201)

    def _blob_routes(self, app: FastAPI) -> None:
        base = "/v2/{ns}/{model}"

        @app.head(base + "/blobs/{digest}")
        def head_blob(ns: str, model: str, digest: str) -> Response:
            known = DIGEST.fullmatch(digest) and self.blob_path(digest).is_file()
            return Response(status_code=200 if known else 404)

        @app.get(base + "/blobs/{digest}")
        def get_blob(ns: str, model: str, digest: str, request: Request) -> Response:
            if digest in self.redirects:  # as a registry sends its blobs to a CDN
                return Response(status_code=307, headers={"Location": self.redirects[digest]})
            return self._blob_response(digest, request.headers.get("range"))

        @app.get("/cdn/{digest}")
        def get_cdn_blob(digest: str, request: Request) -> Response:
            return self._blob_response(digest, request.headers.get("range"))

        @app.post(base + "/blobs/uploads/")
        def start_upload(ns: str, model: str) -> Response:
            upload_id = uuid.uuid4().hex
            self._uploads[upload_id] = self.root / "uploads" / upload_id
            location = f"/v2/{ns}/{model}/blobs/uploads/{upload_id}"
            return Response(status_code=202, headers={"Location": location})

        @app.put(base + "/blobs/uploads/{upload_id}")
        async def finish_upload(upload_id: str, digest: str, request: Request) -> Response:
            path = self._uploads.pop(upload_id, None)
            if path is None or not DIGEST.fullmatch(digest):
                return Response(status_code=404)
            sha = hashlib.sha256()
            with open(path, "wb") as f:
                async for chunk in request.stream():
                    sha.update(chunk)
                    f.write(chunk)
            if "sha256:" + sha.hexdigest() != digest:
                path.unlink()
                return Response(status_code=400, content=b"DIGEST_INVALID")
            path.replace(self.blob_path(digest))
            return Response(status_code=201)

    def _has(self, hex_digest: str) -> bool:
        return (self.root / "blobs" / f"sha256-{hex_digest}").is_file()

    def _blob_response(self, digest: str, range_header: str | None) -> Response:
        if digest in self.bodies:
            return StreamingResponse(self.bodies[digest](), media_type="application/octet-stream")
        if not DIGEST.fullmatch(digest) or not self.blob_path(digest).is_file():
            return Response(status_code=404)
        data = self.blob_path(digest).read_bytes()
        start = 0
        if range_header and not self.ignore_range:
            start = int(range_header.removeprefix("bytes=").split("-")[0])
        headers = {"Content-Length": str(len(data) - start)}
        status = 200
        if start:
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        limit = self.break_after.pop(digest, None)
        body = _chunks(data[start:], limit)
        return StreamingResponse(body, status_code=status, headers=headers)


def _chunks(data: bytes, break_after: int | None) -> Iterator[bytes]:
    end = len(data) if break_after is None else break_after
    for i in range(0, end, CHUNK):
        yield data[i : min(i + CHUNK, end)]
    if break_after is not None:
        raise BrokenBody(f"connection dropped after {break_after} bytes")


def endless() -> Iterator[bytes]:
    """A body that never ends (what a hostile registry sends for a "10 GB" blob)."""
    block = b"\0" * CHUNK
    while True:
        yield block
