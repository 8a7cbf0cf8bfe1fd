"""The plan's JSON Schema as a document people read: every field, its type, whether it is required, its meaning.

Written from :func:`plangate.plan.plan_json_schema` itself, so the document cannot say
something the schema does not.
"""

from __future__ import annotations

import json
from typing import Any

from plangate.plan import SCHEMA_VERSION, plan_json_schema

_CONSTRAINTS = {
    "minimum": "at least {}",
    "maximum": "at most {}",
    "minLength": "at least {} characters",
    "maxLength": "at most {} characters",
    "minItems": "at least {} items",
    "maxItems": "at most {} items",
    "pattern": "matches `{}`",
}


def schema_file() -> dict[str, Any]:
    """The schema as exported: the version beside the JSON Schema a planning model is given."""
    return {"schema_version": SCHEMA_VERSION, "schema": plan_json_schema()}


def schema_document() -> str:
    """The plan schema in Markdown: one table for the plan, one for each definition it uses."""
    schema = plan_json_schema()
    lines = [
        f"# Plan schema, version {SCHEMA_VERSION}",
        "",
        f"Schema id `{schema['$id']}`. Generated from the JSON Schema in `plan-schema.json`;",
        "a field not listed here is refused.",
        "",
        *_table(str(schema.get("title", "Plan")), schema),
    ]
    for name, definition in schema.get("$defs", {}).items():
        if definition.get("properties"):
            lines += ["", *_table(name, definition)]
    return "\n".join(lines) + "\n"


def _table(title: str, schema: dict[str, Any]) -> list[str]:
    required = set(schema.get("required", ()))
    lines = [f"## {title}", ""]
    if schema.get("description"):
        lines += [str(schema["description"]), ""]
    lines += ["| field | type | required | default | meaning | constraints |", "| --- | --- | --- | --- | --- | --- |"]
    for name, field in schema["properties"].items():
        default = f"`{json.dumps(field['default'])}`" if "default" in field else ""
        cells = [
            f"`{name}`",
            _type(field),
            "yes" if name in required else "no",
            default,
            str(field.get("description", "")),
            _constraints(field),
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return lines


def _type(field: dict[str, Any]) -> str:
    if "$ref" in field:
        return str(field["$ref"]).rsplit("/", 1)[-1]
    if "const" in field:
        return f"constant {json.dumps(field['const'])}"
    if "enum" in field:
        return "one of " + ", ".join(json.dumps(v) for v in field["enum"])
    if "anyOf" in field:
        return " or ".join(_type(option) for option in field["anyOf"])
    kind = str(field.get("type", "any JSON value"))
    if kind == "array" and "items" in field:
        return f"array of {_type(field['items'])}"
    if kind == "object" and isinstance(field.get("additionalProperties"), dict):
        return f"object of {_type(field['additionalProperties'])}"
    return kind


def _constraints(field: dict[str, Any]) -> str:
    found = [text.format(field[key]) for key, text in _CONSTRAINTS.items() if key in field]
    for option in field.get("anyOf", ()):
        found += [text.format(option[key]) for key, text in _CONSTRAINTS.items() if key in option]
    return "; ".join(found)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
