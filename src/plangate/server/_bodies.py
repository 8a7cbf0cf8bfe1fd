"""Reading request bodies: one JSON reader for every JSON body, one for forms, and typed validation.

:func:`read_json` is the only place a body becomes JSON. It refuses, with 400 and before
any recursion, JSON nested deeper than :data:`MAX_DEPTH`; then numbers that are not
finite (``NaN``, ``Infinity``, ``1e999``), duplicate keys, text that is not UTF-8, lone
surrogates and the character NUL, none of which a plan or a decision can carry on into
canonical JSON or a PostgreSQL text column.
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request

from plangate.server._errors import describe

MAX_DEPTH = 64
MAX_FIELDS = 64
T = TypeVar("T")

# A JSON string, or the rest of an unterminated one: always matches at its first quote, so never backtracks.
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"?', re.DOTALL)
# \u0000 after an even number of backslashes (a raw NUL byte is not JSON at all).
_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1


def read_json(raw: bytes, what: str = "the body") -> Any:
    """``raw`` as JSON, or ``HTTPException(400)`` saying why not (empty is ``None``)."""
    brackets = _STRING.sub(b"", raw).translate(None, delete=_NOT_BRACKETS)
    if max(accumulate(map(_STEP.__getitem__, brackets)), default=0) > MAX_DEPTH:
        raise HTTPException(400, f"{what}'s JSON is nested deeper than {MAX_DEPTH} levels")
    if _NUL.search(raw):
        raise HTTPException(400, f"{what} holds the character NUL (\\u0000), which no text here may")
    try:
        data = json.loads(
            raw.decode("utf-8") or "null",
            object_pairs_hook=_unique,
            parse_constant=_no_constant,
            parse_float=_finite,
        )
        json.dumps(data, ensure_ascii=False).encode("utf-8")  # a lone surrogate cannot be written back
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeError are ValueErrors
        raise HTTPException(400, f"{what} is not JSON: {exc}") from None
    return data


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data = dict(pairs)
    if len(data) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"the key {key[:80]!r} appears twice in one object")
            seen.add(key)
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is out of range for a number")
    return value


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
