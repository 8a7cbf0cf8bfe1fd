"""Turn a typed Python function into a governed tool."""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import re
import string
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Literal, TypeVar, get_args, get_type_hints, overload

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, PydanticUserError, TypeAdapter, ValidationError, create_model

from plangate import _jsontypes as jt
from plangate import references
from plangate._patterns import REMEMBERED
from plangate.errors import ParamsError, Problem, ToolDefinitionError
from plangate.tools import _docstring
from plangate.tools._context import RunContext

Effect = Literal["read", "write", "irreversible"]
EFFECTS: tuple[Effect, ...] = get_args(Effect)
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,199}")
F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True, eq=False)
class Tool:
    """A typed function plus the governance metadata a policy and an engine need.

    Build one with :func:`tool`. Calling the tool calls the function unchanged.
    """

    name: str
    fn: Callable[..., Any]
    description: str
    effect: Effect
    scopes: tuple[str, ...]
    external: bool
    resource: str | None
    idempotent: bool
    compensate: str | None
    untrusted_output: bool
    tags: tuple[str, ...]
    params_schema: dict[str, Any]
    output_schema: dict[str, Any]
    is_async: bool
    ctx_param: str | None
    timeout: float | None = None
    """Seconds one call may take; None: the policy's ``limits.tool_timeout``, else 300."""
    retries: int = 0
    """Calls after the first when one fails or times out (idempotent tools only)."""
    origin: Mapping[str, str] | None = None
    """Where a tool that is not a Python function comes from: for an MCP tool its ``source`` (the spec),
    ``server`` and ``version`` (from the server's initialize result) and its ``tool`` name there."""
    overridden: tuple[str, ...] = ()
    """The fields the policy's ``tools`` section set (see :mod:`plangate._overrides`)."""
    inherits_provenance: bool = False
    """Its output's sources are the union of its inputs' sources; the tool adds no untrusted source of its own
    (an extractor that turns untrusted text into a value: see :mod:`plangate.provenance`)."""
    output_schema_for: Callable[[Mapping[str, Any]], dict[str, Any] | None] | None = field(default=None, repr=False)
    """For a tool whose output's shape a step declares (``extract``): the output schema a step's parameters
    give, or None when they give none; the checker types references to that step by it (:meth:`for_params`)."""
    _params: type[BaseModel] = field(repr=False)
    _output: TypeAdapter[Any] = field(repr=False)
    _resource_parts: tuple[tuple[str, str | None], ...] = field(default=(), repr=False)
    _located: dict[tuple[str, tuple[str | int, ...]], jt.Located] = field(default_factory=dict, init=False, repr=False)
    _kept: dict[Hashable, Any] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        where = f"tool {self.name!r}"
        timeout, retries = self.timeout, self.retries
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < math.inf
        ):
            raise ToolDefinitionError(f"{where}: timeout is a number of seconds above 0, not {timeout!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ToolDefinitionError(f"{where}: retries is a whole number, 0 or more, not {retries!r}")
        if retries and not self.idempotent:
            raise ToolDefinitionError(
                f"{where}: retries={retries} needs an idempotent tool, and this one is not: a call that failed "
                "or timed out may still have had its effect, so only a tool that is safe to repeat under the same "
                "idempotency key may be called again (declare idempotent=True if it is)"
            )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(self.params_schema.get("properties", {}))

    def for_params(self, params: Mapping[str, Any]) -> Tool:
        """This tool as a step with ``params`` sees it: with the output schema those parameters declare, if any.

        Made afresh for each check, never kept: the schema is the plan's own text, which a tool
        long in use would otherwise hold, with all it worked out from it, plan after plan.
        """
        declared = self.output_schema_for(params) if self.output_schema_for is not None else None
        if declared is None:
            return self
        return replace(self, output_schema=declared, output_schema_for=None)

    def output_at(self, path: tuple[str, ...]) -> jt.Located:
        """What ``path`` leads to in this tool's output schema (remembered for this tool object: a copy made
        with ``dataclasses.replace``, whose schemas may differ, starts with nothing remembered)."""
        return self._locate("output", self.output_schema, path)

    def param_at(self, loc: tuple[str | int, ...]) -> jt.Located:
        """What ``loc`` (a parameter, then keys or indices inside it) leads to in the parameter schema."""
        return self._locate("params", self.params_schema, loc)

    def _locate(self, side: str, schema: dict[str, Any], path: tuple[str | int, ...]) -> jt.Located:
        key = (side, path)
        found = self._located.get(key)
        if found is None:
            found = jt.locate(schema, schema, path)
            if len(self._located) < KEPT and _text_in(path) <= REMEMBERED:
                self._located[key] = found
        return found

    def kept(self, key: Hashable, compute: Callable[..., T], *args: Any) -> T:
        """``compute(*args)``, remembered under ``key`` for this tool object (at most ``KEPT`` answers, each
        under a key of at most ``REMEMBERED`` characters of text: a plan's long names would only fill the memory).

        For answers that follow from the tool's declarations and ``key`` alone: a changed tool
        is another object, with nothing kept.
        """
        kept = self._kept
        if key in kept:
            answer: T = kept[key]
            return answer
        answer = compute(*args)
        if len(kept) < KEPT and _text_in(key) <= REMEMBERED:
            kept[key] = answer
        return answer

    def param_errors(self, params: Mapping[str, Any]) -> list[pydantic_core.ErrorDetails]:
        """Every way ``params`` (JSON values) fails the parameter schema; empty when valid."""
        try:
            self._params.__pydantic_validator__.validate_json(pydantic_core.to_json(params), strict=True)
        except ValidationError as exc:
            return exc.errors(include_url=False)
        return []

    @cached_property
    def plain_params(self) -> PlainParams | None:
        """The parameters' types when every one is a plain string, integer, number or boolean; else None.

        Read from the validator's own schema rather than the JSON Schema, which does not show
        constraints held by functions: a value of a plain parameter's type cannot fail it.
        """
        return PlainParams.of(self._params)

    def params_plainly_valid(self, params: Mapping[str, Any]) -> bool:
        """True only when ``param_errors`` would find nothing but errors in values that take a reference.

        A cheap test the checker tries first; False says nothing (``param_errors`` decides).
        """
        plain = self.plain_params
        return plain is not None and plain.accepts(params)

    def validate_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments to call the function with; raises :class:`ParamsError`."""
        try:
            model = self._params.model_validate_json(pydantic_core.to_json(params), strict=True)
        except ValidationError as exc:
            raise ParamsError(self.name, problems(exc.errors(include_url=False))) from None
        return {info.alias or name: getattr(model, name) for name, info in type(model).model_fields.items()}

    def dump_output(self, value: Any) -> Any:
        """Check a return value against the declared output type and turn it into JSON data."""
        checked = self._output.validate_python(value)
        return self._output.dump_python(checked, mode="json")

    def resource_for(self, params: Mapping[str, Any], *, resolved: bool = False) -> str | None:
        """The resource this call touches; ``*`` stands for a part not known before run time.

        ``resolved``: ``params`` are the values the call is made with (references already replaced),
        so a ``${`` in one is text like any other. Before that, a value that takes a reference is
        not known, and one whose ``${`` are all ``$${`` escapes is the text the tool will be given.
        """
        if not self._resource_parts:
            return self.resource
        parts: list[str] = []
        for literal, name in self._resource_parts:
            parts.append(literal)
            if name is not None:
                value = params.get(name)
                text = str(value) if isinstance(value, str | int | float) else None
                if text is not None and not resolved:
                    text = references.known_text(text)
                parts.append("*" if text is None else text)
        return "".join(parts)

    @cached_property
    def fingerprint(self) -> str:
        """SHA-256 of what the tool declares (name, metadata, schemas): changes when its contract does."""
        described = self.describe()
        if self.origin is not None:  # where it was reached (a command, a port) is not part of its contract
            described["origin"] = {k: v for k, v in self.origin.items() if k != "source"}
        text = json.dumps(described, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()

    def describe(self) -> dict[str, Any]:
        """The tool as data: what a planning model and a reviewer are shown."""
        return {
            "name": self.name,
            "description": self.description,
            "effect": self.effect,
            "idempotent": self.idempotent,
            "external": self.external,
            "scopes": list(self.scopes),
            "resource": self.resource,
            "compensate": self.compensate,
            "untrusted_output": self.untrusted_output,
            "tags": list(self.tags),
            "params": self.params_schema,
            "output": self.output_schema,
            # Only when declared: a tool that declares neither keeps the fingerprint it had.
            **({"timeout": self.timeout} if self.timeout is not None else {}),
            **({"retries": self.retries} if self.retries else {}),
            **({"origin": dict(self.origin)} if self.origin is not None else {}),
            **({"set_by_policy": list(self.overridden)} if self.overridden else {}),
            **({"inherits_provenance": True} if self.inherits_provenance else {}),
        }


KEPT = 4096
"""The most answers one tool keeps of each kind (see :meth:`Tool.kept`)."""


def _text_in(key: object) -> int:
    """The characters of text a key holds: its strings, through tuples (a tool, a number or a flag: none)."""
    if isinstance(key, str):
        return len(key)
    return sum(_text_in(part) for part in key) if isinstance(key, tuple) else 0


_PLAIN_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}
_MODEL_KEYS = frozenset({"type", "cls", "schema", "custom_init", "root_model", "config", "ref", "metadata"})
_FIELDS_KEYS = frozenset({"type", "fields", "model_name", "computed_fields"})
_FIELD_KEYS = frozenset({"type", "schema", "validation_alias", "serialization_alias", "metadata"})
_CONFIG_KEYS = frozenset({"extra_fields_behavior", "strict", "validate_by_name", "validate_by_alias", "title"})
_INT_RANGE = range(-(2**63), 2**63)


@dataclass(frozen=True)
class PlainParams:
    """A tool's parameters when each is one plain JSON type with no constraint: checked without a validator."""

    types: Mapping[str, str]
    """Parameter name -> its JSON type (string, integer, number or boolean)."""
    required: frozenset[str]

    @classmethod
    def of(cls, model: type[BaseModel]) -> PlainParams | None:
        """The plain parameters of a parameter model, or None when anything in its schema is more than plain."""
        schema: Any = model.__dict__.get("__pydantic_core_schema__")
        if not isinstance(schema, dict) or schema.get("type") != "model" or set(schema) - _MODEL_KEYS:
            return None
        config, fields = schema.get("config", {}), schema["schema"]
        if schema.get("custom_init") or schema.get("root_model") or set(config) - _CONFIG_KEYS:
            return None
        if config.get("extra_fields_behavior") != "forbid" or config.get("validate_by_alias") is False:
            return None
        if fields.get("type") != "model-fields" or set(fields) - _FIELDS_KEYS or fields.get("computed_fields"):
            return None
        types: dict[str, str] = {}
        required: set[str] = set()
        for name, found in fields["fields"].items():
            alias = found.get("validation_alias", name)
            inner = found.get("schema", {})
            optional = inner.get("type") == "default" and set(inner) == {"type", "schema", "default"}
            inner = inner["schema"] if optional else inner
            if set(found) - _FIELD_KEYS or not isinstance(alias, str) or set(inner) - {"type", "metadata"}:
                return None
            if inner.get("type") not in _PLAIN_TYPES or alias in types:
                return None
            types[alias] = _PLAIN_TYPES[inner["type"]]
            if not optional:
                required.add(alias)
        return cls(types, frozenset(required))

    def accepts(self, params: Mapping[str, Any]) -> bool:
        """Whether every parameter is known and of its type (or text with a reference), and none is missing."""
        if not params.keys() >= self.required:
            return False
        types = self.types
        for name, value in params.items():
            kind = types.get(name)
            if kind is None:
                return False
            given = type(value)
            if given is str:
                if not value.isascii():  # text that may not encode: the validator says what it makes of it
                    return False
                if kind != "string" and not references.takes_refs(value):  # a reference: the reference check's
                    return False
            elif not _plain_fits(kind, given, value):
                return False
        return True


def _plain_fits(kind: str, given: type, value: Any) -> bool:
    if given is bool:
        return kind == "boolean"
    if given is int:
        return kind in ("integer", "number") and value in _INT_RANGE
    if given is float:
        return kind == "number" and math.isfinite(value)
    return False


def problems(errors: Iterable[pydantic_core.ErrorDetails], prefix: str = "") -> list[Problem]:
    """Plain-words problems from pydantic's error details."""
    return [Problem(location=prefix + _loc(err["loc"]), message=_message(err)) for err in errors]


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _message(err: pydantic_core.ErrorDetails) -> str:
    if err["type"] == "missing":
        return "required, but missing"
    if err["type"] == "extra_forbidden":
        return "not a known field"
    shown = repr(err.get("input"))
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return f"{err['msg']} (got {shown})"


@overload
def tool(fn: F, /) -> Tool: ...
@overload
def tool(fn: F, /, **meta: Any) -> Tool: ...
@overload
def tool(fn: None = None, /, **meta: Any) -> Callable[[F], Tool]: ...


def tool(fn: Callable[..., Any] | None = None, /, **meta: Any) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a tool from a typed function: ``@tool``, ``@tool(effect="write")`` or ``tool(fn, ...)``.

    Its parameter and return types become JSON Schemas (by pydantic). An output with named
    fields is a ``TypedDict``, a dataclass or a pydantic model; on Python 3.11 a
    ``TypedDict`` must be ``typing_extensions.TypedDict`` (pydantic refuses
    ``typing.TypedDict`` before 3.12).

    Metadata (all keyword-only):

    - ``name``, ``description``: default to the function's name and docstring.
    - ``effect``: ``"read"`` (default), ``"write"`` or ``"irreversible"``.
    - ``idempotent``: safe to repeat with the same idempotency key; defaults to true for
      ``read`` tools and false otherwise.
    - ``scopes``: permission scopes the caller must hold, e.g. ``["refunds:write"]``.
    - ``external``: calls something outside the organisation (email, a third-party API).
    - ``resource``: what it touches, e.g. ``"invoice:{invoice_id}"``; ``{param}`` is
      filled from the step's parameters.
    - ``compensate``: name of the tool that undoes it.
    - ``untrusted_output``: its output is text from outside and may carry instructions.
    - ``inherits_provenance``: its output derives from its inputs alone (an extractor, a
      formatter): a value it returns keeps the sources, and the trust, of the values it was
      given, so untrusted text passed through it is still untrusted at a sink.
    - ``tags``: free labels a policy can match, e.g. ``["pii"]``.
    - ``timeout``: seconds one call may take (default: the policy's ``limits.tool_timeout``,
      else 300). A call that takes longer is a failure; on a tool that is not idempotent
      its outcome is unknown, and the run halts for a person.
    - ``retries``: how many times a failed or timed-out call is made again, under the
      same idempotency key, with exponential backoff. Idempotent tools only.
    """
    if fn is None:
        return lambda f: _build(f, **meta)
    return _build(fn, **meta)


def _build(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    effect: Effect = "read",
    idempotent: bool | None = None,
    scopes: Iterable[str] = (),
    external: bool = False,
    resource: str | None = None,
    compensate: str | None = None,
    untrusted_output: bool = False,
    tags: Iterable[str] = (),
    timeout: float | None = None,
    retries: int = 0,
    inherits_provenance: bool = False,
) -> Tool:
    if isinstance(fn, Tool):
        raise ToolDefinitionError(f"{fn.name!r} is already a tool")
    if not callable(fn):
        raise ToolDefinitionError(f"a tool must be a function, not {type(fn).__name__}")
    tool_name: str = name or str(getattr(fn, "__name__", ""))
    where = f"tool {tool_name!r}"
    if not NAME.fullmatch(tool_name):
        raise ToolDefinitionError(f"{where}: a tool name is a letter or '_' then letters, digits, '_', '.', '-'")
    if effect not in EFFECTS:
        raise ToolDefinitionError(f"{where}: effect must be one of {', '.join(EFFECTS)}, not {effect!r}")
    summary, param_docs = _docstring.parse(fn.__doc__)
    params_model, ctx_param, output_type = _signature(fn, where, param_docs)
    try:
        params_schema = params_model.model_json_schema()
        output = TypeAdapter(output_type)
        output_schema = output.json_schema(mode="serialization")
    except (PydanticUserError, TypeError, ValueError) as exc:
        raise _types_error(where, "its types cannot be described as JSON Schema", exc) from None
    params_schema.pop("title", None)
    resource_parts = _resource_template(resource, params_schema, where)
    return Tool(
        name=tool_name,
        fn=fn,
        description=(description if description is not None else summary).strip(),
        effect=effect,
        scopes=tuple(scopes),
        external=bool(external),
        resource=resource,
        idempotent=(effect == "read") if idempotent is None else bool(idempotent),
        compensate=compensate,
        untrusted_output=bool(untrusted_output),
        tags=tuple(tags),
        timeout=timeout,
        retries=retries,
        inherits_provenance=bool(inherits_provenance),
        params_schema=params_schema,
        output_schema=output_schema,
        is_async=inspect.iscoroutinefunction(fn),
        ctx_param=ctx_param,
        _params=params_model,
        _output=output,
        _resource_parts=resource_parts,
    )


def _signature(fn: Callable[..., Any], where: str, docs: Mapping[str, str]) -> tuple[type[BaseModel], str | None, Any]:
    try:
        hints = get_type_hints(fn, include_extras=True)
        sig = inspect.signature(fn)
    except (NameError, TypeError, ValueError) as exc:
        raise ToolDefinitionError(f"{where}: cannot read its type hints: {exc}") from None
    if "return" not in hints:
        raise ToolDefinitionError(f"{where}: add a return type hint (use '-> None' if it returns nothing)")
    fields: dict[str, Any] = {}
    ctx_param: str | None = None
    for index, param in enumerate(sig.parameters.values()):
        hint = hints.get(param.name)
        if param.name == "ctx" or hint is RunContext:
            ctx_param = param.name
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ToolDefinitionError(f"{where}: parameter {param.name!r} must be a plain named parameter")
        if hint is None:
            raise ToolDefinitionError(f"{where}: parameter {param.name!r} has no type hint")
        default = ... if param.default is param.empty else param.default
        # Internal field names avoid clashes with BaseModel's own attributes ("json", "copy"...).
        fields[f"p{index}"] = (hint, Field(default, alias=param.name, description=docs.get(param.name)))
    config = ConfigDict(extra="forbid", strict=True, validate_by_name=False)
    model_name = re.sub(r"\W", "_", fn.__name__) + "_params"
    try:
        model = create_model(model_name, __config__=config, **fields)
    except (PydanticUserError, TypeError) as exc:
        raise _types_error(where, "its parameter types are not supported", exc) from None
    return model, ctx_param, hints["return"]


def _types_error(where: str, what: str, exc: Exception) -> ToolDefinitionError:
    """One line saying what to change; pydantic's own text spans lines and points at a web page."""
    if isinstance(exc, PydanticUserError) and exc.code == "typed-dict-version":
        return ToolDefinitionError(
            f"{where}: it uses typing.TypedDict, which pydantic refuses before Python 3.12: "
            "write 'from typing_extensions import TypedDict' instead"
        )
    return ToolDefinitionError(f"{where}: {what}: {str(exc).strip().splitlines()[0]}")


def _resource_template(
    resource: str | None, params_schema: Mapping[str, Any], where: str
) -> tuple[tuple[str, str | None], ...]:
    """``(literal text, parameter name)`` pairs of a ``{param}`` template; empty when there is none."""
    if resource is None or "{" not in resource:
        return ()
    try:
        parts = tuple((literal, name) for literal, name, _, _ in string.Formatter().parse(resource))
    except ValueError as exc:
        raise ToolDefinitionError(f"{where}: resource {resource!r} is not a valid template: {exc}") from None
    unknown = [n for _, n in parts if n is not None and n not in params_schema.get("properties", {})]
    if unknown:
        raise ToolDefinitionError(f"{where}: resource {resource!r} names unknown parameter(s) {unknown}")
    return parts
