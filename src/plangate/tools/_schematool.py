"""A tool described by JSON Schemas instead of Python type hints: a tool from an MCP server.

Its parameters are validated against the server's ``inputSchema`` (strictly: JSON types as
they are, no coercion, and a parameter the schema does not name is an error unless the
schema itself allows more), and its output against the ``outputSchema`` when there is one.
The schemas are shown to the checker's reference typing and the planner's prompt exactly
as for a Python tool, since both read JSON Schemas.

The validator is ``jsonschema``, which the ``mcp`` extra brings; it is imported only when
such a tool is made, so the core does not need it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pydantic_core
from pydantic import BaseModel, TypeAdapter, ValidationError

from plangate.errors import ParamsError, ToolDefinitionError
from plangate.tools._tool import NAME, Tool, problems

TEXT = {"type": "string"}


@dataclass(frozen=True, kw_only=True, eq=False)
class SchemaTool(Tool):
    """A :class:`Tool` whose parameters and output are held to JSON Schemas (see :func:`schema_tool`)."""

    _validators: tuple[Any, Any] = field(default=(None, None), repr=False)

    def params_plainly_valid(self, params: Mapping[str, Any]) -> bool:
        return False  # its validator is the JSON Schema's own: only it decides

    def param_errors(self, params: Mapping[str, Any]) -> list[pydantic_core.ErrorDetails]:
        errors = [
            _details(err)
            for err in self._validators[0].iter_errors(dict(params))
            if err.absolute_path or err.validator not in ("required", "additionalProperties")
        ]  # a missing or unknown parameter is said once per name, below, as for a Python tool
        errors += [_missing(name) for name in self.params_schema.get("required", ()) if name not in params]
        if not _allows_more(self.params_schema):
            known = set(self.param_names)
            errors += [_extra(name, params[name]) for name in params if name not in known]
        return errors

    def validate_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        errors = self.param_errors(params)
        if errors:
            raise ParamsError(self.name, problems(errors))
        return dict(params)

    def dump_output(self, value: Any) -> Any:
        output_validator = self._validators[1]
        if output_validator is not None:
            found = next(iter(output_validator.iter_errors(value)), None)
            if found is not None:
                raise ValidationError.from_exception_data(self.name, [_line_error(found)])
        return value


def schema_tool(
    *,
    name: str,
    fn: Callable[..., Any],
    params_schema: dict[str, Any],
    output_schema: dict[str, Any] | None,
    ctx_param: str | None,
    **meta: Any,
) -> SchemaTool:
    """A tool calling ``fn`` (sync), held to these schemas; ``meta`` as for :func:`plangate.tool`."""
    from jsonschema import validators  # type: ignore[import-untyped,unused-ignore]  # the mcp extra brings it

    where = f"tool {name!r}"
    if not NAME.fullmatch(name):
        raise ToolDefinitionError(f"{where}: a tool name is a letter or '_' then letters, digits, '_', '.', '-'")
    checkers: list[Any] = []
    for schema in (params_schema, output_schema):
        if schema is None:
            checkers.append(None)
            continue
        cls = validators.validator_for(schema)
        try:
            cls.check_schema(schema)
        except Exception as exc:  # noqa: BLE001 - the server's schema is not valid JSON Schema: say so plainly
            raise ToolDefinitionError(f"{where}: its schema is not valid JSON Schema: {_first_line(exc)}") from None
        checkers.append(cls(schema))
    if ctx_param is not None and ctx_param in params_schema.get("properties", {}):
        raise ToolDefinitionError(f"{where}: a parameter may not be named {ctx_param!r}")
    return SchemaTool(
        name=name,
        fn=fn,
        params_schema=params_schema,
        output_schema=output_schema if output_schema is not None else TEXT,
        is_async=False,
        ctx_param=ctx_param,
        _params=BaseModel,
        _output=_ANY,
        _validators=(checkers[0], checkers[1]),
        **meta,
    )


_ANY: TypeAdapter[Any] = TypeAdapter(Any)


def _allows_more(schema: Mapping[str, Any]) -> bool:
    """A schema that says outright that more properties are welcome; plangate's default is no."""
    extra = schema.get("additionalProperties")
    return extra is True or isinstance(extra, dict) or "patternProperties" in schema


def _details(err: Any) -> pydantic_core.ErrorDetails:
    return {
        "type": str(err.validator),
        "loc": tuple(err.absolute_path),
        "msg": _first_line(err.message),
        "input": err.instance,
    }


def _missing(name: str) -> pydantic_core.ErrorDetails:
    return {"type": "missing", "loc": (name,), "msg": "Field required", "input": None}


def _extra(name: str, value: Any) -> pydantic_core.ErrorDetails:
    return {"type": "extra_forbidden", "loc": (name,), "msg": "Extra inputs are not permitted", "input": value}


def _line_error(err: Any) -> pydantic_core.InitErrorDetails:
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path) or "the value"
    message = f"{where.lstrip('.')}: {_first_line(err.message)}"
    kind = pydantic_core.PydanticCustomError("output_schema", message)
    return {"type": kind, "loc": tuple(err.absolute_path), "input": err.instance}


def _first_line(exc: object) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
