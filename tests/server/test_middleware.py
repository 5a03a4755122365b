"""Middleware on a tiny FastAPI app: Host check, CORS, API key, body limit, and their order."""

import asyncio
import json

import pytest
from fastapi import FastAPI, Request
from starlette.testclient import TestClient
from starlette.types import Message, Receive, Scope, Send

from ember.envconfig import HostAddress, allowed_origins, parse_host
from ember.server.middleware import BodyLimit, HostCheck, install

LOOPBACK = HostAddress("http", "127.0.0.1", 11434)
DEFAULT_ORIGINS = allowed_origins()


def make_app() -> FastAPI:
    app = FastAPI()

    @app.get("/")
    def root() -> str:
        return "Ollama is running"

    @app.post("/api/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"size": len(await request.body())}

    @app.post("/api/blobs/{digest}")
    async def blob(digest: str, request: Request) -> dict[str, int]:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
        return {"size": size}

    return app


def client(
    *,
    bound: HostAddress = LOOPBACK,
    origins: list[str] | None = None,
    api_key: str | None = None,
    max_body_bytes: int = 1024,
) -> TestClient:
    origins = DEFAULT_ORIGINS if origins is None else origins
    app = install(
        make_app(), bound=bound, origins=origins, api_key=api_key, max_body_bytes=max_body_bytes
    )
    return TestClient(app, base_url="http://127.0.0.1:11434")


# --- Host check ---


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:11434",
        "localhost",
        "localhost:11434",
        "[::1]:11434",
        "192.168.1.10",  # private
        "10.0.0.2:8080",
        "0.0.0.0:11434",
        "app.localhost",
        "printer.local",
        "svc.internal:80",
        "ThisMachine",  # the machine's own name, any case
    ],
)
def test_local_hosts_pass_when_bound_to_loopback(host: str) -> None:
    app = HostCheck(make_app(), bound=LOOPBACK, hostnames=["thismachine"])
    response = TestClient(app).get("/", headers={"Host": host})
    assert response.status_code == 200


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:11434", "8.8.8.8", "localhost.evil"]
)
def test_other_hosts_get_403_when_bound_to_loopback(host: str) -> None:
    response = client().get("/", headers={"Host": host})
    assert response.status_code == 403
    assert "is not allowed" in response.json()["error"]


def test_any_host_passes_when_bound_to_every_interface() -> None:
    response = client(bound=parse_host("0.0.0.0")).get("/", headers={"Host": "evil.example"})
    assert response.status_code == 200


def test_the_bound_name_itself_passes() -> None:
    bound = HostAddress("http", "localhost", 8080)
    app = HostCheck(make_app(), bound=bound, hostnames=["x"])
    assert TestClient(app).get("/", headers={"Host": "localhost:8080"}).status_code == 200


# --- CORS ---


def test_requests_without_origin_pass() -> None:
    assert client().get("/").json() == "Ollama is running"


@pytest.mark.parametrize(
    "origin",
    [
        "http://localhost",
        "http://localhost:3000",
        "https://127.0.0.1:8443",
        "http://0.0.0.0:5173",
        "app://obsidian.md",
        "tauri://localhost",
        "vscode-webview://abc",
        "file://",
    ],
)
def test_local_origins_are_allowed(origin: str) -> None:
    response = client().get("/", headers={"Origin": origin})
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == origin


@pytest.mark.parametrize("origin", ["https://evil.example", "http://localhost.evil.example"])
def test_other_origins_are_refused(origin: str) -> None:
    response = client().post("/api/echo", content=b"{}", headers={"Origin": origin})
    assert response.status_code == 403
    assert "origin" in response.json()["error"]


def test_origins_from_the_setting_with_wildcards() -> None:
    c = client(origins=["https://*.example.com", "http://[::1]:*"])
    assert c.get("/", headers={"Origin": "https://app.example.com"}).status_code == 200
    assert c.get("/", headers={"Origin": "http://[::1]:3000"}).status_code == 200
    assert c.get("/", headers={"Origin": "https://example.org"}).status_code == 403


def test_star_allows_every_origin() -> None:
    assert client(origins=["*"]).get("/", headers={"Origin": "https://x.y"}).status_code == 200


def test_same_origin_is_allowed() -> None:
    response = client(origins=[]).get("/", headers={"Origin": "http://127.0.0.1:11434"})
    assert response.status_code == 200


def test_preflight_is_answered_without_the_api_key() -> None:
    response = client(api_key="k").options(
        "/api/chat",
        headers={
            "Origin": "http://localhost:3000",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert response.status_code == 204
    assert response.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert "POST" in response.headers["access-control-allow-methods"]
    assert response.headers["access-control-allow-headers"] == "authorization, content-type"


def test_options_with_an_origin_is_a_preflight_even_without_a_method() -> None:
    # gin-contrib/cors answers every OPTIONS that carries an Origin as a preflight
    response = client().options("/api/chat", headers={"Origin": "http://localhost:3000"})
    assert response.status_code == 204
    assert response.headers["access-control-allow-origin"] == "http://localhost:3000"


def test_options_from_a_local_host_without_an_origin_is_no_content() -> None:
    # Ollama's allowedHostsMiddleware answers it 204 itself
    assert client().options("/api/chat").status_code == 204


def test_an_empty_origin_is_no_cors_request() -> None:
    response = client(origins=[]).get("/", headers={"Origin": ""})
    assert response.status_code == 200
    assert "access-control-allow-origin" not in response.headers


def test_preflight_from_another_origin_is_refused() -> None:
    response = client().options(
        "/api/chat",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert response.status_code == 403


# --- API key ---


def test_api_key_required_on_every_route() -> None:
    c = client(api_key="s3cret")
    for response in (c.get("/"), c.post("/api/echo", content=b"{}")):
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert "Authorization: Bearer" in response.json()["error"]


def test_a_refusal_on_an_openai_path_is_openais_error_object() -> None:
    """The openai client reads error.message; the routes' own errors had this shape already."""
    response = client(api_key="s3cret").post("/v1/chat/completions", content=b"{}")
    assert response.status_code == 401
    error = response.json()["error"]
    assert error["type"] == "api_error" and "Authorization: Bearer" in error["message"]
    anthropic = client(api_key="s3cret").post("/v1/messages", content=b"{}").json()
    assert anthropic["type"] == "error"  # Anthropic's own shape on its paths


@pytest.mark.parametrize("value", ["Bearer wrong", "s3cret", "Basic s3cret", "Bearer s3cret2"])
def test_wrong_keys_are_refused(value: str) -> None:
    response = client(api_key="s3cret").get("/", headers={"Authorization": value})
    assert response.status_code == 401


def test_right_key_passes_and_cors_headers_reach_the_refusals() -> None:
    c = client(api_key="s3cret")
    assert c.get("/", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert c.get("/", headers={"Authorization": "bearer s3cret"}).status_code == 200
    refused = c.get("/", headers={"Origin": "http://localhost:3000"})
    assert refused.status_code == 401
    assert refused.headers["access-control-allow-origin"] == "http://localhost:3000"


def test_no_key_set_means_no_check() -> None:
    assert client(api_key=None).get("/").status_code == 200


# --- body limit ---


def test_body_within_the_limit_reaches_the_route() -> None:
    assert client().post("/api/echo", content=b"x" * 1024).json() == {"size": 1024}


def test_body_over_the_limit_gets_413() -> None:
    response = client().post("/api/echo", content=b"x" * 1025)
    assert response.status_code == 413
    assert response.json() == {"error": "request body too large (at most 1024 bytes)"}


def test_chunked_body_over_the_limit_gets_413() -> None:
    def chunks():
        for _ in range(5):
            yield b"x" * 300

    assert client().post("/api/echo", content=chunks()).status_code == 413


def test_blob_uploads_are_exempt() -> None:
    response = client().post("/api/blobs/sha256:abc", content=b"x" * 5000)
    assert response.json() == {"size": 5000}


def test_route_still_hears_of_a_disconnect_after_the_body() -> None:
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append((await receive())["type"])
        seen.append((await receive())["type"])

    messages: list[Message] = [
        {"type": "http.request", "body": b"{}", "more_body": True},
        {"type": "http.request", "body": b"[]", "more_body": False},
        {"type": "http.disconnect"},
    ]

    async def receive() -> Message:
        return messages.pop(0)

    async def send(message: Message) -> None:
        raise AssertionError("nothing is sent")

    scope = {"type": "http", "path": "/api/chat", "headers": [], "method": "POST"}
    asyncio.run(BodyLimit(app, max_bytes=10)(scope, receive, send))
    assert seen == ["http.request", "http.disconnect"]


def test_order_host_check_before_everything() -> None:
    response = client(api_key="k").post(
        "/api/echo", content=b"x" * 5000, headers={"Host": "evil.example"}
    )
    assert response.status_code == 403
    assert json.loads(response.content)["error"] == "host 'evil.example' is not allowed"
