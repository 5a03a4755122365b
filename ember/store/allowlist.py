"""Which hosts a pull or a push may reach: the registries allowed (EMBER_REGISTRIES, passed in
by the server), and, on a redirect to any other host (a CDN for blobs), only public addresses:
never this machine, its networks or a cloud's metadata service (no SSRF through a pull).

A hop's name is resolved here and again when httpx connects; a DNS answer that changes in
between (rebinding) is not caught."""

import ipaddress
import socket
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

import httpx

from ember.store.errors import RegistryError
from ember.store.names import is_valid_part

Resolver = Callable[[str, int], list[str]]  # (host, port) -> its addresses


class RegistryNotAllowedError(RegistryError):
    """A registry that is not in the allow-list (HTTP 403)."""


class UnsafeRedirectError(RegistryError):
    """A redirect to a host that resolves to an address that is not public."""


def is_allowed(url: httpx.URL, allowed: Sequence[str]) -> bool:
    """Whether url's host is in allowed: entries `host` (any port) or `host:port`."""
    host, port = url.host.lower(), url.port or _default_port(url.scheme)
    for entry in allowed:
        parts = urlsplit(f"//{entry.strip().lower()}")
        try:
            entry_port = parts.port
        except ValueError:
            continue  # a port that is no number matches nothing
        if parts.hostname == host and entry_port in (None, port):
            return True
    return False


def check_allowed(url: httpx.URL, allowed: Sequence[str]) -> None:
    if not is_allowed(url, allowed):
        raise RegistryNotAllowedError(
            f"registry {url.netloc.decode()!r} is not allowed: pulls and pushes go only to "
            f"{', '.join(allowed)} (EMBER_REGISTRIES)"
        )


def named_host(text: str) -> str | None:
    """The host a model name names, or None: the first part of `host/namespace/model`, or of
    `host/model` when it holds a '.' or ':' (as Docker reads `example.com/model`; Ollama's
    names would call it a namespace, and an invalid one). Not a host at all (`../x`): None, so
    the name's own parse says what is wrong."""
    parts = text.split("://", 1)[-1].split("/")
    if len(parts) >= 3 or (len(parts) == 2 and any(c in parts[0] for c in ".:")):
        return parts[0] if is_valid_part("host", parts[0]) else None
    return None


def check_redirect(url: httpx.URL, allowed: Sequence[str], resolve: Resolver | None = None) -> None:
    """A redirect (or an upload location) may go to an allowed registry, or to a host whose
    every address is public; else UnsafeRedirectError."""
    if is_allowed(url, allowed):
        return
    port = url.port or _default_port(url.scheme)
    try:
        addresses = (resolve or resolve_host)(url.host, port)
    except OSError as e:
        raise RegistryError(f"redirect to {url.host}: the name does not resolve ({e})") from None
    private = [a for a in addresses if not is_public(a)]
    if private or not addresses:
        shown = private[0] if private else "no address"
        raise UnsafeRedirectError(
            f"refused a redirect to {url.host} ({shown}): not a public address"
        )


def resolve_host(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def is_public(address: str) -> bool:
    """Whether an IP address is globally routable (not loopback, private, link-local, shared,
    reserved, multicast or unspecified); an IPv4-mapped IPv6 address counts as its IPv4."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 scope id is no part of it
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80
