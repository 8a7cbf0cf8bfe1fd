"""``${N}`` and ``${N.a.b}`` references between plan steps.

A parameter value that is exactly one reference takes the referenced value with its
type (``"${1.total}"`` becomes the number ``12.5``); a reference inside a longer string
is interpolated as text (strings as they are, anything else as compact JSON). ``$${``
writes a literal ``${``. Path segments are object keys or list indices.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterator, Mapping
from functools import lru_cache
from typing import Any, NamedTuple

from plangate.errors import RefError

# One token of a string: an escaped "$${", a "${...}" group, or a "${" never closed.
_TOKEN = re.compile(r"\$\$\{|\$\{([^}]*)\}|\$\{")
_BODY = re.compile(r"([0-9]{1,9})((?:\.[A-Za-z0-9_-]+)*)")  # 0-9: other scripts' digits are numbers to \d
_WHOLE = re.compile(r"\$\{([0-9]{1,9})((?:\.[A-Za-z0-9_-]+)*)\}")

Loc = tuple[str | int, ...]
_new_tuple = tuple.__new__


# Hot-path value types are NamedTuples: as immutable as frozen dataclasses, and several
# times cheaper to create, which matters when every check of every plan makes dozens.


class Ref(NamedTuple):
    """A reference to step ``step``'s output, then into it along ``path``."""

    step: int
    path: tuple[str, ...]

    @property
    def text(self) -> str:
        return "${" + ".".join((str(self.step), *self.path)) + "}"

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"Ref({self.step}, {self.path!r})"


class Found(NamedTuple):
    """A reference found in a value: where it sits and whether it is the whole value."""

    loc: Loc
    ref: Ref
    whole: bool


def scan(text: str) -> list[Ref]:
    """Every reference in ``text``, in order. Raises :class:`RefError` on a malformed one."""
    refs: list[Ref] = []
    for match in _TOKEN.finditer(text):
        token = match.group(0)
        if token == "$${":
            continue
        body = match.group(1)
        if body is None:
            raise RefError(f"unclosed reference at column {match.start() + 1}: missing '}}'")
        refs.append(_parse_body(body))
    return refs


def _parse_body(body: str) -> Ref:
    return _short_body(body) if len(body) <= _SHORT else _any_body(body)


def _any_body(body: str) -> Ref:
    parsed = _BODY.fullmatch(body)
    if parsed is None:
        raise RefError(
            f"malformed reference '${{{body}}}': write ${{N}} or ${{N.field}} "
            "where N is a step id in the digits 0-9 (use $${ for a literal '${')"
        )
    return _ref(parsed)


def _ref(match: re.Match[str]) -> Ref:
    step, path = match.groups()
    return _new_tuple(Ref, (int(step), tuple(path[1:].split(".")) if path else ()))


def whole_ref(value: object) -> Ref | None:
    """The reference when ``value`` is a string made of exactly one reference."""
    if not isinstance(value, str):
        return None
    match = _WHOLE.fullmatch(value)
    return None if match is None else _ref(match)


_SHORT = 80
"""Whole references up to this long are parsed once and remembered: plans repeat the same few."""


@lru_cache(maxsize=4096)
def _whole_short(text: str) -> Ref | None:
    return whole_ref(text)


@lru_cache(maxsize=4096)
def _short_body(body: str) -> Ref:
    """A reference's body (``2.email``), parsed once: plans name the same few. A malformed one raises each time."""
    return _any_body(body)


def has_refs(value: str) -> bool:
    return "${" in value


def takes_refs(value: str) -> bool:
    """Whether ``value`` holds a reference, or a malformed one: a ``${`` that is not part of a ``$${`` escape.

    Text whose every ``${`` is escaped is known before the run: the literal text :func:`unescaped` gives.
    """
    if "$${" not in value:  # no escape: any "${" is a reference (or a malformed one)
        return "${" in value
    return any(match.group(0) != "$${" for match in _TOKEN.finditer(value))


def known_text(value: str) -> str | None:
    """The text a plan's string gives the tool, known before the run: its escapes read as the ``${`` they
    stand for; None when it takes a reference (known only once the engine resolves it)."""
    if "${" not in value:
        return value
    return None if takes_refs(value) else unescaped(value)


def known_values(value: Any) -> Any:
    """A plan's JSON value as the tool is given it, as far as the plan's text says before the run: each
    string that takes no reference read as :func:`known_text` reads it, one that takes a reference as written.
    What holds no escape comes back as it is, not copied (the checker reads every step's parameters)."""
    if isinstance(value, str):
        known = known_text(value)
        return value if known is None else known
    if isinstance(value, Mapping):
        changed = {k: new for k, item in value.items() if _escaped(item) and (new := known_values(item)) is not item}
        return {**value, **changed} if changed else value
    if isinstance(value, list):
        if not any(_escaped(item) for item in value):
            return value
        return [known_values(item) for item in value]
    return value


def _escaped(item: Any) -> bool:
    """Whether a value may hold a ``$${`` escape (a string with one, or a container)."""
    return "$${" in item if type(item) is str else isinstance(item, Mapping | list)


def unescaped(value: str) -> str:
    """``value`` with each ``$${`` escape made the ``${`` it stands for, and each reference left as written.

    For text that takes no reference (see :func:`takes_refs`), the text the tool is given; for
    text that does, its literal parts as the tool is given them, the references in between.
    """
    return _TOKEN.sub(_unescaped_token, value) if "$${" in value else value


def _unescaped_token(match: re.Match[str]) -> str:
    token = match.group(0)
    return "${" if token == "$${" else token


def literal(value: Any) -> Any:
    """Plan text that :func:`resolve` reads back as ``value`` exactly: each ``${`` in its strings escaped.

    For values that are literal through and through (a ReAct model's arguments), held to the
    rules that read a plan's text. Keys are never resolved, so they are kept as they are.
    """
    if isinstance(value, str):
        return value.replace("${", "$${") if "${" in value else value
    if isinstance(value, Mapping):
        return {k: literal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [literal(v) for v in value]
    return value


def walk(value: Any, loc: Loc = ()) -> Iterator[tuple[Loc, str]]:
    """Every string inside a JSON value (keys excluded), with its location."""
    stack: list[tuple[Loc, Any]] = [(loc, value)]
    while stack:
        here, item = stack.pop()
        if isinstance(item, str):
            yield here, item
        elif isinstance(item, Mapping):
            stack.extend(((*here, k), v) for k, v in reversed(list(item.items())))
        elif isinstance(item, list):
            stack.extend(((*here, i), v) for i, v in reversed(list(enumerate(item))))


def find(value: Any, loc: Loc = ()) -> tuple[list[Found], list[tuple[Loc, RefError]]]:
    """Every reference inside a JSON value, and the error of each malformed one, with its location."""
    found: list[Found] = []
    bad: list[tuple[Loc, RefError]] = []
    if not loc and isinstance(value, dict | Mapping):  # the usual case: a step's flat parameters
        for key, item in value.items():
            if type(item) is str:
                if "${" in item:
                    _collect(found, bad, (key,), item)
            elif isinstance(item, Mapping | list):
                deeper, wrong = find(item, (key,))
                found += deeper
                bad += wrong
        return found, bad
    for here, text in walk(value, loc):
        if "${" in text:
            _collect(found, bad, here, text)
    return found, bad


def _collect(found: list[Found], bad: list[tuple[Loc, RefError]], here: Loc, text: str) -> None:
    ref = _whole_short(text) if len(text) <= _SHORT else whole_ref(text)
    if ref is not None:
        found.append(_new_tuple(Found, (here, ref, True)))  # positionally: cheaper than Found(...)
        return
    try:
        found.extend(_new_tuple(Found, (here, ref, False)) for ref in scan(text))
    except RefError as exc:
        bad.append((here, exc))


def lookup(ref: Ref, outputs: Mapping[int, Any], nulls: Collection[int] = ()) -> Any:
    """The value ``ref`` points at in the recorded ``outputs`` (step id -> JSON output).

    ``nulls``: steps that gave null in place of an output (an optional step that failed);
    every field of theirs is null too.
    """
    if ref.step not in outputs:
        raise RefError(f"{ref}: step {ref.step} has no recorded output")
    if ref.step in nulls:
        return None
    value = outputs[ref.step]
    for depth, key in enumerate(ref.path):
        where = ".".join((str(ref.step), *ref.path[:depth])) or str(ref.step)
        if isinstance(value, Mapping):
            if key not in value:
                raise RefError(f"{ref}: the output of {where} has no field {key!r}")
            value = value[key]
        elif isinstance(value, list) and key.isdigit():
            index = int(key)
            if index >= len(value):
                raise RefError(f"{ref}: index {index} is past the end of {where}")
            value = value[index]
        else:
            raise RefError(f"{ref}: {where} is {_kind(value)}, not an object or list")
    return value


def resolve(value: Any, outputs: Mapping[int, Any], nulls: Collection[int] = ()) -> Any:
    """``value`` with every reference replaced by what it points at in ``outputs`` (``nulls``: see :func:`lookup`)."""
    if isinstance(value, str):
        return _resolve_text(value, outputs, nulls)
    if isinstance(value, Mapping):
        return {k: resolve(v, outputs, nulls) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve(v, outputs, nulls) for v in value]
    return value


def _resolve_text(text: str, outputs: Mapping[int, Any], nulls: Collection[int]) -> Any:
    if not has_refs(text):
        return text
    ref = whole_ref(text)
    if ref is not None:
        return lookup(ref, outputs, nulls)

    def render(match: re.Match[str]) -> str:
        if match.group(0) == "$${":
            return "${"
        body = match.group(1)
        if body is None:
            raise RefError(f"unclosed reference at column {match.start() + 1}")
        return as_text(lookup(_parse_body(body), outputs, nulls))

    return _TOKEN.sub(render, text)


def renumber(value: Any, ids: Mapping[int, int]) -> Any:
    """``value`` with each reference to step N made a reference to step ``ids[N]``.

    A reference to a step ``ids`` does not name, or one that does not parse, is left as it
    is; the text around references, and ``$${`` escapes, are kept.
    """
    if isinstance(value, str):
        return _TOKEN.sub(lambda match: _renumbered(match, ids), value) if has_refs(value) else value
    if isinstance(value, Mapping):
        return {k: renumber(v, ids) for k, v in value.items()}
    if isinstance(value, list):
        return [renumber(v, ids) for v in value]
    return value


def _renumbered(match: re.Match[str], ids: Mapping[int, int]) -> str:
    body = match.group(1)
    parsed = _BODY.fullmatch(body) if body is not None else None
    if parsed is None or int(parsed.group(1)) not in ids:
        return match.group(0)
    return "${" + str(ids[int(parsed.group(1))]) + parsed.group(2) + "}"


def as_text(value: Any) -> str:
    """How a value reads when interpolated into a string."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return "a string" if isinstance(value, str) else type(value).__name__
