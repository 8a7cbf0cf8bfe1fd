"""Lenient reading of a model's JSON answer: code fences, prose around the object, trailing commas.

Only the wrapping is forgiven; the JSON itself is read strictly (see :mod:`plangate._input`),
and the caller validates what comes out against its own schema.
"""

from __future__ import annotations

import re
from typing import Any

from plangate import _input
from plangate.errors import RefusedInputError

FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)
TRAILING_COMMA = re.compile(r",(\s*[}\]])")


def answer_json(text: str) -> Any:
    """Strict JSON (see ``plangate._input``), forgiving only trailing commas."""
    try:
        return _input.loads_strict(text, what="the answer")
    except RefusedInputError as exc:
        if exc.rule != "not-json":
            raise
    return _input.loads_strict(TRAILING_COMMA.sub(r"\1", text), what="the answer")


def json_text(text: str) -> str | None:
    fenced = FENCE.search(text)
    if fenced:
        text = fenced.group(1)
    start = text.find("{")
    if start < 0:
        return None
    end = object_end(text, start)
    return text[start:] if end is None else text[start : end + 1]  # unbalanced: the parser says where


def object_end(text: str, start: int) -> int | None:
    """Where the JSON object opening at ``start`` closes (strings and escapes respected)."""
    depth, in_string, escaped = 0, False, False
    for index in range(start, len(text)):
        char = text[index]
        if in_string:
            in_string = escaped or char != '"'
            escaped = not escaped and char == "\\"
        elif char == '"':
            in_string = True
        elif char in "{}":
            depth += 1 if char == "{" else -1
            if depth == 0:
                return index
    return None
