"""A file's own vision tower shows as the vision capability only where Ember runs it: Ollama's
single files of Gemma 3n and Nemotron-H hold towers Ember lacks, and serve text."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from ember.server.model import GGUFFacts, _served
from ember.server.model_show import capabilities
from ember.server.vision import VISION_ARCHS, runs_vision


@pytest.mark.parametrize(
    ("arch", "shown"),
    [("gemma3", True), ("mistral3", True), ("qwen25vl", True), ("mllama", True),
     ("qwen3vl", True), ("qwen3vlmoe", True), ("qwen35", True), ("qwen35moe", True),
     ("gemma4", True), ("gemma3n", False), ("nemotron_h", False)],
)  # fmt: skip
def test_vision_shows_only_where_ember_runs_the_tower(arch: str, shown: bool) -> None:
    metadata = {"general.architecture": arch, f"{arch}.vision.block_count": 2}
    stored = SimpleNamespace(projector_paths=(), template=None)
    assert runs_vision(metadata) is shown
    assert ("vision" in capabilities(metadata, stored)) is shown  # type: ignore[arg-type]
    assert not runs_vision({"general.architecture": arch})  # a text-only file


def test_each_listed_architecture_builds_its_vision() -> None:
    import ember.model.archs  # noqa: F401  (registers them)
    from ember.model.registry import _ARCHS

    vision_modules = {"gemma3_vision", "gemma4_vision", "mistral3", "qwen25vl", "qwen3vl", "qwen35",
                      "mllama"}  # fmt: skip
    for arch in VISION_ARCHS:
        assert _ARCHS[arch].__module__.rsplit(".", 1)[-1] in vision_modules, arch


@pytest.mark.parametrize(("projectors", "counted"), [((), 0), ((Path("mmproj.gguf"),), 768)])
def test_an_image_counts_in_chat_truncation_only_with_a_projector_file(
    projectors: tuple[Path, ...], counted: int
) -> None:
    """Ollama's chatPrompt: 768 tokens an image where a projector file goes with the model, none
    where the tower is in the model's own file (its engine's single files)."""
    facts = GGUFFacts("gemma3", None, "", "", 0, "Q4_K_M", "270M", None, has_vision=True)
    stored = {"name": "m", "parameters": {}, "digest": "", "size": 0, "modified_at": 0}
    model = _served(facts, template=None, system="", messages=(), path=Path("m.gguf"),
                    projector_paths=projectors, details={}, **stored)  # fmt: skip
    assert "vision" in model.capabilities
    assert model.template.image_tokens == counted
