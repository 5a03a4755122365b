"""The registry allow-list (EMBER_REGISTRIES) and redirect checks: a model name naming another
host is a 403 on /api/pull and /api/push; a redirect may lead within an allowed registry or to
a public address, never to this machine or a private network (no SSRF through a pull)."""

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from registry_server import RegistryServer
from test_store_registry import layer, publish, sha

from ember.store import Digest, RegistryError, Store
from ember.store import allowlist as al
from ember.store import manifest as mt
from ember.store.registry import Registry

WEIGHTS = b"GGUF" + bytes(range(256)) * 64


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("2606:4700:4700::1111", True),
        ("127.0.0.1", False),
        ("127.8.9.10", False),
        ("10.1.2.3", False),
        ("172.16.0.1", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),  # a cloud's metadata service
        ("100.64.0.1", False),  # carrier-grade NAT
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("::1", False),
        ("fe80::1%eth0", False),
        ("fc00::1", False),
        ("::ffff:127.0.0.1", False),  # IPv4-mapped loopback
        ("::ffff:10.0.0.1", False),
        ("localhost", False),  # not an address at all
    ],
)
def test_only_globally_routable_addresses_are_public(address: str, public: bool) -> None:
    assert al.is_public(address) is public


@pytest.mark.parametrize(
    ("url", "allowed", "expected"),
    [
        ("https://registry.ollama.ai/v2/x", ["registry.ollama.ai"], True),
        ("https://Registry.Ollama.ai/v2/x", ["registry.ollama.ai:443"], True),
        ("http://127.0.0.1:5000/v2/x", ["127.0.0.1:5000"], True),
        ("http://127.0.0.1:5001/v2/x", ["127.0.0.1:5000"], False),
        ("http://127.0.0.1:5001/v2/x", ["127.0.0.1"], True),  # no port: any port
        ("https://evil.example/v2/x", ["registry.ollama.ai"], False),
        ("https://registry.ollama.ai.evil.example/", ["registry.ollama.ai"], False),
        ("http://[::1]:8000/", ["[::1]:8000"], True),
        ("https://h/", ["h:notaport"], False),
    ],
)
def test_allow_list_entries_match_host_and_port(url: str, allowed: list[str], expected: bool):
    assert al.is_allowed(httpx.URL(url), allowed) is expected


@pytest.mark.parametrize(
    ("name", "host"),
    [
        ("smollm2:135m", None),
        ("me/tiny", None),
        ("evil.example/x", "evil.example"),  # as Docker reads it
        ("127.0.0.1:5000/x:v1", "127.0.0.1:5000"),
        ("evil.example/library/x", "evil.example"),
        ("https://evil.example/ns/x", "evil.example"),
        ("registry.ollama.ai/library/x", "registry.ollama.ai"),
        ("../x", None),  # no host: an invalid name (a 400), not a refused registry (403)
        ("../../x", None),
    ],
)
def test_the_host_a_model_name_names(name: str, host: str | None) -> None:
    assert al.named_host(name) == host


# ---------------------------------------------------------------- redirects of a real registry


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RegistryServer]:
    with RegistryServer(tmp_path / "registry") as running:
        yield running


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "client")


def pull(store: Store, url: str, name: str, allowed: list[str] | None = None) -> list[dict]:
    with Registry(store, base_url=url, allowed=allowed) as registry:
        return list(registry.pull(name))


def test_a_blob_redirected_within_the_registry_is_downloaded(
    store: Store, server: RegistryServer
) -> None:
    publish(server, "me/tiny", "latest", {mt.MEDIA_MODEL: WEIGHTS})
    digest = sha(WEIGHTS)
    server.redirects[digest] = f"/cdn/{digest}"  # relative: the same (allowed) host
    assert pull(store, server.url, "me/tiny")[-1] == {"status": "success"}
    assert ("GET", f"/cdn/{digest}", None) in server.requests


def test_a_redirect_to_another_loopback_port_is_refused(
    store: Store, server: RegistryServer, tmp_path: Path
) -> None:
    publish(server, "me/tiny", "latest", {mt.MEDIA_MODEL: WEIGHTS})
    digest = sha(WEIGHTS)
    with RegistryServer(tmp_path / "inside") as inside:  # a service on this machine
        server.redirects[digest] = f"{inside.url}/cdn/{digest}"
        host = server.url.removeprefix("http://")
        with pytest.raises(al.UnsafeRedirectError, match=r"127\.0\.0\.1.*not a public address"):
            pull(store, server.url, "me/tiny", allowed=[host])
        assert inside.requests == []  # never contacted
    assert not store.has_blob(Digest.parse(digest))


# ---------------------------------------------------------------- redirects, in-process


def mock_registry(cdn_location: str, hops: int = 1) -> httpx.Client:
    """registry.test serving one model whose blob redirects `hops` times, then to
    cdn_location; cdn.test serves the blob."""
    config = json.dumps({"model_format": "gguf"}).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": mt.MANIFEST_MEDIA_TYPE,
        "config": layer(mt.CONFIG_MEDIA_TYPE, config),
        "layers": [layer(mt.MEDIA_MODEL, WEIGHTS)],
    }
    blobs = {sha(config): config, sha(WEIGHTS): WEIGHTS}

    def answer(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/manifests/latest"):
            return raw(json.dumps(manifest).encode())
        digest = path.rsplit("/", 1)[-1]
        hop = int(request.url.params.get("hop", "0"))
        if request.url.host == "registry.test" and digest == sha(WEIGHTS):
            location = f"{path}?hop={hop + 1}" if hop < hops - 1 else cdn_location
            return httpx.Response(307, headers={"Location": location})
        return raw(blobs[digest])

    return httpx.Client(transport=httpx.MockTransport(answer))


def raw(data: bytes) -> httpx.Response:
    # a stream, not content=: the registry client reads bodies with iter_raw
    return httpx.Response(200, stream=httpx.ByteStream(data))


def test_a_redirect_to_a_public_cdn_is_followed(store, monkeypatch) -> None:
    monkeypatch.setattr(al, "resolve_host", lambda host, port: ["93.184.216.34"])
    client = mock_registry(f"https://cdn.test/blobs/{sha(WEIGHTS)}", hops=3)
    with Registry(store, base_url="https://registry.test", client=client) as registry:
        assert list(registry.pull("me/tiny"))[-1] == {"status": "success"}


def test_a_redirect_to_a_name_of_a_private_address_is_refused(store, monkeypatch) -> None:
    monkeypatch.setattr(al, "resolve_host", lambda host, port: ["93.184.216.34", "10.0.0.7"])
    client = mock_registry(f"https://cdn.test/blobs/{sha(WEIGHTS)}")
    refused = pytest.raises(al.UnsafeRedirectError, match=r"cdn\.test \(10\.0\.0\.7\)")
    with Registry(store, base_url="https://registry.test", client=client) as registry, refused:
        list(registry.pull("me/tiny"))


def test_endless_redirects_stop(store) -> None:
    client = mock_registry("https://cdn.test/never", hops=50)
    refused = pytest.raises(RegistryError, match="more than 5 redirects")
    with Registry(store, base_url="https://registry.test", client=client) as registry, refused:
        list(registry.pull("me/tiny"))


# ---------------------------------------------------------------- the server's routes


@pytest.fixture
def client(tmp_path: Path, server: RegistryServer, monkeypatch) -> Iterator[TestClient]:
    from ember.server.model_routes import router

    monkeypatch.setenv("EMBER_REGISTRY", server.url)  # the default registry: a local one
    monkeypatch.delenv("EMBER_REGISTRIES", raising=False)
    app = FastAPI()
    app.include_router(router)
    app.state.store = Store(tmp_path / "served")
    with TestClient(app) as test_client:
        yield test_client


@pytest.mark.parametrize(
    "name", ["evil.example/x", "evil.example/library/x", "https://evil.example/ns/x:v1"]
)
def test_pull_and_push_naming_another_registry_are_403(client: TestClient, name: str) -> None:
    for path in ("/api/pull", "/api/push"):
        for stream in (True, False):
            resp = client.post(path, json={"model": name, "stream": stream})
            assert resp.status_code == 403, (path, resp.text)
            message = resp.json()["error"]
            assert "'evil.example' is not allowed" in message and "EMBER_REGISTRIES" in message


def test_the_default_registry_pulls_while_another_is_refused(
    client: TestClient, server: RegistryServer, monkeypatch
) -> None:
    publish(server, "me/tiny", "latest", {mt.MEDIA_MODEL: WEIGHTS})
    assert client.post("/api/pull", json={"model": "evil.example/x"}).status_code == 403
    resp = client.post("/api/pull", json={"model": "me/tiny", "stream": False})
    assert resp.status_code == 200 and resp.json() == {"status": "success"}
    # an allow-list without the configured registry refuses it too
    monkeypatch.setenv("EMBER_REGISTRIES", "registry.ollama.ai")
    resp = client.post("/api/pull", json={"model": "me/tiny"})
    assert resp.status_code == 403 and "127.0.0.1" in resp.json()["error"]
    # a bundled name reaches no registry: it is not refused
    installs: list[object] = []

    def install(entry: object) -> None:
        installs.append(entry)
        raise RegistryError("no installs in this test")

    client.app.state.catalogue_install = install  # type: ignore[attr-defined]
    resp = client.post("/api/pull", json={"model": "smollm2:135m"})
    assert resp.status_code == 200 and len(installs) == 1
    assert resp.text.splitlines()[0] == '{"status":"pulling manifest"}'
