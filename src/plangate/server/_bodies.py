"""Reading request bodies: one JSON reader for every JSON body, one for forms, and typed validation.

:func:`read_json` is the only place a body becomes JSON, through plangate's one strict
reader (:mod:`plangate._input`): it refuses, with 400 naming the rule and the value's
path, JSON nested deeper than :data:`MAX_DEPTH`, numbers that are not finite (``NaN``,
``Infinity``, ``1e999``), duplicate keys, text that is not UTF-8, and control and bidi
characters (NUL among them, which a PostgreSQL text column cannot hold).
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import Field, TypeAdapter, ValidationError
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request

from plangate import _input
from plangate.errors import RefusedInputError
from plangate.server._errors import describe

MAX_DEPTH = _input.MAX_DEPTH
MAX_FIELDS = 64
MAX_VERSION = 1_000_000_000
Version = Annotated[int, Field(ge=1, le=MAX_VERSION)]
"""A plan version's number, as a body or a form names the one it was shown."""
T = TypeVar("T")


def read_json(raw: bytes, what: str = "the body") -> Any:
    """``raw`` as JSON, or ``HTTPException(400)`` naming the rule and the path (empty is ``None``).

    The same strict reader as plans and files (:func:`plangate._input.loads_strict`).
    """
    try:
        return _input.loads_strict(raw or b"null", what=what, max_depth=MAX_DEPTH)
    except RefusedInputError as exc:
        raise HTTPException(400, str(exc)) from None


async def read_form(request: Request) -> dict[str, str]:
    """A form's fields (no files, each field once)."""
    form = await request.form(max_files=0, max_fields=MAX_FIELDS)
    items = form.multi_items()
    fields = {name: value for name, value in items if not isinstance(value, UploadFile)}
    if len(fields) != len(items):
        raise HTTPException(400, "a form field is given twice, or is a file")
    if any("\x00" in value for value in fields.values()):
        raise HTTPException(400, "a form field holds the character NUL, which no text here may")
    return fields


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def _adapter(kind: Any) -> TypeAdapter[Any]:
    if kind not in _ADAPTERS:
        _ADAPTERS[kind] = TypeAdapter(kind)
    return _ADAPTERS[kind]


def validated(kind: type[T], data: Any, *, strict: bool = True) -> T:
    """``data`` as ``kind`` (a pydantic model or a type), or ``HTTPException(422)`` saying what does not fit."""
    try:
        value: T = _adapter(kind).validate_python(data, strict=strict)
    except ValidationError as exc:
        raise HTTPException(422, f"the body does not fit: {describe(exc.errors(include_input=False))}") from None
    return value
