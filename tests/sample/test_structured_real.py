"""50 sampled generations of SmolLM2 under a JSON schema (nested object, arrays, enums, required
fields) at temperature 1.0: every one parses and satisfies the schema."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "pet": {
            "type": "object",
            "properties": {
                "kind": {"enum": ["cat", "dog", "bird"]},
                "age": {"type": "integer", "minimum": 0, "maximum": 30},
            },
            "required": ["kind", "age"],
            "additionalProperties": False,
        },
        "tags": {
            "type": "array",
            "items": {"enum": ["small", "big", "old"]},
            "minItems": 1,
            "maxItems": 2,
        },
        "ok": {"type": "boolean"},
        "name": {"type": "string", "maxLength": 8},
    },
    "required": ["pet", "tags", "ok", "name"],
    "additionalProperties": False,
}

TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "integer": int,
}


def violations(value: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """A validator for the keywords SCHEMA uses (jsonschema is not installed here)."""
    kind = schema.get("type")
    if kind is not None and (
        not isinstance(value, TYPES[kind]) or (kind == "integer" and isinstance(value, bool))
    ):
        return [f"{where}: {value!r} is not {kind}"]
    bad = []
    if "enum" in schema and value not in schema["enum"]:
        bad.append(f"{where}: {value!r} not in enum")
    if kind == "integer" and not schema.get("minimum", value) <= value <= schema.get(
        "maximum", value
    ):
        bad.append(f"{where}: {value} out of range")
    if kind == "string" and len(value) > schema.get("maxLength", len(value)):
        bad.append(f"{where}: {value!r} too long")
    if kind == "array":
        bad += array_violations(value, schema, where)
    if kind == "object":
        bad += object_violations(value, schema, where)
    return bad


def array_violations(value: list[Any], schema: dict[str, Any], where: str) -> list[str]:
    bad = []
    if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)):
        bad.append(f"{where}: {len(value)} items")
    for i, item in enumerate(value):
        bad += violations(item, schema["items"], f"{where}[{i}]")
    return bad


def object_violations(value: dict[str, Any], schema: dict[str, Any], where: str) -> list[str]:
    props = schema.get("properties", {})
    bad = [f"{where}: missing {k}" for k in schema.get("required", []) if k not in value]
    if schema.get("additionalProperties") is False:
        bad += [f"{where}: extra key {k}" for k in value if k not in props]
    for k, v in value.items():
        if k in props:
            bad += violations(v, props[k], f"{where}.{k}")
    return bad


GOOD = {"pet": {"kind": "cat", "age": 3}, "tags": ["old"], "ok": True, "name": "Tom"}


@pytest.mark.parametrize(
    "change",
    [
        {"pet": {"kind": "cow", "age": 3}},
        {"pet": {"kind": "cat", "age": 31}},
        {"pet": {"kind": "cat", "age": 2.5}},
        {"pet": {"kind": "cat", "age": True}},
        {"pet": {"kind": "cat"}},
        {"pet": {"kind": "cat", "age": 3, "legs": 4}},
        {"tags": []},
        {"tags": ["old", "big", "small"]},
        {"tags": ["tiny"]},
        {"tags": "old"},
        {"ok": 1},
        {"name": "Bartholomew"},
        {"extra": 0},
    ],
)
def test_the_validator_catches_each_violation(change: dict[str, Any]) -> None:
    assert violations(GOOD, SCHEMA) == []
    assert violations({**GOOD, **change}, SCHEMA)
    assert violations({k: v for k, v in GOOD.items() if k != "ok"}, SCHEMA)


@pytest.mark.model
@pytest.mark.slow
def test_fifty_sampled_generations_all_satisfy_the_schema(real_llm: Any) -> None:
    llm = real_llm("smollm2:135m")

    def generate(seed: int) -> Any:
        options = {"temperature": 1.0, "seed": seed, "num_predict": 200}
        return llm.generate("Describe a pet as JSON.", format=SCHEMA, options=options)

    # four at a time: the engine batches them (a sequence's tokens do not depend on its batch)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(generate, range(50)))
    for seed, result in enumerate(results):
        value = json.loads(result.text)
        assert violations(value, SCHEMA) == [], (seed, result.text)
        assert result.done_reason == "stop", (seed, result.text)
    assert len({r.text for r in results}) > 25  # temperature 1.0 really varies the answers


@pytest.mark.parametrize("name", ["smollm2:135m", "qwen2.5-coder:0.5b"])  # Gemma 3's is a base
def test_an_open_ended_format_ends_with_the_token_the_model_ends_its_turn_with(
    real_llm: Any, name: str
) -> None:
    """An integer may always go on with another digit: the answer ends only when the model ends
    its turn, with <|im_end|>, which the grammar must allow beside the lowest end id
    (<|endoftext|>) that llguidance knows."""
    options = {"temperature": 0, "num_predict": 24}
    question = "What is 6 times 7? Answer with the number only."
    result = real_llm(name).generate(question, format={"type": "integer"}, options=options)
    assert result.done_reason == "stop", result.text
    assert len(result.text) < 8 and int(result.text) >= 0
