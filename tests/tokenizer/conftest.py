"""Tokenizers of the real models, built once per session (with their build times)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizer_models import REFERENCE_KEYS, Built, build


@pytest.fixture(scope="session")
def smollm2(smollm2_path: Path) -> Built:
    return build("smollm2", smollm2_path)


@pytest.fixture(scope="session")
def gemma3(gemma3_path: Path) -> Built:
    return build("gemma3", gemma3_path)


@pytest.fixture(scope="session")
def qwen2(qwen2_path: Path) -> Built:
    return build("qwen2", qwen2_path)


@pytest.fixture(params=list(REFERENCE_KEYS))
def model(request: pytest.FixtureRequest) -> Built:
    """Each real model's tokenizer in turn."""
    built: Built = request.getfixturevalue(request.param)
    return built
