"""Pull and push with an Ollama registry (the OCI distribution v2 protocol), yielding Ollama's
progress dicts.

A registry is untrusted: the manifest is bounded (4 MiB) and validated before any path is built
from its digests; each blob is read no further than its declared size and enters the store only
after its sha256 matched. An interrupted download stays in the store's tmp/ and resumes with a
Range request. Registry authentication (ollama.com keys) is not supported.
"""

import concurrent.futures
import contextlib
import ipaddress
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from ember.errors import ModelNotFoundError
from ember.store.allowlist import check_allowed, check_redirect
from ember.store.blobs import READ_CHUNK, BlobWriter, partial_path
from ember.store.errors import (
    BlobBusyError,
    ManifestError,
    RegistryError,
    RegistryNotFoundError,
    StoreError,
)
from ember.store.manifest import MANIFEST_MEDIA_TYPE, MAX_MANIFEST_BYTES, Layer, Manifest
from ember.store.names import ModelName
from ember.store.store import Store, as_name

Progress = dict[str, Any]
PROGRESS_INTERVAL = 0.1  # seconds between two progress dicts of one blob
MAX_ERROR_BODY = 4096  # what we read of an error answer
MAX_REDIRECTS = 5
_OK = (200, 201, 202, 204, 206)


class Registry:
    """A registry client bound to a store. `base_url` overrides the registry the model name
    names (e.g. a mirror or a test registry); http is allowed for loopback hosts or with
    `insecure`, as Ollama's --insecure. `allowed`: the registry hosts it may reach (None: the
    one the transfer starts at); a redirect elsewhere must lead to a public address."""

    def __init__(
        self,
        store: Store,
        *,
        base_url: str | None = None,
        insecure: bool = False,
        client: httpx.Client | None = None,
        timeout: float = 60.0,
        allowed: Sequence[str] | None = None,
    ) -> None:
        self.store = store
        self.allowed = tuple(allowed) if allowed else None
        self.base_url = base_url.rstrip("/") if base_url else None
        self.insecure = insecure
        self.client = client or httpx.Client(timeout=timeout, headers={"User-Agent": "ember"})
        self._owns_client = client is None

    def close(self) -> None:
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> "Registry":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ pull

    def pull(self, name: ModelName | str) -> Iterator[Progress]:
        """Downloads `name` into the store; yields Ollama's pull progress, then "success"."""
        name = as_name(name)
        base = self._base(name)
        target = self.store.existing_name(name)
        old = _old_manifest(self.store, target)
        yield {"status": "pulling manifest"}
        raw = self._get_manifest(base, name)
        try:
            manifest = Manifest.from_bytes(raw)
        except ManifestError as e:
            raise RegistryError(f"pull model manifest: {e}") from None
        for layer in _unique(manifest):
            yield from self._download(base, name, layer)
        yield {"status": "verifying sha256 digest"}  # done while downloading, before each rename
        yield {"status": "writing manifest"}
        self.store.write_manifest(target, raw)
        if old is not None and old.digests() - manifest.digests():
            yield {"status": "removing unused layers"}
            self.store.remove_unused_blobs(old.digests() - manifest.digests())
        yield {"status": "success"}

    def _get_manifest(self, base: str, name: ModelName) -> bytes:
        url = f"{base}/v2/{name.repository}/manifests/{name.tag}"
        headers = {"Accept": MANIFEST_MEDIA_TYPE, "Accept-Encoding": "identity"}
        with self._get(base, url, headers=headers) as resp:
            _check(resp, f"model '{name.display_shortest()}'")
            declared = _content_length(resp)
            if declared is not None and declared > MAX_MANIFEST_BYTES:
                raise RegistryError(f"manifest of {declared} bytes exceeds {MAX_MANIFEST_BYTES}")
            data = bytearray()
            for chunk in resp.iter_raw(READ_CHUNK):
                data += chunk
                if len(data) > MAX_MANIFEST_BYTES:
                    raise RegistryError(f"manifest is larger than {MAX_MANIFEST_BYTES} bytes")
        return bytes(data)

    def _download(self, base: str, name: ModelName, layer: Layer) -> Iterator[Progress]:
        def progress(done: int) -> Progress:
            return _progress(f"pulling {layer.digest.short}", layer, done)

        writer = None
        while writer is None:
            if self.store.has_blob(layer.digest):
                yield progress(layer.size)
                return
            try:
                writer = self.store.blob_writer(expected=layer.digest, size=layer.size, resume=True)
            except BlobBusyError:
                # another pull has this layer under way (another client's, or one whose client
                # just went away): follow its progress and take over if it stops, as Ollama's
                # second pull of a layer joins the first
                yield progress(self._partial_size(layer))
                time.sleep(PROGRESS_INTERVAL)
        if self.store.has_blob(layer.digest):  # published just before we took the partial file
            writer.discard()
            yield progress(layer.size)
            return
        url = f"{base}/v2/{name.repository}/blobs/{layer.digest}"
        with writer:
            yield progress(writer.written)
            if writer.written < layer.size:
                yield from self._fetch(base, url, writer, progress)
            writer.commit()
        yield progress(layer.size)

    def _partial_size(self, layer: Layer) -> int:
        try:
            return min(partial_path(self.store.tmp_dir, layer.digest).stat().st_size, layer.size)
        except OSError:
            return 0

    def _fetch(
        self, base: str, url: str, writer: BlobWriter, progress: Callable[[int], Progress]
    ) -> Iterator[Progress]:
        """Streams the blob into `writer`, resuming at what it holds."""
        headers = {"Accept-Encoding": "identity"}
        if writer.written:
            headers["Range"] = f"bytes={writer.written}-"
        try:
            with self._get(base, url, headers=headers) as resp:
                _check(resp, f"blob {writer.expected}")
                _start_at(resp, writer)
                last = time.monotonic()
                for chunk in resp.iter_raw():  # as received: an interruption loses nothing
                    writer.write(chunk)  # raises past the declared size: we read no further
                    if time.monotonic() - last >= PROGRESS_INTERVAL:
                        last = time.monotonic()
                        yield progress(writer.written)
        except _TransportError as e:
            raise RegistryError(
                f"download of {writer.expected} stopped after {writer.written} bytes ({e}); "
                "pull again to resume"
            ) from None

    # ------------------------------------------------------------ push

    def push(self, name: ModelName | str) -> Iterator[Progress]:
        """Uploads the stored model `name`; yields Ollama's push progress, then "success"."""
        name = as_name(name)
        base = self._base(name)
        yield {"status": "retrieving manifest"}
        stored = self.store.read_manifest(name)
        for layer in _unique(stored.manifest):
            yield from self._upload(base, name, layer)
        yield {"status": "pushing manifest"}
        url = f"{base}/v2/{name.repository}/manifests/{name.tag}"
        headers = {"Content-Type": MANIFEST_MEDIA_TYPE}
        with self._stream("PUT", url, content=stored.raw, headers=headers) as resp:
            _check(resp, f"manifest of '{name.display_shortest()}'")
        yield {"status": "success"}

    def _upload(self, base: str, name: ModelName, layer: Layer) -> Iterator[Progress]:
        def progress(done: int) -> Progress:
            return _progress(f"pushing {layer.digest.short}", layer, done)

        if not self.store.has_blob(layer.digest):
            raise StoreError(f"blob {layer.digest} is missing from the store: cannot push it")
        blob_url = f"{base}/v2/{name.repository}/blobs/{layer.digest}"
        with self._stream("HEAD", blob_url) as resp:
            if resp.status_code == 200:
                yield progress(layer.size)
                return
            if resp.status_code != 404:
                _check(resp, f"blob {layer.digest}")
        with self._stream("POST", f"{base}/v2/{name.repository}/blobs/uploads/") as resp:
            _check(resp, "upload")
            if resp.status_code == 201:  # the registry mounted the blob it already had
                yield progress(layer.size)
                return
            location = resp.headers.get("Docker-Upload-Location") or resp.headers.get("Location")
        if not location:
            raise RegistryError("the registry did not say where to upload (no Location header)")
        target = httpx.URL(base).join(location).copy_merge_params({"digest": str(layer.digest)})
        self._check_hop(base, target)
        yield progress(0)
        yield from self._put_blob(target, self.store.blob_path(layer.digest), progress)
        yield progress(layer.size)

    def _put_blob(
        self, url: httpx.URL, path: Path, progress: Callable[[int], Progress]
    ) -> Iterator[Progress]:
        """PUTs the file from a worker thread, so that progress can be yielded meanwhile."""
        sent, stop = [0], threading.Event()

        def body() -> Iterator[bytes]:
            with open(path, "rb") as f:
                while chunk := f.read(READ_CHUNK):
                    if stop.is_set():
                        raise RegistryError("push cancelled")
                    sent[0] += len(chunk)
                    yield chunk

        def put() -> None:
            size = str(path.stat().st_size)
            headers = {"Content-Type": "application/octet-stream", "Content-Length": size}
            with self._stream("PUT", url, content=body(), headers=headers) as resp:
                _check(resp, f"upload of {path.name}")

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            future = pool.submit(put)
            try:
                while not _wait(future, PROGRESS_INTERVAL):
                    yield progress(sent[0])
                future.result()
            finally:
                stop.set()  # a consumer that stops iterating cancels the upload

    # ------------------------------------------------------------ plumbing

    def _base(self, name: ModelName) -> str:
        scheme = "http" if self.insecure else name.scheme
        base = self.base_url or f"{scheme}://{name.host}"
        self._check_scheme(httpx.URL(base))
        check_allowed(httpx.URL(base), self._allowed(base))
        return base

    def _allowed(self, base: str) -> tuple[str, ...]:
        return self.allowed or (httpx.URL(base).netloc.decode(),)

    def _check_hop(self, base: str, url: httpx.URL) -> None:
        """A redirect or an upload location of the registry at base: http only where allowed,
        and a host other than an allowed registry only at a public address."""
        self._check_scheme(url)
        check_redirect(url, self._allowed(base))

    @contextlib.contextmanager
    def _get(self, base: str, url: str, **kwargs: Any) -> Iterator[httpx.Response]:
        """A streamed GET that follows redirects itself, so that each hop is checked."""
        target = httpx.URL(url)
        for _ in range(MAX_REDIRECTS + 1):
            with self._stream("GET", target, **kwargs) as resp:
                if not resp.is_redirect:
                    yield resp
                    return
                location = resp.headers.get("Location", "")
            target = target.join(location)
            self._check_hop(base, target)
        raise RegistryError(f"GET {url}: more than {MAX_REDIRECTS} redirects")

    def _check_scheme(self, url: httpx.URL) -> None:
        if url.scheme not in ("http", "https"):
            raise RegistryError(f"registry URL {url} must be http or https")
        if url.scheme == "http" and not (self.insecure or _is_loopback(url.host)):
            raise RegistryError(f"insecure protocol http for {url.host}: pass insecure to allow it")

    @contextlib.contextmanager
    def _stream(self, method: str, url: str | httpx.URL, **kwargs: Any) -> Iterator[httpx.Response]:
        """A streamed request: no answer is ever read into memory unbounded."""
        try:
            with self.client.stream(method, url, **kwargs) as resp:
                yield resp
        except httpx.HTTPError as e:
            raise _TransportError(f"{method} {url} failed: {e or type(e).__name__}") from None


class _TransportError(RegistryError):
    """The connection failed or broke off (as opposed to a refusal by the registry)."""


def _progress(status: str, layer: Layer, done: int) -> Progress:
    return {"status": status, "digest": str(layer.digest), "total": layer.size, "completed": done}


def _check(resp: httpx.Response, what: str) -> None:
    if resp.status_code in _OK:
        return
    if resp.status_code in (401, 403):
        raise RegistryError(
            f"unauthorized: access to {what} denied (registry authentication is not supported)"
        )
    if resp.status_code == 404:
        raise RegistryNotFoundError(f"{what} not found in the registry")
    body = bytearray()
    for chunk in resp.iter_raw(MAX_ERROR_BODY):
        body += chunk
        if len(body) >= MAX_ERROR_BODY:
            break
    text = bytes(body[:MAX_ERROR_BODY]).decode("utf-8", "replace").strip()
    raise RegistryError(f"registry answered {resp.status_code} for {what}: {text}")


def _start_at(resp: httpx.Response, writer: BlobWriter) -> None:
    """Makes the writer match the answer: a whole body (200) restarts, a range must continue."""
    if resp.headers.get("Content-Encoding", "identity") != "identity":
        raise RegistryError("the registry sent an encoded blob; only identity is accepted")
    if resp.status_code != 206:
        writer.restart()
        return
    unit, _, spec = resp.headers.get("Content-Range", "").partition(" ")
    start = spec.partition("-")[0]
    if unit != "bytes" or not start.isdigit() or int(start) != writer.written:
        raise RegistryError(f"the registry answered range {spec!r}, not {writer.written}-")


def _content_length(resp: httpx.Response) -> int | None:
    value = resp.headers.get("Content-Length", "")
    return int(value) if value.isdigit() else None


def _unique(manifest: Manifest) -> list[Layer]:
    seen, out = set(), []
    for layer in manifest.blobs():
        if layer.digest not in seen:
            seen.add(layer.digest)
            out.append(layer)
    return out


def _wait(future: concurrent.futures.Future[None], timeout: float) -> bool:
    done, _ = concurrent.futures.wait([future], timeout=timeout)
    return bool(done)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _old_manifest(store: Store, name: ModelName) -> Manifest | None:
    with contextlib.suppress(ModelNotFoundError, StoreError, OSError):
        return store.read_manifest(name).manifest
    return None
