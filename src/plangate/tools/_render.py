"""How a tool reads in a model's prompt: one text, the same for plan mode and ReAct.

A signature in TypeScript-like types (``name(param: type, opt?: type = default) -> output``),
its flags (effect, external, idempotent), its description and one line per described
parameter. Both modes are given exactly this, so a comparison of the two measures the
architectures and not two ways of describing tools.
"""

from __future__ import annotations

import json
from typing import Any

from plangate.tools._tool import Tool

_MAX_DEPTH = 4  # nested types deeper than this read as "object": a prompt is not a schema dump
_SCALARS = {"string", "number", "integer", "boolean", "null"}


def render_tool(tool: Tool) -> str:
    """The tool as a model is shown it, in a few lines."""
    params = tool.params_schema
    required = set(params.get("required", []))
    defs = params.get("$defs", {})
    properties = params.get("properties", {})
    signature = ", ".join(_param(name, spec, name in required, defs) for name, spec in properties.items())
    output = type_text(tool.output_schema)
    flags = [tool.effect] + (["external"] if tool.external else []) + (["idempotent"] if tool.idempotent else [])
    lines = [f"- {tool.name}({signature}) -> {output}  [{', '.join(flags)}]"]
    lines.append(f"  {tool.description or 'No description.'}")
    described = [f"{name}: {spec['description']}" for name, spec in properties.items() if spec.get("description")]
    if described:
        lines.append("  " + " ".join(described))
    return "\n".join(lines)


def _param(name: str, spec: dict[str, Any], required: bool, defs: dict[str, Any]) -> str:
    text = f"{name}{'' if required else '?'}: {type_text(spec, defs)}"
    if "default" in spec and spec["default"] is not None:
        text += f" = {json.dumps(spec['default'])}"
    return text


def type_text(schema: dict[str, Any], defs: dict[str, Any] | None = None, depth: int = 0) -> str:
    """A JSON Schema as a short type: ``string``, ``{a: number, b?: string}``, ``Hit[]``, ``"x" | "y"``."""
    defs = schema.get("$defs", defs or {})
    if depth > _MAX_DEPTH:
        return "object"
    if "$ref" in schema:
        target = defs.get(schema["$ref"].rsplit("/", 1)[-1])
        return "object" if target is None else type_text(target, defs, depth + 1)
    if "const" in schema:
        return json.dumps(schema["const"])
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " | ".join(type_text(s, defs, depth + 1) for s in schema[key])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(type_text({**schema, "type": k}, defs, depth) for k in kind)
    if kind == "array":
        item = type_text(schema.get("items", {}), defs, depth + 1)
        return f"({item})[]" if " | " in item else f"{item}[]"
    if kind == "object" or "properties" in schema:
        return _object(schema, defs, depth)
    return kind if kind in _SCALARS else "any"


def _object(schema: dict[str, Any], defs: dict[str, Any], depth: int) -> str:
    properties = schema.get("properties")
    if not properties:
        extra = schema.get("additionalProperties")
        return f"{{[key: string]: {type_text(extra, defs, depth + 1)}}}" if isinstance(extra, dict) else "object"
    required = set(schema.get("required", []))
    fields = ", ".join(
        f"{name}{'' if name in required else '?'}: {type_text(spec, defs, depth + 1)}"
        for name, spec in properties.items()
    )
    return f"{{{fields}}}"
