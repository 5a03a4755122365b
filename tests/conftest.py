"""Shared fixtures: tiny random-weight GGUF models, the real model files, the reference outputs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ember.catalog import ModelChecksumError, resolve_model
from ember.errors import ModelNotFoundError

if TYPE_CHECKING:
    from tinymodels import TinyModel

# ours, then the shared ones (shared/ lies beside the repository, in CI as here)
REFERENCE_DIRS = (
    Path(__file__).parent / "reference",
    Path(__file__).resolve().parents[2] / "shared" / "reference",
)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TinyModel]:
    """arch -> TinyModel(arch, path, hf) for llama, qwen2, gemma3 (F32, seed 0).

    Shared by the whole session: never modify the HF models; write your own with
    tinymodels.write_tiny_gguf for other types or sizes.
    """
    pytest.importorskip("transformers", reason="tiny models are built with HF transformers")
    import tinymodels  # late: transformers takes seconds to import

    root = tmp_path_factory.mktemp("tiny")
    models = {}
    for arch in tinymodels.ARCHS:
        path = root / f"tiny-{arch}.gguf"
        models[arch] = tinymodels.TinyModel(arch, path, tinymodels.write_tiny_gguf(arch, path))
    return models


def real_model_path(name: str) -> Path:
    """The verified file of a bundled model; skips the test when its package is missing."""
    try:
        return resolve_model(name)
    except ModelChecksumError:
        raise  # a damaged file is a failure, never a skip
    except ModelNotFoundError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return real_model_path("smollm2:135m")


@pytest.fixture(scope="session")
def gemma3_path() -> Path:
    return real_model_path("gemma3:270m")


@pytest.fixture(scope="session")
def qwen2_path() -> Path:
    return real_model_path("qwen2.5-coder:0.5b")


@pytest.fixture(scope="session")
def load_reference() -> Callable[[str], dict[str, Any]]:
    """load_reference("gemma-3-270m-q4_k_m") -> the parsed <key>.reference.json."""

    def load(key: str) -> dict[str, Any]:
        for folder in REFERENCE_DIRS:
            path = folder / f"{key}.reference.json"
            if path.is_file():
                data: dict[str, Any] = json.loads(path.read_text())
                return data
        pytest.skip(f"no reference file {key}.reference.json in {[str(d) for d in REFERENCE_DIRS]}")

    return load


REFERENCE_KEYS = {
    "smollm2:135m": "smollm2-135m-instruct-q4_1",
    "gemma3:270m": "gemma-3-270m-q4_k_m",
    "qwen2.5-coder:0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m",
    "qwen2.5-coder:1.5b": "qwen2.5-coder-1.5b-instruct-q4_k_m",
}


@pytest.fixture(scope="session")
def reference(load_reference: Callable[[str], dict[str, Any]]) -> Callable[[str], dict[str, Any]]:
    """reference("gemma3:270m") -> the reference file of a bundled model name."""
    return lambda name: load_reference(REFERENCE_KEYS[name])


@pytest.fixture(scope="session")
def real_llm() -> Callable[[str], Any]:
    """ember.LLM objects by bundled name, loaded on first use and shared by every test."""
    from ember import LLM

    loaded: dict[str, LLM] = {}

    def get(name: str) -> LLM:
        if name not in loaded:
            real_model_path(name)  # skips when the package is missing
            loaded[name] = LLM(name)
        return loaded[name]

    return get


@pytest.fixture(scope="session")
def weight_isas() -> Callable[[Any], set[str | None]]:
    """weight_isas(model) -> the ISA paths of its native projections (None: torch's)."""
    from ember.backend.weights import NativeLinear

    def isas(model: Any) -> set[str | None]:
        blocks = [model, *getattr(model, "blocks", [])]
        return {v.isa for b in blocks for v in vars(b).values() if isinstance(v, NativeLinear)}

    return isas
