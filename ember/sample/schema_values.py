"""Whether a JSON schema admits any finite JSON value, as far as its structure tells.

llguidance compiles a schema whose every value must contain itself (`{"$ref": "#"}` alone, an
object that requires a property of its own type) and then either ends the output at once with
no JSON at all or grows its parser without end while the model writes (an error after ~50,000
items, mid-answer). Such a schema is refused up front instead. The check is conservative: it
answers False only when every way through the schema needs a `$ref` that leads back to itself;
whatever it cannot follow (external refs, keywords it does not read) counts as satisfiable."""

from typing import Any

_STEPS = 10_000  # past this many schemas visited, leave the judgement to llguidance
_NESTING_TYPES = frozenset({"object", "array"})


def admits_a_value(schema: Any) -> bool:
    walk = _Walk(schema)
    return walk.admits(schema, frozenset())


class _Walk:
    def __init__(self, root: Any) -> None:
        self.root, self.steps = root, _STEPS

    def admits(self, schema: Any, refs: frozenset[str]) -> bool:
        """refs: the $refs followed on the way here (one met again is a loop: no value)."""
        self.steps -= 1
        if self.steps < 0 or schema is True or not isinstance(schema, dict):
            return schema is not False
        ref = schema.get("$ref")
        if isinstance(ref, str):
            if ref in refs:
                return False
            target = _resolve(self.root, ref)
            if target is not None and not self.admits(target, refs | {ref}):
                return False
        all_of = schema.get("allOf")
        if isinstance(all_of, list) and not all(self.admits(s, refs) for s in all_of):
            return False
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and not any(self.admits(s, refs) for s in options):
                return False
        types = schema.get("type")
        types = [types] if isinstance(types, str) else types
        if not isinstance(types, list) or not types or not _NESTING_TYPES.issuperset(types):
            return True  # any type, or one with no parts that could loop, or one not known
        return ("object" in types and self.object_admits(schema, refs)) or (
            "array" in types and self.array_admits(schema, refs)
        )

    def object_admits(self, schema: dict[str, Any], refs: frozenset[str]) -> bool:
        required = schema.get("required")
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        if not isinstance(required, list):
            return True
        if schema.get("patternProperties"):
            return True  # a name may match a pattern instead: not followed
        others = schema.get("additionalProperties", True)
        return all(self.admits(properties.get(name, others), refs) for name in required)

    def array_admits(self, schema: dict[str, Any], refs: frozenset[str]) -> bool:
        least = schema.get("minItems", 0)
        if not isinstance(least, int) or least <= 0:
            return True
        prefix = schema.get("prefixItems")
        prefix = prefix if isinstance(prefix, list) else []
        firsts = prefix[:least]
        rest = schema.get("items", True) if least > len(prefix) else True
        return all(self.admits(s, refs) for s in firsts) and self.admits(rest, refs)


def _resolve(root: Any, ref: str) -> Any:
    """The schema a local ref ("#", "#/$defs/Name", any JSON pointer) names; None elsewhere."""
    if not ref.startswith("#"):
        return None
    node = root
    for part in ref[1:].split("/")[1:]:
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
            node = node[int(key)]
        else:
            return None
    return node
