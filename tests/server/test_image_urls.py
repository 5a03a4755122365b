"""Images by http(s) URL (EMBER_ALLOW_IMAGE_URLS): fetched from a local HTTP server only when its
host is listed, each redirect hop checked, bounded in size and time, and every failure a 400
naming the host; the fetched bytes reach the (fake) runner as a data URI's would."""

import base64
import contextlib
import io
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from PIL import Image
from server_fakes import MODELS, served

from ember import envconfig
from ember.server import image_urls as fetching
from ember.server.anthropic_api import Conversation
from ember.server.image_urls import is_allowed
from ember.server.openai_api import ChatCompletionRequest
from ember.server.responses_api import InputItem, image_urls

SLOW_S = 3.0  # the slow endpoint's delay; the fetch gives up long before


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 3), (200, 30, 90)).save(out, format="PNG")
    return out.getvalue()


PNG = _png()
DATA_URI = "data:image/png;base64," + base64.b64encode(PNG).decode()


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        with contextlib.suppress(OSError):  # the client gave up on a slow answer, as it should
            self._answer()

    def _answer(self) -> None:
        port = self.server.server_address[1]
        routes: dict[str, tuple[int, dict[str, str], bytes]] = {
            "/cat.png": (200, {"Content-Type": "image/png"}, PNG),
            "/big.png": (200, {"Content-Type": "image/png"}, PNG + bytes(5000)),
            "/here": (302, {"Location": "/cat.png"}, b""),
            "/away": (302, {"Location": f"http://localhost:{port}/cat.png"}, b""),
            "/loop": (302, {"Location": "/loop"}, b""),
            "/page": (200, {"Content-Type": "text/html"}, b"<html>a cat</html>"),
            "/garbage": (200, {"Content-Type": "image/png"}, b"no image at all"),
        }
        path = urlsplit(self.path).path
        if path == "/slow":
            time.sleep(SLOW_S)
        if path == "/drip.png":  # each byte in time, the whole too slow
            self._drip()
            return
        if path == "/unsized.png":  # no Content-Length: the body runs until the close
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()
            self.wfile.write(PNG + bytes(5000))
            return
        status, headers, body = routes.get(path, (404, {}, b"not found"))
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _drip(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.end_headers()
        for byte in PNG[: int(SLOW_S / 0.2)]:
            self.wfile.write(bytes([byte]))
            self.wfile.flush()
            time.sleep(0.2)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def origin() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def limits(monkeypatch: pytest.MonkeyPatch, origin: str) -> None:
    """The origin allowed, with limits small enough for a quick test; a vision model served."""
    monkeypatch.setenv("EMBER_ALLOW_IMAGE_URLS", f"example.com, {origin}")
    monkeypatch.setattr(fetching, "MAX_BYTES", 2000)
    monkeypatch.setattr(fetching, "TIMEOUT_S", 0.5)
    monkeypatch.setattr(fetching, "DEADLINE_S", 1.0)
    seer = served("seer", capabilities=frozenset({"completion", "vision"}))
    monkeypatch.setitem(MODELS, "seer", seer)


def chat(client: Any, url: str) -> httpx.Response:
    content = [{"type": "text", "text": "what?"}, {"type": "image_url", "image_url": {"url": url}}]
    body = {"model": "seer", "messages": [{"role": "user", "content": content}]}
    return client.post("/v1/chat/completions", json=body)


def sent_images(starter: Any) -> list[Any]:
    return [fields.get("images") for r in starter.runners for fields in r.fields]


def test_an_allowed_hosts_image_reaches_the_runner_as_a_data_uris_would(client, starter, origin):
    assert chat(client, DATA_URI).status_code == 200
    assert chat(client, f"http://{origin}/cat.png").status_code == 200
    assert chat(client, f"http://{origin}/here").status_code == 200  # a redirect to itself
    inline, fetched, redirected = sent_images(starter)
    assert fetched == redirected == inline == [{"data": base64.b64encode(PNG).decode(), "id": 0}]


def test_responses_and_anthropic_fetch_too(client, starter, origin):
    url = f"http://{origin}/cat.png"
    part = {"type": "input_image", "image_url": url}
    r = client.post(
        "/v1/responses", json={"model": "seer", "input": [{"role": "user", "content": [part]}]}
    )
    assert r.status_code == 200, r.text
    block = {"type": "image", "source": {"type": "url", "url": url}}
    messages = [{"role": "user", "content": [block]}]
    r = client.post("/v1/messages", json={"model": "seer", "max_tokens": 4, "messages": messages})
    assert r.status_code == 200, r.text
    assert [images[0]["data"] for images in sent_images(starter)] == [
        base64.b64encode(PNG).decode()
    ] * 2


def test_each_api_names_where_its_image_urls_are() -> None:
    url, data = {"url": "http://h/a.png"}, {"url": DATA_URI}
    parts = [{"type": "image_url", "image_url": u} for u in (data, url)]
    chat = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": parts}]}
    )
    assert chat.image_urls() == [(url["url"], "messages[0].content[1].image_url")]
    item = {"role": "user", "content": [{"type": "input_image", "image_url": url["url"]}]}
    items = [InputItem.model_validate(i) for i in ({"role": "user", "content": "hi"}, item)]
    assert image_urls(items) == [(url["url"], "input[1].content[0].image_url")]
    image = {"type": "image", "source": {"type": "url", **url}}
    result = {"type": "tool_result", "tool_use_id": "t", "content": [image]}
    messages = [{"role": "user", "content": [result, image]}]
    conversation = Conversation.model_validate({"model": "m", "messages": messages})
    assert conversation.image_urls() == [
        (url["url"], "messages[0].content[0].content[0].source"),
        (url["url"], "messages[0].content[1].source"),
    ]


def test_no_url_is_fetched_by_default(client, monkeypatch, origin):
    monkeypatch.delenv("EMBER_ALLOW_IMAGE_URLS")
    r = chat(client, f"http://{origin}/cat.png")
    assert r.status_code == 400
    error = r.json()["error"]
    assert "EMBER_ALLOW_IMAGE_URLS" in error["message"] and "127.0.0.1" in error["message"]
    assert error["param"] == "messages[0].content[1].image_url"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://{origin}/away", "localhost:{port} is not in EMBER_ALLOW_IMAGE_URLS"),
        ("http://localhost:{port}/cat.png", "localhost:{port} is not in EMBER_ALLOW_IMAGE_URLS"),
        ("http://user:secret@{origin}/cat.png", "no credentials in image URLs"),
        ("ftp://{origin}/cat.png", "send a base64 data URI, or an http(s) URL"),
        ("http://{origin}/loop", "more than 3 redirects"),
        ("http://{origin}/big.png", "larger than 2000 bytes"),
        ("http://{origin}/unsized.png", "larger than 2000 bytes"),
        ("http://{origin}/page", "content type 'text/html' is not an image"),
        ("http://{origin}/garbage", "not a PNG, JPEG, GIF or WebP image"),
        ("http://{origin}/missing.png", "answered HTTP 404"),
        ("http://127.0.0.1:{closed}/cat.png", "ConnectError"),
    ],
)
def test_what_cannot_be_fetched_is_a_400_naming_the_host(client, origin, monkeypatch, url, says):
    closed = closed_port()
    monkeypatch.setenv("EMBER_ALLOW_IMAGE_URLS", f"{origin},127.0.0.1:{closed}")
    port = origin.split(":")[1]
    r = chat(client, url.format(origin=origin, port=port, closed=closed))
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert says.format(port=port) in message
    assert "secret" not in message


@pytest.mark.parametrize(("path", "says"), [("slow", "ReadTimeout"), ("drip.png", "within 1 s")])
def test_a_slow_host_is_a_400_within_the_deadline(client, origin, path, says):
    start = time.monotonic()
    r = chat(client, f"http://{origin}/{path}")
    assert r.status_code == 400 and "127.0.0.1" in r.json()["error"]["message"]
    assert says in r.json()["error"]["message"]
    assert time.monotonic() - start < SLOW_S - 1


def test_a_requests_images_share_the_size_limit(client, origin, monkeypatch):
    monkeypatch.setattr(fetching, "MAX_BYTES", len(PNG) * 3 // 2)
    url = f"http://{origin}/cat.png"
    content = [{"type": "image_url", "image_url": {"url": f"{url}?{i}"}} for i in range(2)]
    body = {"model": "seer", "messages": [{"role": "user", "content": content}]}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400 and "larger than" in r.json()["error"]["message"]
    content = [{"type": "image_url", "image_url": {"url": url}}] * 3  # one URL: fetched once
    body = {"model": "seer", "messages": [{"role": "user", "content": content}]}
    assert client.post("/v1/chat/completions", json=body).status_code == 200


@pytest.mark.parametrize(
    ("url", "entries", "allowed"),
    [
        ("https://img.example.com/a.png", ["img.example.com"], True),
        ("https://IMG.example.com/a.png", ["img.Example.com"], True),
        ("https://img.example.com:8443/a.png", ["img.example.com"], True),  # any port
        ("https://img.example.com:8443/a.png", ["img.example.com:443"], False),
        ("https://img.example.com/a.png", ["img.example.com:443"], True),
        ("http://img.example.com/a.png", ["img.example.com:80"], True),
        ("https://a.b.example.com/a.png", ["*.example.com"], True),
        ("https://example.com/a.png", ["*.example.com"], False),  # not the domain itself
        ("https://badexample.com/a.png", ["*.example.com"], False),
        ("https://example.com.evil.net/a.png", ["example.com"], False),
        ("http://10.0.0.1/a.png", ["*.0.0.1", "*.1"], False),  # a wildcard names no IP
        ("http://10.0.0.1/a.png", ["10.0.0.1"], True),
        ("http://[::1]:8080/a.png", ["[::1]:8080"], True),
        ("http://[::1]:8080/a.png", ["[::1]:9"], False),
        ("http://h.example/a.png", ["h.example:port"], False),
    ],
)
def test_allow_list_entries(url: str, entries: list[str], allowed: bool) -> None:
    assert is_allowed(httpx.URL(url), entries) is allowed


def test_the_setting_is_read_and_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_ALLOW_IMAGE_URLS", " Img.Example.com, *.cdn.example:8443 ,")
    assert envconfig.allowed_image_hosts() == ("img.example.com", "*.cdn.example:8443")
    listed = envconfig.server_settings()["EMBER_ALLOW_IMAGE_URLS"]
    assert listed == "img.example.com,*.cdn.example:8443"
    monkeypatch.delenv("EMBER_ALLOW_IMAGE_URLS")
    assert envconfig.allowed_image_hosts() == ()
