"""Images a request names by http(s) URL (OpenAI's `image_url` and `input_image`, Anthropic's
`url` image source): fetched only from the hosts EMBER_ALLOW_IMAGE_URLS lists, so that a request
cannot make the server reach any other host (no SSRF). By default it lists none and every URL
is refused, as Ollama fetches none.

An entry is `host` (any port), `host:port`, or `*.domain` (any name below domain, not domain
itself). An IP-literal host is allowed only where the entry is that literal (`10.0.0.5`,
`[::1]:8080`); a wildcard never matches one. A listed name is trusted whatever it resolves to.
Every URL of a request is checked before any is fetched, and each redirect hop the same way;
URLs carrying credentials are refused, and no proxy, .netrc or cookie of the server's
environment is used. Errors name the URL's host, never the
whole URL (its query may hold a token)."""

import asyncio
import ipaddress
import ssl
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from urllib.parse import urlsplit

import httpx

from ember import envconfig
from ember.server.api import RequestError
from ember.server.middleware import MAX_BODY_BYTES

ImageRef = tuple[str, str]  # (the URL, where the request names it: the error's param)
Fetched = Mapping[str, bytes]  # URL -> the image's bytes
NOTHING_FETCHED: Fetched = MappingProxyType({})

MAX_BYTES = MAX_BODY_BYTES  # a request's fetched images together, as if sent inline
TIMEOUT_S = 5.0  # to connect, and between two reads
DEADLINE_S = 10.0  # one URL's whole fetch: every hop and the body
MAX_REDIRECTS = 3
UNSUPPORTED = (
    "invalid image input: send a base64 data URI, or an http(s) URL of a host "
    "listed in EMBER_ALLOW_IMAGE_URLS"
)
_CONTENT_TYPES = ("image/", "application/octet-stream")  # octet-stream: many stores send it
_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a")  # PNG, JPEG, GIF


class _Refused(Exception):
    """Why the image at a host cannot be used."""


def is_url(text: str) -> bool:
    """Whether an image reference is a URL to fetch rather than a data URI."""
    return text[:5].lower() != "data:"


def is_allowed(url: httpx.URL, allowed: Sequence[str]) -> bool:
    """Whether url's host (and port) matches an entry of allowed."""
    host, port = url.host.lower(), url.port or (443 if url.scheme == "https" else 80)
    for entry in allowed:
        try:
            parts = urlsplit(f"//{entry.strip().lower()}")
            entry_host, entry_port = parts.hostname or "", parts.port
        except ValueError:
            continue  # a port that is no number matches nothing
        if entry_port not in (None, port):
            continue
        if entry_host == host:
            return True
        if entry_host.startswith("*.") and host.endswith(entry_host[1:]) and not _is_ip(host):
            return True
    return False


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


async def fetch_images(refs: Iterable[ImageRef]) -> dict[str, bytes]:
    """The bytes of each URL in refs (each fetched once); RequestError (400) naming the URL's
    host and param when one is not allowed or cannot be fetched as an image."""
    allowed = envconfig.allowed_image_hosts()
    targets = {url: (_first_hop(url, param, allowed), param) for url, param in refs}
    if not targets:
        return {}
    fetched: dict[str, bytes] = {}
    async with _client() as client:  # only once every URL is allowed
        for url, (target, param) in targets.items():
            budget = MAX_BYTES - sum(len(data) for data in fetched.values())
            fetched[url] = await _fetch(client, target, param, allowed, budget)
    return fetched


def image_at(url: str, param: str, fetched: Fetched) -> bytes:
    """The fetched bytes of url (fetch_images has refused any URL it could not fetch)."""
    if url not in fetched:
        raise RequestError(UNSUPPORTED, param)
    return fetched[url]


def _client() -> httpx.AsyncClient:
    ca = envconfig.ca_file()
    return httpx.AsyncClient(
        timeout=TIMEOUT_S,
        follow_redirects=False,  # each hop is checked by _fetch
        trust_env=False,  # no proxy and no .netrc credentials from the server's environment
        verify=ssl.create_default_context(cafile=str(ca)) if ca else True,
        headers={"Accept": "image/*", "Accept-Encoding": "identity", "User-Agent": "ember"},
    )


def _first_hop(url: str, param: str, allowed: Sequence[str]) -> httpx.URL:
    try:
        target = httpx.URL(url)
    except httpx.InvalidURL:
        raise RequestError(UNSUPPORTED, param) from None
    _check_hop(target, allowed, param)
    return target


async def _fetch(
    client: httpx.AsyncClient, target: httpx.URL, param: str, allowed: Sequence[str], budget: int
) -> bytes:
    try:
        async with asyncio.timeout(DEADLINE_S):
            return await _follow(client, target, allowed, param, budget)
    except _Refused as e:
        reason = str(e)
    except TimeoutError:
        reason = f"no answer within {DEADLINE_S:g} s"
    except (httpx.HTTPError, httpx.InvalidURL, OSError) as e:  # DNS, refused, reset, TLS ...
        reason = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    raise RequestError(f"invalid image input: the image at {target.host}: {reason}", param)


async def _follow(
    client: httpx.AsyncClient, target: httpx.URL, allowed: Sequence[str], param: str, budget: int
) -> bytes:
    for _ in range(MAX_REDIRECTS + 1):
        async with client.stream("GET", target) as resp:
            if not resp.is_redirect:
                return await _body(resp, budget)
            location = resp.headers.get("Location", "")
        target = target.join(location)
        _check_hop(target, allowed, param)
    raise _Refused(f"more than {MAX_REDIRECTS} redirects")


def _check_hop(url: httpx.URL, allowed: Sequence[str], param: str) -> None:
    """The first URL or a redirect's target: http(s), no credentials, an allowed host."""
    if url.scheme not in ("http", "https") or not url.host:
        raise RequestError(UNSUPPORTED, param)
    if url.userinfo:
        raise RequestError(f"invalid image input: {url.host}: no credentials in image URLs", param)
    if not allowed:
        raise RequestError(
            f"invalid image input: image URLs ({url.host}) are not fetched: "
            "EMBER_ALLOW_IMAGE_URLS lists no host; send a base64 data URI",
            param,
        )
    if not is_allowed(url, allowed):
        raise RequestError(
            f"invalid image input: {url.netloc.decode()} is not in EMBER_ALLOW_IMAGE_URLS", param
        )


async def _body(resp: httpx.Response, budget: int) -> bytes:
    """The response's body if it is an image of at most budget bytes; else _Refused."""
    if resp.status_code != 200:
        raise _Refused(f"the server answered HTTP {resp.status_code}")
    kind = resp.headers.get("Content-Type", "").split(";")[0].strip().lower()
    if kind and not kind.startswith(_CONTENT_TYPES):
        raise _Refused(f"content type {kind!r} is not an image")
    length = resp.headers.get("Content-Length", "")
    if length.isdigit() and int(length) > budget:
        raise _Refused(_too_big(budget))
    body = bytearray()
    async for chunk in resp.aiter_raw():  # raw: identity was asked for, nothing to inflate
        body += chunk
        if len(body) > budget:
            raise _Refused(_too_big(budget))
    if not _is_image(bytes(body[:16])):
        raise _Refused("the body is not a PNG, JPEG, GIF or WebP image")
    return bytes(body)


def _too_big(budget: int) -> str:
    return f"larger than {budget} bytes (a request's images are at most {MAX_BYTES} bytes)"


def _is_image(head: bytes) -> bool:
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return True
    return head.startswith(_MAGIC)
