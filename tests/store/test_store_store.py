"""The store on disk: blobs written atomically and verified, manifests written last, listing,
copy, delete with pruning, resolving a model; nothing broken after an interrupted write."""

import hashlib
import json
import os
from pathlib import Path

import pytest

from ember.errors import ModelNotFoundError
from ember.store import (
    BlobDigestError,
    BlobSizeError,
    Digest,
    InvalidDigestError,
    InvalidNameError,
    Layer,
    Manifest,
    ManifestError,
    Store,
    StoreError,
    get_model,
    list_models,
)
from ember.store import manifest as mt


def digest_of(data: bytes) -> Digest:
    return Digest(hashlib.sha256(data).hexdigest())


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())


def add_model(store: Store, name: str, *, model: bytes = b"GGUF-weights", **texts: bytes) -> None:
    """A model of a weights blob, a config and optional layers (template=..., system=...)."""
    layers = [Layer(mt.MEDIA_MODEL, store.write_blob(model).digest, len(model), "file.gguf")]
    for kind, data in texts.items():
        layers.append(Layer(mt.MEDIA_PREFIX + kind, store.write_blob(data).digest, len(data)))
    config = {"model_format": "gguf", "model_family": "llama", "model_families": ["llama"]}
    config |= {"model_type": "135M", "file_type": "Q4_1"}
    raw = json.dumps(config).encode()
    info = store.write_blob(raw)
    store.write_manifest(
        name, Manifest(Layer(mt.CONFIG_MEDIA_TYPE, info.digest, len(raw)), tuple(layers))
    )


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "models")


# ---------------------------------------------------------------- blobs


def test_write_blob_hashes_and_names_the_file_by_digest(store: Store) -> None:
    data = os.urandom(3 * 1024 * 1024 + 7)
    info = store.write_blob(iter([data[:1000], data[1000:]]), expected=digest_of(data))
    assert info.digest == digest_of(data) and info.size == len(data)
    assert store.blob_path(info.digest).read_bytes() == data
    assert store.blob_path(info.digest).name == f"sha256-{info.digest.hex}"
    assert files_under(store.tmp_dir) == []


def test_write_blob_from_a_file_object(store: Store, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"x" * 5000)
    with open(src, "rb") as f:
        info = store.write_blob(f)
    assert store.has_blob(info.digest) and info.size == 5000


def test_wrong_digest_is_refused_and_leaves_nothing(store: Store) -> None:
    with pytest.raises(BlobDigestError, match="digest mismatch"):
        store.write_blob(b"hello", expected=digest_of(b"other"))
    assert files_under(store.root) == []


def test_quota_is_enforced_while_streaming(tmp_path: Path) -> None:
    store = Store(tmp_path / "models", max_blob_bytes=1000)
    with pytest.raises(BlobSizeError, match="limit of 1000"):
        store.write_blob(iter([b"a" * 600, b"b" * 600]))
    assert files_under(store.root) == []
    with pytest.raises(BlobSizeError):  # a declared size above the quota: refused up front
        store.blob_writer(size=10**10)


def test_declared_size_must_match(store: Store) -> None:
    with pytest.raises(BlobSizeError, match="longer than its declared 3"):
        store.write_blob(b"abcd", size=3)
    with pytest.raises(BlobSizeError, match="ended after 4 of 5"):
        store.write_blob(b"abcd", size=5)
    assert files_under(store.root) == []


def test_interrupted_blob_write_leaves_no_blob(store: Store) -> None:
    def stream():
        yield b"a" * 1000
        raise ConnectionError("client went away")

    with pytest.raises(ConnectionError):
        store.write_blob(stream())
    assert files_under(store.root) == []


def test_resumable_writer_keeps_a_good_partial_and_continues(store: Store) -> None:
    data = os.urandom(10_000)
    digest = digest_of(data)
    with store.blob_writer(expected=digest, size=len(data), resume=True) as writer:
        writer.write(data[:4000])  # then the connection breaks: no commit
    assert [p.name for p in store.tmp_dir.iterdir() if p.name != "store.lock"] == [
        f"{digest.filename}-partial"
    ]
    with store.blob_writer(expected=digest, size=len(data), resume=True) as writer:
        assert writer.written == 4000
        writer.write(data[4000:])
        writer.commit()
    assert store.blob_path(digest).read_bytes() == data
    assert [p.name for p in store.tmp_dir.iterdir() if p.name != "store.lock"] == []


def test_a_second_writer_of_the_same_partial_is_refused(store: Store) -> None:
    digest = digest_of(b"data")
    with (
        store.blob_writer(expected=digest, size=4, resume=True),
        pytest.raises(StoreError, match="already under way"),
    ):
        store.blob_writer(expected=digest, size=4, resume=True)


def test_bad_partial_is_dropped(store: Store) -> None:
    digest = digest_of(b"good")
    with store.blob_writer(expected=digest, size=4, resume=True) as writer:
        writer.write(b"evil")
        with pytest.raises(BlobDigestError):
            writer.commit()
    assert not (store.tmp_dir / f"{digest.filename}-partial").exists()
    assert not store.has_blob(digest)


def test_blob_path_refuses_bad_digests(store: Store) -> None:
    for bad in ("../../x", "sha256:../../x", "sha256-" + "a" * 63 + "/"):
        with pytest.raises(InvalidDigestError):
            store.blob_path(bad)


# ---------------------------------------------------------------- manifests and models


def test_manifest_layout_matches_ollama(store: Store) -> None:
    add_model(store, "smollm2:135m")
    path = store.root / "manifests/registry.ollama.ai/library/smollm2/135m"
    body = json.loads(path.read_bytes())
    assert body["schemaVersion"] == 2
    assert body["mediaType"] == "application/vnd.docker.distribution.manifest.v2+json"
    assert body["config"]["mediaType"] == "application/vnd.docker.container.image.v1+json"
    assert body["layers"][0]["mediaType"] == "application/vnd.ollama.image.model"
    assert body["layers"][0]["from"] == "file.gguf"
    for layer in [body["config"], *body["layers"]]:
        assert (store.root / "blobs" / layer["digest"].replace(":", "-")).stat().st_size == layer[
            "size"
        ]


def test_list_models_reports_name_size_digest_and_details(store: Store) -> None:
    add_model(store, "smollm2:135m", template=b"{{ .Prompt }}")
    add_model(store, "me/other", model=b"other weights")
    entries = {e.name.display_shortest(): e for e in list_models(store)}
    assert set(entries) == {"smollm2:135m", "me/other:latest"}
    entry = entries["smollm2:135m"]
    raw = store.manifest_path("smollm2:135m").read_bytes()
    assert entry.digest == hashlib.sha256(raw).hexdigest()
    assert entry.size == Manifest.from_bytes(raw).size
    assert entry.details.family == "llama" and entry.details.quantization_level == "Q4_1"
    assert entry.details.parameter_size == "135M" and entry.details.parent_model == "file.gguf"
    shown = entry.to_json()
    assert shown["name"] == shown["model"] == "smollm2:135m"
    assert shown["details"]["families"] == ["llama"]


def test_write_manifest_refuses_missing_blobs(store: Store) -> None:
    config = Layer(mt.CONFIG_MEDIA_TYPE, digest_of(b"{}"), 2)
    with pytest.raises(StoreError, match="blobs missing"):
        store.write_manifest("ghost", Manifest(config, ()))
    assert list_models(store) == []


def test_failing_manifest_write_leaves_nothing_listed(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_model(store, "kept")
    real_replace = os.replace

    def broken_replace(src: str, dst: str) -> None:
        if "manifests" in str(dst):
            raise OSError("disk full")
        real_replace(src, dst)  # blobs still arrive: only the manifest fails

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        add_model(store, "new", model=b"new weights")
    monkeypatch.undo()
    assert store.has_blob(digest_of(b"new weights"))
    assert [e.name.model for e in list_models(store)] == ["kept"]
    assert [p.name for p in store.tmp_dir.iterdir() if p.name != "store.lock"] == []


def test_a_replaced_manifest_is_never_half_written(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    add_model(store, "m", system=b"first")
    before = store.manifest_path("m").read_bytes()
    real_fsync = os.fsync

    def crash(fd: int) -> None:
        real_fsync(fd)
        if "manifest-" in os.readlink(f"/proc/self/fd/{fd}"):
            raise KeyboardInterrupt  # killed between writing the temp file and the rename

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(KeyboardInterrupt):
        add_model(store, "m", system=b"second")
    monkeypatch.undo()
    assert store.manifest_path("m").read_bytes() == before
    assert get_model(store, "m").system == "first"
    assert store.has_blob(digest_of(b"second"))  # the new blobs were there; only the rename was not
    assert [p.name for p in store.tmp_dir.iterdir() if p.name != "store.lock"] == []


def test_unreadable_manifests_are_skipped(store: Store) -> None:
    add_model(store, "good")
    bad = store.manifests_dir / "registry.ollama.ai/library/bad/latest"
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    evil = store.manifests_dir / "registry.ollama.ai/library/evil/latest"
    evil.parent.mkdir(parents=True)
    evil.write_text(
        json.dumps(
            {"config": {"mediaType": "x", "digest": "sha256:../../x", "size": 1}, "layers": []}
        )
    )
    assert [e.name.model for e in list_models(store)] == ["good"]
    with pytest.raises(ManifestError):
        store.read_manifest("evil")


def test_get_model_resolves_every_layer(store: Store) -> None:
    params = json.dumps({"stop": ["<|im_end|>"], "temperature": 0.2}).encode()
    messages = json.dumps([{"role": "user", "content": "hi"}]).encode()
    add_model(
        store,
        "m",
        template=b"T",
        system=b"S",
        params=params,
        license=b"MIT",
        messages=messages,
    )
    model = get_model(store, "M")  # names are case-insensitive
    assert model.model_path is not None and model.model_path.read_bytes() == b"GGUF-weights"
    assert model.model_path.is_relative_to(store.root)
    assert (model.template, model.system, model.license) == ("T", "S", ("MIT",))
    assert model.parameters == {"stop": ["<|im_end|>"], "temperature": 0.2}
    assert model.messages == ({"role": "user", "content": "hi"},)
    assert model.details.format == "gguf"


def test_missing_model_is_not_found(store: Store) -> None:
    with pytest.raises(ModelNotFoundError, match="model 'nope:latest' not found"):
        get_model(store, "nope")


def test_copy_shares_blobs_and_delete_prunes_only_unshared(store: Store) -> None:
    add_model(store, "a", system=b"only a")
    store.copy("a", "b")
    add_model(store, "c", model=b"GGUF-weights", system=b"only c")  # shares the weights
    blobs = set(files_under(store.blobs_dir))
    store.delete("a")
    assert set(files_under(store.blobs_dir)) == blobs  # b still names all of a's blobs
    store.delete("b")
    remaining = set(files_under(store.blobs_dir))
    weights = digest_of(b"GGUF-weights").filename
    assert weights in remaining and digest_of(b"only a").filename not in remaining
    assert [e.name.model for e in list_models(store)] == ["c"]
    assert not (store.manifests_dir / "registry.ollama.ai/library/a").exists()  # empty dirs go


def test_delete_missing_model_raises(store: Store) -> None:
    with pytest.raises(ModelNotFoundError):
        store.delete("nope")


def test_copy_to_a_name_differing_only_in_case_reuses_it(store: Store) -> None:
    add_model(store, "Model")
    add_model(store, "other", model=b"x")
    store.copy("other", "model")
    assert [n.model for n in store.names()] == ["Model", "other"]


def test_prune_spares_referenced_and_recent_blobs(store: Store) -> None:
    add_model(store, "m")
    orphan_old = store.write_blob(b"old orphan").digest
    orphan_new = store.write_blob(b"new orphan").digest
    past = 0
    os.utime(store.blob_path(orphan_old), (past, past))
    stale_tmp = store.tmp_dir / "blob-stale"
    stale_tmp.write_bytes(b"x")
    os.utime(stale_tmp, (past, past))
    assert store.prune(grace_seconds=3600) == [orphan_old]
    assert store.has_blob(orphan_new) and not stale_tmp.exists()
    assert get_model(store, "m").model_path is not None


def test_no_blob_goes_while_a_manifest_cannot_be_read(store: Store) -> None:
    """Its blobs are unknown: a prune (or a delete) keeps every blob, and the mended manifest
    finds its model whole (Ollama's serve skips its prune on a corrupt manifest)."""
    add_model(store, "broken", model=b"the broken one's weights")
    add_model(store, "gone", model=b"the deleted one's weights")
    path = store.manifest_path("broken")
    good = path.read_bytes()
    path.write_bytes(good[:100])
    for blob in store.blobs_dir.iterdir():
        os.utime(blob, (0, 0))
    assert store.prune(grace_seconds=3600) == []
    store.delete("gone")
    blobs = sorted(store.blobs_dir.iterdir())
    path.write_bytes(good)
    assert get_model(store, "broken").model_path in blobs
    assert store.prune(grace_seconds=3600) != []  # readable again: the deleted one's go


def test_a_symlink_out_of_the_store_is_refused(tmp_path: Path) -> None:
    store = Store(tmp_path / "models")
    outside = tmp_path / "outside"
    outside.mkdir()
    (store.manifests_dir / "registry.ollama.ai").symlink_to(outside)
    info = store.write_blob(b"{}")
    config = Layer(mt.CONFIG_MEDIA_TYPE, info.digest, info.size)
    with pytest.raises(StoreError, match="outside the model store"):
        store.write_manifest("m", Manifest(config, ()))
    assert files_under(outside) == []


def test_a_valid_name_too_long_for_a_folder_is_an_invalid_name(store: Store) -> None:
    """Ollama's rules allow a 350-character host; a folder name stops at 255 bytes."""
    name = "h" * 300 + "/ns/m:t"
    for attempt in (lambda: store.manifest_path(name), lambda: store.delete(name)):
        with pytest.raises(InvalidNameError, match="longer than 255"):
            attempt()
