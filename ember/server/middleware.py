"""ASGI middleware of the server: Host check (DNS rebinding), CORS, API key, body size limit.

Each answers refusals itself as JSON `{"error": "..."}` (Anthropic's error object on its
paths); none reads the environment (the server passes envconfig's values to `install`)."""

import hmac
import ipaddress
import json
import re
import socket
from collections.abc import Collection, Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ember.envconfig import HostAddress
from ember.server.errors import error_body

Headers = Sequence[tuple[bytes, bytes]]

MAX_BODY_BYTES = 32 * 1024 * 1024
BODY_EXEMPT_PREFIXES = ("/api/blobs/",)  # blob uploads stream model files
LOCAL_SUFFIXES = (".localhost", ".local", ".internal")
CORS_METHODS = "GET, POST, PUT, PATCH, DELETE, HEAD, OPTIONS"
CORS_MAX_AGE = "43200"  # 12 h, as gin-contrib/cors' default


def install(
    app: ASGIApp,
    *,
    bound: HostAddress,
    origins: Sequence[str],
    api_key: str | None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> ASGIApp:
    """app wrapped in the order requests meet them: Host check, CORS, API key, body limit.

    CORS comes before the key check: browsers send preflights without credentials."""
    wrapped: ASGIApp = BodyLimit(app, max_bytes=max_body_bytes)
    if api_key:
        wrapped = ApiKey(wrapped, key=api_key)
    return HostCheck(Cors(wrapped, origins=origins), bound=bound)


async def send_error(
    send: Send, status: int, message: str, headers: Headers = (), *, path: str = ""
) -> None:
    """A complete JSON error response: {"error": message}, or Anthropic's or OpenAI's object on
    their paths (the routes' own errors take the same shapes)."""
    body = json.dumps(error_body(path, status, message)).encode()
    start = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": [*start, *headers]})
    await send({"type": "http.response.body", "body": body})


def header(scope: Scope, name: str) -> str | None:
    """A request header's value (the first of its name), or None."""
    key = name.lower().encode()
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == key), None)


class HostCheck:
    """When the server listens on loopback only, a request must name a local host: a browser
    page of another site that resolves its name to 127.0.0.1 (DNS rebinding) gets 403. As
    Ollama's allowedHostsMiddleware: IP literals that are loopback, private or unspecified;
    localhost and *.localhost, *.local, *.internal; this machine's name; the bound host."""

    def __init__(self, app: ASGIApp, *, bound: HostAddress, hostnames: Collection[str] = ()):
        self.app = app
        self.is_active = bound.is_loopback
        names = hostnames or (socket.gethostname(),)
        self.allowed = {"", "localhost", bound.host.lower(), *(n.lower() for n in names)}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.is_active:
            return await self.app(scope, receive, send)
        host = _host_name(header(scope, "host") or "")
        if self.is_allowed(host):
            if scope["method"] == "OPTIONS" and header(scope, "origin") is None:
                return await _no_content(send, [])  # as allowedHostsMiddleware
            return await self.app(scope, receive, send)
        await send_error(send, 403, f"host {host!r} is not allowed", path=scope["path"])

    def is_allowed(self, host: str) -> bool:
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            return host in self.allowed or host.endswith(LOCAL_SUFFIXES)
        return ip.is_loopback or ip.is_private or ip.is_unspecified


def _host_name(value: str) -> str:
    """The host of a Host header, without port or IPv6 brackets, lower-cased."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class Cors:
    """Browsers may call the API only from allowed origins (patterns with `*`, "*" for all)
    or from the server's own origin; a request from any other origin gets 403, as with
    gin-contrib/cors. Requests without an Origin header (curl, clients) pass."""

    def __init__(self, app: ASGIApp, *, origins: Sequence[str]) -> None:
        self.app = app
        self.pattern = _origin_pattern(origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        origin = header(scope, "origin") if scope["type"] == "http" else None
        if not origin:  # an empty Origin is no CORS request either (gin-contrib/cors)
            return await self.app(scope, receive, send)
        if not self.is_allowed(origin, header(scope, "host") or ""):
            message = f"origin {origin!r} is not allowed"
            return await send_error(send, 403, message, path=scope["path"])
        allow = [(b"access-control-allow-origin", origin.encode()), (b"vary", b"Origin")]
        if scope["method"] == "OPTIONS":  # any OPTIONS with an Origin, as gin-contrib/cors
            return await _preflight(send, allow, header(scope, "access-control-request-headers"))

        async def send_allowed(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *allow]}
            await send(message)

        await self.app(scope, receive, send_allowed)

    def is_allowed(self, origin: str, host: str) -> bool:
        origin = origin.lower()
        if origin in (f"http://{host.lower()}", f"https://{host.lower()}"):
            return True  # same origin
        return self.pattern is not None and self.pattern.fullmatch(origin) is not None


def _origin_pattern(origins: Sequence[str]) -> re.Pattern[str] | None:
    # only `*` is special (an origin may hold "[::1]", which fnmatch would read as a class)
    patterns = [".*".join(re.escape(part) for part in o.lower().split("*")) for o in origins]
    return re.compile("|".join(patterns)) if patterns else None


async def _preflight(send: Send, allow: Headers, requested_headers: str | None) -> None:
    headers = [
        *allow,
        (b"access-control-allow-methods", CORS_METHODS.encode()),
        (b"access-control-max-age", CORS_MAX_AGE.encode()),
    ]
    if requested_headers:  # the origin is trusted: it may send the headers it asks for
        headers.append((b"access-control-allow-headers", requested_headers.encode("latin-1")))
    await _no_content(send, headers)


async def _no_content(send: Send, headers: Headers) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": list(headers)})
    await send({"type": "http.response.body", "body": b""})


class ApiKey:
    """Every request must carry `Authorization: Bearer <key>` or `x-api-key: <key>` (how
    Anthropic's clients send it); else 401."""

    def __init__(self, app: ASGIApp, *, key: str) -> None:
        self.app = app
        self.expected = key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.is_allowed(scope):
            return await self.app(scope, receive, send)
        challenge = [(b"www-authenticate", b"Bearer")]
        message = "unauthorized: send the API key as 'Authorization: Bearer <key>' or 'x-api-key'"
        await send_error(send, 401, message, challenge, path=scope["path"])

    def is_allowed(self, scope: Scope) -> bool:
        scheme, _, token = (header(scope, "authorization") or "").partition(" ")
        bearer = token.strip() if scheme.lower() == "bearer" else None
        keys = (k for k in (bearer, header(scope, "x-api-key")) if k is not None)
        # compare_digest: the time taken tells nothing of how much of the key matched
        return any(hmac.compare_digest(k.encode(), self.expected) for k in keys)


class BodyLimit:
    """Request bodies above max_bytes get 413 before a route sees them (JSON routes read
    whole bodies anyway, so the body is read here and handed on); blob uploads are exempt."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_bytes: int = MAX_BODY_BYTES,
        exempt_prefixes: Sequence[str] = BODY_EXEMPT_PREFIXES,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.exempt = tuple(exempt_prefixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(self.exempt):
            return await self.app(scope, receive, send)
        length = header(scope, "content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await send_error(send, 413, self.message, path=scope["path"])
        body = await self._read(receive)
        if body is None:
            return  # the client went away
        if len(body) > self.max_bytes:
            return await send_error(send, 413, self.message, path=scope["path"])
        await self.app(scope, _replay(body, receive), send)

    @property
    def message(self) -> str:
        return f"request body too large (at most {self.max_bytes} bytes)"

    async def _read(self, receive: Receive) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes or not message.get("more_body", False):
                return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body as one message, then the real channel (the app still learns of disconnects)."""
    is_sent = False

    async def replay() -> Message:
        nonlocal is_sent
        if is_sent:
            return await receive()
        is_sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
