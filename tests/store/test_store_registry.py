"""Pull and push against a real HTTP registry on loopback (registry_server.py): round trips,
resumed downloads, and hostile registries. Nothing may land outside the store root."""

import hashlib
import json
import os
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from registry_server import RegistryServer, endless

from ember.errors import ModelNotFoundError
from ember.store import (
    BlobDigestError,
    BlobSizeError,
    RegistryError,
    Store,
    get_model,
    list_models,
)
from ember.store import manifest as mt
from ember.store.registry import Registry

MiB = 1 << 20
CONFIG = {"model_format": "gguf", "model_family": "llama", "model_families": ["llama"]}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RegistryServer]:
    with RegistryServer(tmp_path / "registry") as running:
        yield running


@pytest.fixture
def client_dir(tmp_path: Path) -> Path:
    return tmp_path / "client"


@pytest.fixture
def store(client_dir: Path) -> Iterator[Store]:
    store = Store(client_dir / "models")
    yield store
    # whatever happened, nothing was written beside the store
    assert sorted(p.name for p in client_dir.iterdir()) == ["models"]
    assert not any(p.name == "x" for p in client_dir.parent.rglob("*"))


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def layer(media_type: str, data: bytes) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": sha(data), "size": len(data)}


def publish(server: RegistryServer, repo: str, tag: str, blobs: dict[str, bytes]) -> bytes:
    """Serves a model made of `blobs` (media type -> bytes) and a config; returns its manifest."""
    config = json.dumps(CONFIG).encode()
    for data in [config, *blobs.values()]:
        server.add_blob(data)
    return serve_manifest(
        server,
        repo,
        tag,
        {
            "schemaVersion": 2,
            "mediaType": mt.MANIFEST_MEDIA_TYPE,
            "config": layer(mt.CONFIG_MEDIA_TYPE, config),
            "layers": [layer(kind, data) for kind, data in blobs.items()],
        },
    )


def serve_manifest(server: RegistryServer, repo: str, tag: str, body: dict[str, Any]) -> bytes:
    raw = json.dumps(body).encode()
    ns, model = repo.split("/")
    server.manifests[(ns, model, tag)] = raw
    return raw


def pull(store: Store, server: RegistryServer, name: str, **kw: Any) -> list[dict[str, Any]]:
    with Registry(store, base_url=server.url, **kw) as registry:
        return list(registry.pull(name))


def leftovers(store: Store) -> list[str]:
    return sorted(p.name for p in store.tmp_dir.iterdir() if p.name != "store.lock")


# ---------------------------------------------------------------- round trips


def test_pull_then_push_round_trip(store: Store, server: RegistryServer, tmp_path: Path) -> None:
    weights = os.urandom(3 * MiB + 5)
    raw = publish(
        server,
        "library/tiny",
        "latest",
        {mt.MEDIA_MODEL: weights, mt.MEDIA_TEMPLATE: b"{{ .Prompt }}", mt.MEDIA_SYSTEM: b"S"},
    )
    progress = pull(store, server, "tiny")
    statuses = [p["status"] for p in progress]
    assert statuses[0] == "pulling manifest"
    assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    weights_progress = [p for p in progress if p.get("digest") == sha(weights)]
    assert weights_progress[0]["status"] == f"pulling {hashlib.sha256(weights).hexdigest()[:12]}"
    assert weights_progress[-1] == {**weights_progress[-1], "completed": len(weights)}
    assert all(p["total"] == len(weights) for p in weights_progress)
    # stored as served (the digest of a model is the digest of its manifest)
    assert store.manifest_path("tiny").read_bytes() == raw
    model = get_model(store, "tiny")
    assert model.model_path is not None and model.model_path.read_bytes() == weights
    assert (model.template, model.system) == ("{{ .Prompt }}", "S")
    assert [e.details.family for e in list_models(store)] == ["llama"]
    assert leftovers(store) == []

    # push to a second, empty registry: every blob is uploaded, then the manifest
    with RegistryServer(tmp_path / "registry2") as other:
        with Registry(store, base_url=other.url) as registry:
            pushed = list(registry.push("tiny"))
        assert pushed[0]["status"] == "retrieving manifest"
        assert [p["status"] for p in pushed[-2:]] == ["pushing manifest", "success"]
        assert other.manifests[("library", "tiny", "latest")] == raw
        assert other.blob_path(sha(weights)).read_bytes() == weights
        uploads = [r for r in other.requests if r[0] == "POST"]
        assert len(uploads) == 4  # config, weights, template, system
        # pushing again uploads nothing: every HEAD finds the blob
        with Registry(store, base_url=other.url) as registry:
            list(registry.push("tiny"))
        assert len([r for r in other.requests if r[0] == "POST"]) == 4


def test_push_then_pull_into_a_fresh_store(
    store: Store, server: RegistryServer, tmp_path: Path
) -> None:
    weights = os.urandom(MiB)
    publish(server, "library/src", "latest", {mt.MEDIA_MODEL: weights})
    pull(store, server, "src")
    store.copy("src", "me/copy:v1")
    with Registry(store, base_url=server.url) as registry:
        list(registry.push("me/copy:v1"))
    fresh = Store(tmp_path / "client" / "models" / "nested-store")  # inside client_dir
    pull(fresh, server, "me/copy:v1")
    copy = get_model(fresh, "me/copy:v1")
    assert copy.model_path is not None and copy.model_path.read_bytes() == weights


def test_pull_of_an_updated_model_removes_unused_layers(
    store: Store, server: RegistryServer
) -> None:
    publish(server, "library/m", "latest", {mt.MEDIA_MODEL: b"w1", mt.MEDIA_SYSTEM: b"old"})
    pull(store, server, "m")
    publish(server, "library/m", "latest", {mt.MEDIA_MODEL: b"w1", mt.MEDIA_SYSTEM: b"new"})
    statuses = [p["status"] for p in pull(store, server, "m")]
    assert "removing unused layers" in statuses
    assert not store.has_blob(sha(b"old")) and store.has_blob(sha(b"w1"))
    assert get_model(store, "m").system == "new"


def test_existing_blobs_are_not_downloaded_again(store: Store, server: RegistryServer) -> None:
    weights = os.urandom(MiB)
    publish(server, "library/a", "latest", {mt.MEDIA_MODEL: weights})
    publish(server, "library/b", "latest", {mt.MEDIA_MODEL: weights, mt.MEDIA_SYSTEM: b"b"})
    pull(store, server, "a")
    pull(store, server, "b")
    assert server.blob_count(sha(weights)) == 1


# ---------------------------------------------------------------- resume


def test_interrupted_download_resumes_with_range(store: Store, server: RegistryServer) -> None:
    weights = os.urandom(4 * MiB)
    publish(server, "library/big", "latest", {mt.MEDIA_MODEL: weights})
    cut = 2 * MiB + 123
    server.break_after[sha(weights)] = cut
    with pytest.raises(RegistryError, match="pull again to resume"):
        pull(store, server, "big")
    assert list_models(store) == [] and not store.has_blob(sha(weights))
    partial = store.tmp_dir / f"{sha(weights).replace(':', '-')}-partial"
    kept = partial.stat().st_size
    assert MiB < kept <= cut

    pull(store, server, "big")
    ranges = [r for m, p, r in server.requests if m == "GET" and p.endswith(sha(weights))]
    assert ranges == [None, f"bytes={kept}-"]
    model = get_model(store, "big")
    assert model.model_path is not None and model.model_path.read_bytes() == weights
    assert leftovers(store) == []


def test_resume_against_a_registry_that_ignores_range(store: Store, server: RegistryServer) -> None:
    weights = os.urandom(2 * MiB)
    publish(server, "library/big", "latest", {mt.MEDIA_MODEL: weights})
    server.break_after[sha(weights)] = MiB
    with pytest.raises(RegistryError):
        pull(store, server, "big")
    server.ignore_range = True  # answers 200 with the whole body: the partial starts over
    pull(store, server, "big")
    assert store.blob_path(sha(weights)).read_bytes() == weights


def test_abandoned_pull_keeps_its_partial(store: Store, server: RegistryServer) -> None:
    weights = os.urandom(4 * MiB)
    publish(server, "library/big", "latest", {mt.MEDIA_MODEL: weights})
    with Registry(store, base_url=server.url) as registry:
        stream = registry.pull("big")
        for p in stream:
            if p.get("digest") == sha(weights):
                break  # the client went away
        stream.close()
    assert list_models(store) == []
    assert leftovers(store) == [f"{sha(weights).replace(':', '-')}-partial"]
    pull(store, server, "big")
    assert store.blob_path(sha(weights)).read_bytes() == weights


# ---------------------------------------------------------------- hostile registries


@pytest.mark.parametrize("digest", ["../../x", "sha256:../../x", "sha256-../../../x", "/x"])
def test_manifest_with_a_path_for_a_digest_is_refused(
    store: Store, server: RegistryServer, digest: str
) -> None:
    body = {
        "schemaVersion": 2,
        "config": layer(mt.CONFIG_MEDIA_TYPE, b"{}"),
        "layers": [{"mediaType": mt.MEDIA_MODEL, "digest": digest, "size": 1}],
    }
    serve_manifest(server, "library/evil", "latest", body)
    with pytest.raises(RegistryError, match="invalid digest"):
        pull(store, server, "evil")
    assert [r for r in server.requests if "/blobs/" in r[1]] == []  # refused before any fetch
    assert list_models(store) == [] and leftovers(store) == []


def test_blob_with_a_wrong_sha256_is_refused(store: Store, server: RegistryServer) -> None:
    weights = os.urandom(MiB)
    publish(server, "library/evil", "latest", {mt.MEDIA_MODEL: weights})
    server.bodies[sha(weights)] = lambda: iter([os.urandom(len(weights))])
    with pytest.raises(BlobDigestError, match="digest mismatch"):
        pull(store, server, "evil")
    assert not store.has_blob(sha(weights))
    assert list_models(store) == [] and leftovers(store) == []  # a bad partial is not kept


def test_endless_body_stops_at_the_declared_size(store: Store, server: RegistryServer) -> None:
    declared = b"\0" * MiB  # the manifest says 1 MiB; the registry sends "10 GB" and more
    publish(server, "library/evil", "latest", {mt.MEDIA_MODEL: declared})
    server.bodies[sha(declared)] = endless
    deadline = time.monotonic() + 60
    tracemalloc.start()
    try:
        with (
            pytest.raises(BlobSizeError, match="longer than its declared"),
            Registry(store, base_url=server.url) as registry,
        ):
            for _ in registry.pull("evil"):
                assert time.monotonic() < deadline, "the pull did not stop"
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * MiB
    assert list_models(store) == [] and leftovers(store) == []
    assert not store.has_blob(sha(declared))


def test_declared_size_over_the_quota_is_refused_before_download(
    client_dir: Path, server: RegistryServer
) -> None:
    store = Store(client_dir / "models", max_blob_bytes=64 * MiB)
    body = {
        "schemaVersion": 2,
        "config": layer(mt.CONFIG_MEDIA_TYPE, b"{}"),
        "layers": [{"mediaType": mt.MEDIA_MODEL, "digest": sha(b"w"), "size": 10 * 10**9}],
    }
    server.add_blob(b"{}")
    serve_manifest(server, "library/huge", "latest", body)
    server.bodies[sha(b"w")] = endless
    with pytest.raises(BlobSizeError, match="exceeds the limit"):
        pull(store, server, "huge")
    assert server.blob_count(sha(b"w")) == 0
    assert list_models(store) == [] and leftovers(store) == []


def test_oversized_manifest_is_refused(store: Store, server: RegistryServer) -> None:
    server.manifests[("library", "huge", "latest")] = b'{"layers": [' + b" " * (5 * MiB) + b"]}"
    with pytest.raises(RegistryError, match="manifest"):
        pull(store, server, "huge")
    assert list_models(store) == []


def test_manifest_that_is_not_json_is_refused(store: Store, server: RegistryServer) -> None:
    server.manifests[("library", "junk", "latest")] = b"<html>nope</html>"
    with pytest.raises(RegistryError, match="not valid JSON"):
        pull(store, server, "junk")


def test_missing_model_in_registry(store: Store, server: RegistryServer) -> None:
    with pytest.raises(RegistryError, match="not found"):
        pull(store, server, "nothing-here")


def test_plain_http_to_a_remote_host_is_refused(store: Store) -> None:
    refused = pytest.raises(RegistryError, match="insecure protocol http")
    with Registry(store, base_url="http://registry.example.com") as registry, refused:
        list(registry.pull("tiny"))
    refused = pytest.raises(RegistryError, match="insecure protocol http")
    with Registry(store) as registry, refused:  # the name's own scheme: http needs insecure too
        list(registry.pull("http://registry.example.com/ns/tiny"))


def test_push_of_a_missing_model(store: Store, server: RegistryServer) -> None:
    with Registry(store, base_url=server.url) as registry, pytest.raises(ModelNotFoundError):
        list(registry.push("nope"))
