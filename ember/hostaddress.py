"""An Ollama host address (OLLAMA_HOST's forms): parsed, and whether it binds loopback."""

import ipaddress
import socket
from dataclasses import dataclass

from ember.errors import OptionsError

DEFAULT_PORT = 11434


@dataclass(frozen=True, slots=True)
class HostAddress:
    """Where the server listens and clients connect: EMBER_HOST parsed as Ollama's Host()."""

    scheme: str
    host: str  # "" or "0.0.0.0" or "::": every interface
    port: int
    path: str = ""

    @property
    def hostport(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.hostport}" + (f"/{self.path}" if self.path else "")

    @property
    def is_loopback(self) -> bool:
        """Whether the server binds a loopback address: a name counts by the address it
        resolves to first, the one Go's net.Listen (and uvicorn) binds."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            pass
        try:
            first = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)[0][4][0]
        except (OSError, IndexError, UnicodeError):
            return False
        return ipaddress.ip_address(str(first).partition("%")[0]).is_loopback


def parse_host(text: str) -> HostAddress:
    """Ollama's rules: no scheme means http on 11434; http:// and https:// default to 80 and 443;
    a value without a port keeps the default port; a bare port keeps 127.0.0.1 as host."""
    text = text.strip().strip("\"'")
    scheme, has_scheme, rest = text.partition("://")
    default_port = DEFAULT_PORT
    if not has_scheme:
        scheme, rest = "http", text
    elif scheme == "http":
        default_port = 80
    elif scheme == "https":
        default_port = 443
    hostport, _, path = rest.partition("/")
    split = _split_host_port(hostport)
    if split is None:
        host, port_text = _bare_host(hostport), ""
    else:
        host, port_text = split
    return HostAddress(scheme, host, _port(port_text, default_port), path)


def _split_host_port(hostport: str) -> tuple[str, str] | None:
    # as Go's net.SplitHostPort: "[v6]:port" or "host:port"; None when there is no port part
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0 or not hostport[end + 1 :].startswith(":"):
            return None
        return hostport[1:end], hostport[end + 2 :]
    if hostport.count(":") != 1:
        return None
    host, port = hostport.split(":")
    return host, port


def _bare_host(hostport: str) -> str:
    try:
        return str(ipaddress.ip_address(hostport.strip("[]")))
    except ValueError:
        return hostport or "127.0.0.1"


def _port(text: str, default: int) -> int:
    if not text:
        return default
    if not text.isdigit() or int(text) > 65535:
        raise OptionsError(f"EMBER_HOST has an invalid port {text!r}")
    return int(text)
