"""Structured outputs on SmolLM2's tokenizer: random walks through the mask always give valid JSON,
and the real model, constrained, always writes JSON that satisfies the schema."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from ember.gguf import GGUFFile
from ember.sample.grammar import Grammar, GrammarError, constrain, ll_tokenizer
from ember.tokenizer.tokenizer import Tokenizer

pytestmark = pytest.mark.model

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "active": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "zip": {"type": "integer", "minimum": 0, "maximum": 99999},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "role", "address"],
    "additionalProperties": False,
}

TYPES = {"object": dict, "array": list, "string": str, "boolean": bool}


def violations(value: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """A hand validator for the keywords SCHEMA uses (jsonschema is not installed)."""
    kind = schema.get("type")
    if kind == "integer":
        if not isinstance(value, int) or isinstance(value, bool):
            return [f"{where}: {value!r} is not an integer"]
        if not schema.get("minimum", value) <= value <= schema.get("maximum", value):
            return [f"{where}: {value} out of range"]
    elif kind is not None and not isinstance(value, TYPES[kind]):
        return [f"{where}: {value!r} is not {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{where}: {value!r} not in enum"]
    if isinstance(value, str) and len(value) > schema.get("maxLength", len(value)):
        return [f"{where}: {value!r} too long"]
    return container_violations(value, schema, where)


def container_violations(value: Any, schema: dict[str, Any], where: str) -> list[str]:
    bad: list[str] = []
    if isinstance(value, list):
        if len(value) > schema.get("maxItems", len(value)):
            bad.append(f"{where}: too many items")
        for i, item in enumerate(value):
            bad += violations(item, schema["items"], f"{where}[{i}]")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        bad += [f"{where}: missing {k}" for k in schema.get("required", []) if k not in value]
        if schema.get("additionalProperties") is False:
            bad += [f"{where}: extra key {k}" for k in value if k not in props]
        for k, v in value.items():
            if k in props:
                bad += violations(v, props[k], f"{where}.{k}")
    return bad


def test_the_hand_validator_catches_each_violation() -> None:
    good = {"name": "ann", "age": 3, "role": "user", "address": {"city": "x", "zip": 1}}
    assert violations(good, SCHEMA) == []
    for key, value in [
        ("age", 121),
        ("age", True),
        ("role", "root"),
        ("name", "123456789"),
        ("tags", ["a", "b", "c", "d"]),
        ("address", {"city": "x"}),
        ("z", 1),
    ]:
        assert violations({**good, key: value}, SCHEMA), (key, value)


@pytest.fixture(scope="module")
def tokenizer(smollm2_path: Path) -> Tokenizer:
    return Tokenizer.from_metadata(GGUFFile.open(smollm2_path).metadata)


def random_walk(grammar: Grammar, gen: torch.Generator, max_tokens: int = 400) -> list[int]:
    """Accepts a uniformly random allowed token until the grammar is done; the tokens."""
    out: list[int] = []
    while not grammar.is_done():
        weights = grammar.mask().float()
        weights[sorted(grammar.end_ids)] = 0.0  # walk on while anything but an end is allowed
        token = int(torch.multinomial(weights, 1, generator=gen))
        grammar.accept(token)
        out.append(token)
        assert len(out) < max_tokens, "the walk did not end"
    return out


def test_random_walks_through_the_mask_always_satisfy_the_schema(tokenizer: Tokenizer) -> None:
    gen = torch.Generator().manual_seed(1234)
    special = {i for i in range(tokenizer.vocab_size) if tokenizer.is_special(i)}
    lengths = []
    for _ in range(50):
        grammar = Grammar.from_format(SCHEMA, tokenizer)
        assert not grammar.mask()[sorted(special)].any()  # no control token inside JSON
        tokens = random_walk(grammar, gen)
        mask = grammar.mask()
        # every end token alone: <|im_end|> (2), which the model ends a turn with, beside 0
        assert mask.nonzero().flatten().tolist() == sorted(tokenizer.eos_ids) == [0, 2]
        value = json.loads(tokenizer.decode(tokens))
        assert violations(value, SCHEMA) == []
        lengths.append(len(tokens))
    assert min(lengths) > 10  # the walks really wrote objects, not a shortcut


def test_json_format_accepts_any_object_and_parses(tokenizer: Tokenizer) -> None:
    text = '{"a": [1, 2.5, {"b": "x\\n"}], "c": null, "d": true}'
    grammar = Grammar.from_format("json", tokenizer)
    assert not grammar.mask()[tokenizer.encode("[", add_special=False)[0]]  # an object only
    for token in tokenizer.encode(text, add_special=False):
        assert grammar.mask()[token]
        grammar.accept(token)
    assert grammar.is_done()
    assert json.loads(text)["c"] is None


def test_json_format_random_walk_parses(tokenizer: Tokenizer) -> None:
    # a walk that favours closing tokens more as it grows, so any-JSON (unbounded) ends quickly
    rng = random.Random(7)
    closers = {tokenizer.encode(c, add_special=False)[0] for c in '}"]'} | {min(tokenizer.eos_ids)}
    for _ in range(5):
        grammar = Grammar.from_format("json", tokenizer)
        tokens: list[int] = []
        while not grammar.is_done() and len(tokens) < 300:
            allowed = grammar.mask().nonzero().flatten().tolist()
            closing = [t for t in allowed if t in closers]
            token = rng.choice(closing if closing and rng.random() < len(tokens) / 40 else allowed)
            if token in tokenizer.eos_ids:
                break
            grammar.accept(token)
            tokens.append(token)
        assert isinstance(json.loads(tokenizer.decode(tokens)), dict)
        assert len(tokens) < 300


def test_regex_and_lark_formats(tokenizer: Tokenizer) -> None:
    grammar = Grammar.from_format({"regex": "(yes|no)"}, tokenizer)
    for token in tokenizer.encode("yes", add_special=False):
        grammar.accept(token)
    assert grammar.is_done()
    grammar = Grammar.from_format({"lark": 'start: "a" "b"+'}, tokenizer)
    grammar.accept(tokenizer.encode("a", add_special=False)[0])
    assert not grammar.mask()[min(tokenizer.eos_ids)] and not grammar.is_accepting()


@pytest.mark.parametrize(
    ("fmt", "message"),
    [
        ({"type": "nonsense"}, "nonsense"),
        ({"type": "object", "properties": {"a": {"$ref": "#/nope"}}}, "nope"),
        ({"regex": "[a-"}, "regex"),
        ({"lark": "start: foo"}, "foo"),
        ({"regex": "a", "lark": 'start: "a"'}, "and nothing else"),  # was read as a schema
        ({"regex": "a", "type": "string"}, "and nothing else"),
        ("xml", "json"),
        (["json"], "dict"),
        # no finite value: llguidance took these, then ended at once with no JSON or grew its
        # parser without end mid-answer (a 500, or a hung runner when the prompt was cached)
        ({"$defs": {"A": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"}, "no JSON value"),
        (
            {
                "$defs": {
                    "N": {
                        "type": "object",
                        "properties": {"next": {"$ref": "#/$defs/N"}},
                        "required": ["next"],
                    }
                },
                "$ref": "#/$defs/N",
            },
            "no JSON value",
        ),
        ({"type": "array", "items": {"$ref": "#"}, "minItems": 1}, "no JSON value"),
    ],
)
def test_invalid_format_raises_at_construction(
    tokenizer: Tokenizer, fmt: Any, message: str
) -> None:
    with pytest.raises(GrammarError, match=message):
        Grammar.from_format(fmt, tokenizer)


def test_accept_of_a_disallowed_token_raises(tokenizer: Tokenizer) -> None:
    grammar = Grammar.from_format(SCHEMA, tokenizer)
    # the forced start '{"' is offered as its one token only (llguidance's canonical form)
    brace = tokenizer.encode('{"', add_special=False)
    letter = tokenizer.encode("x", add_special=False)[0]
    assert len(brace) == 1 and grammar.mask().nonzero().flatten().tolist() == brace
    with pytest.raises(GrammarError, match=str(letter)):
        grammar.accept(letter)
    special = Grammar.from_format("json", tokenizer)
    with pytest.raises(GrammarError):
        special.accept(1)  # <|im_start|>, a control token


def test_llguidance_tokenizer_is_built_once_per_tokenizer(tokenizer: Tokenizer) -> None:
    first = ll_tokenizer(tokenizer)
    start = time.perf_counter()
    Grammar.from_format(SCHEMA, tokenizer)
    assert ll_tokenizer(tokenizer) is first
    assert time.perf_counter() - start < 0.1


def test_constrain_sets_disallowed_logits_to_minus_inf(tokenizer: Tokenizer) -> None:
    grammar = Grammar.from_format({"regex": "a"}, tokenizer)
    logits = torch.arange(tokenizer.vocab_size + 3, dtype=torch.float32)  # padded rows too
    out = constrain(logits, grammar)
    finite = out.isfinite().nonzero().flatten().tolist()
    assert finite == tokenizer.encode("a", add_special=False)
    assert out[finite[0]] == logits[finite[0]]


def test_real_model_constrained_generation_satisfies_schema(real_llm: Any) -> None:
    llm = real_llm("smollm2:135m")
    prompt = "Describe a user as JSON with name, age, role and address."
    for seed in range(5):
        options = {"temperature": 1.0, "seed": seed, "num_predict": 120}
        result = llm.generate(prompt, format=SCHEMA, options=options)
        assert result.done_reason == "stop", result.text  # the grammar was done within 120
        assert violations(json.loads(result.text), SCHEMA) == []


def accepts(fmt: dict[str, Any], text: str, tokenizer: Tokenizer) -> bool:
    """Whether the grammar of fmt lets the model write text (then stop)."""
    grammar = Grammar.from_format(fmt, tokenizer)
    try:
        for token in tokenizer.encode(text, add_special=False):
            grammar.accept(token)
    except GrammarError:
        return False
    return grammar.is_accepting()


# the shape of Pydantic's model_json_schema(): no additionalProperties
NESTED_WITHOUT_ADDITIONAL = {
    "$defs": {
        "Address": {
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "type": "object",
        }
    },
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/Address"}},
    "required": ["name", "address"],
    "type": "object",
}


def test_objects_without_additional_properties_are_closed_as_ollama(tokenizer) -> None:
    fmt = NESTED_WITHOUT_ADDITIONAL
    assert accepts(fmt, '{"name": "a", "address": {"city": "b"}}', tokenizer)
    assert not accepts(fmt, '{"name": "a", "address": {"city": "b"}, "x": 1}', tokenizer)
    assert not accepts(fmt, '{"name": "a", "address": {"city": "b", "x": 1}}', tokenizer)


def test_additional_properties_true_or_a_schema_still_allows_extra_keys(tokenizer) -> None:
    open_top = {**NESTED_WITHOUT_ADDITIONAL, "additionalProperties": True}
    assert accepts(open_top, '{"name": "a", "address": {"city": "b"}, "x": 1}', tokenizer)
    numbers = {**NESTED_WITHOUT_ADDITIONAL, "additionalProperties": {"type": "integer"}}
    assert accepts(numbers, '{"name": "a", "address": {"city": "b"}, "x": 1}', tokenizer)
    assert not accepts(numbers, '{"name": "a", "address": {"city": "b"}, "x": "y"}', tokenizer)


def test_closing_leaves_the_input_and_all_of_members_alone() -> None:
    from ember.sample.grammar import closed_objects

    merged = {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]}
    assert closed_objects(merged) == merged
    assert "additionalProperties" not in NESTED_WITHOUT_ADDITIONAL  # a copy was closed
    closed = closed_objects({"type": "array", "items": {"properties": {"a": {}}}})
    assert closed["items"]["additionalProperties"] is False
    assert closed_objects({"type": "object"}) == {"type": "object"}  # "json": any object


def test_what_pydantic_writes_for_sets_and_bytes_is_taken_and_the_rest_enforced(tokenizer) -> None:
    """uniqueItems (a set field) and "format": "binary" (bytes) are not implemented by
    llguidance: as llama.cpp's converter (Ollama's) skips them, they are not enforced, where
    they had made the whole format a 400; the types around them still are."""
    fmt = {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            "blob": {"type": "string", "format": "binary"},
        },
        "required": ["tags", "blob"],
    }
    assert accepts(fmt, '{"tags": ["a", "a"], "blob": "xyz"}', tokenizer)
    assert not accepts(fmt, '{"tags": [1], "blob": "xyz"}', tokenizer)
    with pytest.raises(GrammarError, match="minItems"):  # a wrong schema is still refused
        Grammar.from_format({"type": "array", "minItems": 5, "maxItems": 2}, tokenizer)
