"""`ember serve` prunes the store at start as Ollama's serve does: an old blob no model uses goes,
unless EMBER_NOPRUNE; the models' own blobs and a recent upload stay."""

import os
from pathlib import Path

import pytest

from ember.server.app import prune_store
from ember.store import Store


@pytest.mark.parametrize(("no_prune", "kept"), [("", False), ("1", True)])
def test_an_old_unused_blob_goes_at_start_unless_noprune(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_prune: str, kept: bool
) -> None:
    monkeypatch.setenv("EMBER_MODELS", str(tmp_path / "models"))
    monkeypatch.setenv("EMBER_NOPRUNE", no_prune)
    store = Store(tmp_path / "models")
    old = store.write_blob(b"uploaded by a create that failed").digest
    os.utime(store.blob_path(old), (0, 0))
    recent = store.write_blob(b"uploaded a moment ago").digest
    prune_store()
    assert store.has_blob(old) is kept and store.has_blob(recent)


def test_a_store_that_cannot_be_read_leaves_the_start_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "models").write_text("a file where the store's folder should be")
    monkeypatch.setenv("EMBER_MODELS", str(tmp_path / "models"))
    monkeypatch.delenv("EMBER_NOPRUNE", raising=False)
    prune_store()  # logged, not raised
