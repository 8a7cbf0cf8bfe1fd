"""Just enough JSON Schema to type-check references statically.

Reference typing works at the level of JSON types (string, number, integer, boolean,
object, array, null): a reference may feed a parameter when every type the referenced
output can have is one the parameter accepts. Finer constraints (ranges, patterns,
nested fields of objects) are checked when the step runs, against the real value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

JSON_TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")

Schema = Mapping[str, Any]
Types = frozenset[str] | None  # None: any type (unknown, or an unconstrained schema)
NULL: frozenset[str] = frozenset({"null"})


def deref(schema: Schema, root: Schema) -> Schema:
    seen = 0
    while "$ref" in schema and seen < 64:
        name = str(schema["$ref"]).rsplit("/", 1)[-1]
        schema = root.get("$defs", {}).get(name, {})
        seen += 1
    return schema


def value_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list | tuple) else "object"


def types_of(schema: Schema, root: Schema) -> Types:
    """The JSON types a value of ``schema`` can have (``None``: any)."""
    schema = deref(schema, root)
    if "const" in schema:
        return frozenset({value_type(schema["const"])})
    if "enum" in schema:
        return frozenset(value_type(v) for v in schema["enum"])
    if "type" in schema:
        declared = schema["type"]
        return frozenset([declared] if isinstance(declared, str) else declared)
    branches = schema.get("anyOf") or schema.get("oneOf")
    if branches:
        return union(types_of(branch, root) for branch in branches)
    return None


def union(all_types: Iterable[Types]) -> Types:
    merged: set[str] = set()
    for types in all_types:
        if types is None:
            return None
        merged |= types
    return frozenset(merged)


def not_accepted(given: Types, accepted: Types) -> frozenset[str]:
    """The types in ``given`` that ``accepted`` does not take (integers pass as numbers)."""
    if given is None or accepted is None:
        return frozenset()
    bad = given - accepted
    if "integer" in bad and "number" in accepted:
        bad = bad - {"integer"}
    return frozenset(bad)


def describe(types: Types) -> str:
    return "any type" if types is None else " or ".join(sorted(types))


@dataclass(frozen=True, slots=True)
class Located:
    """What a path inside a schema leads to: the JSON types it may have, or why it cannot be."""

    types: Types = None
    error: str | None = None


UNKNOWN = Located()


def locate(schema: Schema, root: Schema, path: Iterable[str | int]) -> Located:
    """Follow ``path`` (object keys, list indices) through ``schema``."""
    current: list[Schema] = [schema]
    walked: list[str] = []
    for key in path:
        nxt: list[Schema] = []
        reasons: list[str] = []
        for candidate in _branches(current, root):
            step = _child(candidate, root, str(key))
            if step is _ANY:
                return UNKNOWN
            if isinstance(step, str):
                reasons.append(step)
            else:
                nxt.append(step)
        where = f"at '{'.'.join(walked)}' " if walked else ""
        if not nxt:
            return Located(error=f"{where}{reasons[0] if reasons else 'is empty'}")
        if reasons:
            return Located(error=f"{where}may lack {key!r}: in one of its forms it {reasons[0]}")
        current = nxt
        walked.append(str(key))
    return Located(types=union(types_of(s, root) for s in current))


_ANY: Any = object()


def _branches(schemas: list[Schema], root: Schema) -> Iterable[Schema]:
    for schema in schemas:
        target = deref(schema, root)
        branches = target.get("anyOf") or target.get("oneOf")
        if branches:
            yield from _branches(list(branches), root)
        else:
            yield target


def _child(schema: Schema, root: Schema, key: str) -> Any:
    """The schema under ``key``, ``_ANY`` when unconstrained, or why there is none (a string)."""
    types = types_of(schema, root)
    if types is None and not ("properties" in schema or "items" in schema):
        return _ANY
    props = schema.get("properties", {})
    if key in props:
        return props[key]
    extra = schema.get("additionalProperties")
    if types is not None and "object" in types:
        if isinstance(extra, Mapping):
            return extra
        if extra is False or (extra is None and props):  # closed, or a model's fixed fields
            return f"has no field {key!r}"
        return _ANY
    if types is not None and "array" in types:
        if not key.isdigit():
            return f"is a list: use an index, not {key!r}"
        prefix = schema.get("prefixItems")
        if prefix is not None:
            index = int(key)
            return prefix[index] if index < len(prefix) else f"has no item {index}"
        items = schema.get("items")
        return items if isinstance(items, Mapping) else _ANY
    return f"is {describe(types)}, which has no fields"
