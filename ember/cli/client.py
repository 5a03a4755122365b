"""The CLI's client of the Ember server at EMBER_HOST: JSON calls, NDJSON streams and blob
uploads over httpx. Every failure becomes a CLIError of one line; nothing here prints."""

import hashlib
import json
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from ember import envconfig
from ember.errors import EmberError

READ_CHUNK = 1 << 20
CONNECT_TIMEOUT = 5.0


class CLIError(EmberError):
    """What the CLI prints as `Error: <message>` before exiting non-zero."""


def server_url() -> str:
    """Where to reach the server: EMBER_HOST, with an every-interface bind address replaced by
    loopback (a server listening on 0.0.0.0 is reached on 127.0.0.1)."""
    address = envconfig.host()
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(address.host, address.host)
    host = f"[{host}]" if ":" in host else host
    path = f"/{address.path}" if address.path else ""
    return f"{address.scheme}://{host}:{address.port}{path}"


def tls_verify() -> ssl.SSLContext | bool:
    """What an https server's certificate is checked against: the CAs in SSL_CERT_FILE when
    it is set (a private CA), else httpx's default bundle."""
    ca = envconfig.ca_file()
    if ca is None:
        return True
    try:
        return ssl.create_default_context(cafile=str(ca))
    except (OSError, ssl.SSLError) as e:
        raise CLIError(f"SSL_CERT_FILE {ca} cannot be used: {e}") from None


class Client:
    """One connection pool to the server; generation streams have no read timeout."""

    def __init__(self, base_url: str | None = None) -> None:
        self.base_url = base_url or server_url()
        headers = {"User-Agent": "ember-cli"}
        key = envconfig.api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        timeout = httpx.Timeout(None, connect=CONNECT_TIMEOUT)
        self.http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, verify=tls_verify()
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def is_running(self) -> bool:
        """Whether a server answers; a certificate not trusted raises CLIError (a server is
        running: starting another would not help)."""
        try:
            return self.http.get("/", timeout=2.0).status_code == 200
        except httpx.HTTPError as e:
            if "CERTIFICATE_VERIFY_FAILED" in str(e):
                raise self._unreachable(e) from None
            return False

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The JSON answer (None for an empty one); CLIError for an error status."""
        try:
            resp = self.http.request(method, path, **_json(body))
        except httpx.HTTPError as e:
            raise self._unreachable(e) from None
        _check(resp)
        return resp.json() if resp.content else None

    def stream(self, path: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The records of an NDJSON answer; an {"error"} record raises CLIError. Leaving the
        iteration early (Ctrl-C) closes the connection, which cancels the request."""
        try:
            with self.http.stream("POST", path, **_json(body)) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    _check(resp)
                for line in resp.iter_lines():
                    if line.strip():
                        yield _record(line)
        except httpx.HTTPError as e:
            raise self._unreachable(e) from None

    def upload_blob(self, path: Path) -> str:
        """Uploads a file as a blob unless the server has it; returns its digest."""
        digest = "sha256:" + _sha256(path)
        try:
            if self.http.head(f"/api/blobs/{digest}").status_code == 200:
                return digest
            with open(path, "rb") as f:
                resp = self.http.post(f"/api/blobs/{digest}", content=_chunks(f))
        except httpx.HTTPError as e:
            raise self._unreachable(e) from None
        except OSError as e:
            raise CLIError(f"cannot read {path}: {e.strerror or e}") from None
        _check(resp)
        return digest

    def _unreachable(self, err: httpx.HTTPError) -> CLIError:
        if "CERTIFICATE_VERIFY_FAILED" in str(err):
            return CLIError(
                f"the certificate of {self.base_url} is not trusted ({err}); "
                "set SSL_CERT_FILE to the CA that signed it"
            )
        if isinstance(err, httpx.ConnectError):
            return CLIError(f"could not connect to ember server at {self.base_url}: is it running?")
        return CLIError(f"the request to {self.base_url} failed: {err or type(err).__name__}")


def _json(body: dict[str, Any] | None) -> dict[str, Any]:
    """httpx's arguments for body as JSON. Text from argv, stdin and files holds the bytes it
    could not decode as UTF-8 as surrogates (Python's surrogateescape), which no UTF-8 encoder
    takes: each becomes U+FFFD, as Go's encoder (Ollama's client) writes invalid UTF-8."""
    if body is None:
        return {}
    text = json.dumps(body, ensure_ascii=False)
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no undecodable byte made
        raw = text.encode("utf-8", "surrogatepass")
    content = raw.decode("utf-8", "replace").encode("utf-8")
    return {"content": content, "headers": {"content-type": "application/json"}}


def _check(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        message = resp.json().get("error")
    except (ValueError, AttributeError):
        message = None
    text = message if isinstance(message, str) else resp.text.strip()[:200]
    raise CLIError(text or f"the server answered {resp.status_code}")


def _record(line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except ValueError:
        raise CLIError(f"the server sent a line that is not JSON: {line[:80]!r}") from None
    if not isinstance(record, dict):
        raise CLIError("the server sent a record that is not a JSON object")
    if "error" in record:
        raise CLIError(str(record["error"]))
    return record


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(READ_CHUNK):
                digest.update(chunk)
    except OSError as e:
        raise CLIError(f"cannot read {path}: {e.strerror or e}") from None
    return digest.hexdigest()


def _chunks(f: Any) -> Iterator[bytes]:
    while chunk := f.read(READ_CHUNK):
        yield chunk
