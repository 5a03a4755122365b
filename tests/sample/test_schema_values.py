"""admits_a_value: a schema refused only where every value would have to contain itself."""

from typing import Any

import pytest

from ember.sample.schema_values import admits_a_value


def node(next_schema: Any, *, required: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"type": "object", "properties": {"next": next_schema}}
    if required:
        body["required"] = ["next"]
    return {"$defs": {"N": body}, "$ref": "#/$defs/N"}


@pytest.mark.parametrize(
    "schema",
    [
        node({"$ref": "#/$defs/N"}, required=False),  # a linked list may end
        node({"anyOf": [{"$ref": "#/$defs/N"}, {"type": "null"}]}),  # Optional[Node]
        node({"type": "array", "items": {"$ref": "#/$defs/N"}}),  # a tree's children
        node({"$ref": "https://example.com/s"}),  # not followed
        {"type": ["object", "string"], "properties": {"n": {"$ref": "#"}}, "required": ["n"]},
        {"$ref": "#/$defs/missing"},  # llguidance's error to give
        {},
        True,
    ],
)
def test_schemas_with_a_way_out_are_kept(schema: Any) -> None:
    assert admits_a_value(schema)


@pytest.mark.parametrize(
    "schema",
    [
        node({"$ref": "#/$defs/N"}),
        {
            "$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"allOf": [{"$ref": "#/$defs/A"}]}},
            "$ref": "#/$defs/A",
        },
        {"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]},
        {"type": "array", "prefixItems": [{"$ref": "#"}], "minItems": 1},
        {"anyOf": [{"$ref": "#"}, {"$ref": "#"}]},
        False,
    ],
)
def test_schemas_every_value_of_which_contains_itself_are_refused(schema: Any) -> None:
    assert not admits_a_value(schema)
