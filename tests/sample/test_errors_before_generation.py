"""Impossible sampling options and formats llguidance rejects raise a named EmberError from
LLM.generate itself, streaming or not, before the model evaluates anything."""

from __future__ import annotations

from typing import Any

import pytest

from ember import LLM, OptionsError
from ember.errors import EmberError
from ember.sample.grammar import GrammarError

pytestmark = pytest.mark.model


@pytest.fixture
def llm(real_llm: Any, monkeypatch: pytest.MonkeyPatch) -> LLM:
    """SmolLM2 whose engine fails the test when asked for: no request may reach it."""
    model: LLM = real_llm("smollm2:135m")

    def no_engine(*args: object) -> None:
        raise AssertionError("a request reached the engine before the error")

    monkeypatch.setattr(model, "engine_for", no_engine)
    return model


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"repeat_penalty": float("nan")}, "repeat_penalty' must be a finite number"),
        ({"repeat_last_n": -2}, "repeat_last_n' must be >= -1"),
        ({"top_k": "many"}, "top_k' must be an integer"),
        ({"temperature": "hot"}, "temperature' must be a number"),
        ({"num_ctx": 0}, "num_ctx' must be at least 1"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_impossible_options_raise_before_any_token(
    llm: LLM, options: dict[str, Any], message: str, stream: bool
) -> None:
    with pytest.raises(OptionsError, match=message) as err:
        llm.generate("hi", options=options, stream=stream)  # the call itself raises
    assert isinstance(err.value, EmberError)


@pytest.mark.parametrize(
    ("fmt", "message"),
    [
        ({"type": "object", "properties": {"a": {"type": "strin"}}}, "strin"),
        ({"type": "array", "minItems": 5, "maxItems": 2}, "minItems"),
        ({"type": "string", "pattern": "[a-"}, "unclosed"),
        ({"type": "object", "properties": {"a": {"$ref": "#/nope"}}}, "nope"),
        ("yaml", "json"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_rejected_formats_raise_before_any_token(
    llm: LLM, fmt: Any, message: str, stream: bool
) -> None:
    with pytest.raises(GrammarError, match=message) as err:
        llm.generate("hi", format=fmt, stream=stream)
    assert isinstance(err.value, EmberError)


def test_the_guard_would_see_a_generation(llm: LLM) -> None:
    # the fixture's guard is live: a valid request reaches the model and trips it
    with pytest.raises(AssertionError, match="reached the engine"):
        llm.generate("hi", options={"num_predict": 1})
