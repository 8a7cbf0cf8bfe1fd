"""Untrusted input refused at the edge: files, JSON and YAML read under strict rules.

Every file plangate reads for a person (a plan, a policy, a tasks file, a price table)
and every JSON text it is handed (a plan, a model's answer, an API body) passes through
here first, so the Python API, the command line and the server refuse the same things in
the same words. The functions other layers call:

- ``read_bytes(path, *, what, limit) -> bytes``: a regular file of at most ``limit``
  bytes. A FIFO, a directory, a device or a socket is refused without being read, and
  without ever blocking; at most ``limit + 1`` bytes are read, so ``/dev/zero``-like
  files cannot exhaust memory. ``read_text`` decodes the same as UTF-8.
- ``loads_strict(text, *, what, limit=None, max_depth=64, max_string=None) -> Any``:
  JSON, then :func:`check_value` on what it decodes to (``decode_json`` is the first
  half, for a caller that runs the check itself).
- ``check_value(value, path="", *, what="input", max_depth=64, max_string=None)``: the
  same rules on a value decoded elsewhere (a dict given to the Python API, a body a web
  framework parsed). ``path`` is the JSON path of ``value`` itself, e.g. ``"plan"``.
- ``check_text(value, path, *, what) -> str``: one text field (a comment): text, and
  free of bidi and control characters.
- ``load_yaml(text, *, what, max_depth=64) -> Any``: YAML without anchors, aliases or
  duplicate keys, then :func:`check_value`.

Each refusal is a :class:`~plangate.errors.RefusedInputError` whose message says where
(what was read, then the JSON path of the offending value or the line), the rule, and
why, e.g. ``plan: steps[2].params.note: bidi-control: U+202E RIGHT-TO-LEFT OVERRIDE ...``.
The rules:

=====================  ==============================================================
``cannot-open``        the file does not exist or may not be read
``not-a-regular-file`` a FIFO, a directory, a device, a socket
``too-large``          more bytes (or characters) than the limit
``not-utf8``           bytes that are not UTF-8
``not-json``           text that is not JSON
``not-yaml``           text that is not YAML
``duplicate-key``      a key given twice in one object or mapping: readers disagree on which wins
``non-finite-number``  ``NaN``, ``Infinity``, or a number that overflows to infinity (``1e999``)
``number-too-large``   an integer of more than 1,000 digits
``too-deep``           nested deeper than the limit (checked without recursing past it)
``string-too-long``    a string or key over ``max_string`` characters, where one is given
``bidi-control``       a bidirectional control (U+202A-U+202E, U+2066-U+2069, U+200E, U+200F, U+061C)
``control-character``  a C0 control other than tab, line feed and carriage return; DEL; a C1 control
``invisible-character`` a format character (zero-width spaces, soft hyphens, tag characters...), a
                       filler, U+2028 or U+2029 (a line break unseen); a joiner (U+200C, U+200D) that is
                       not between two characters outside ASCII, an emoji selector (U+FE0E, U+FE0F) that
                       is not right after one
``lone-surrogate``     half of a UTF-16 surrogate pair, which no UTF-8 text can hold
``yaml-alias``         a YAML anchor or alias (``&name``, ``*name``): the alias bomb's ingredient
``not-text``           a value that should be text and is not
=====================  ==============================================================

Bidi and control characters are refused because a reviewer reads this text: they can
make a value display differently from what the engine will use.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from plangate.errors import RefusedInputError

MAX_DEPTH = 64
MAX_FILE_BYTES = 1_048_576
"""The size limit for a configuration file: a policy, a tasks file, a price table."""
MAX_INT_DIGITS = 1_000
_MAX_INT_BITS = math.ceil(MAX_INT_DIGITS * math.log2(10))

_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
# Every format character (category Cf: zero-width spaces, soft hyphens, invisible operators, tag
# characters...) but the two joiners that scripts and emoji need; fillers that draw nothing; line
# and paragraph separators, which break a line that a reviewer's view may not show.
_INVISIBLE = (  # Unicode's format characters (Cf, to Unicode 15) and default-ignorable code points, less
    # the bidi controls (refused as such) and the joiners and emoji selectors (refused out of place, below)
    "\u00ad\u034f\u0600-\u0605\u06dd\u070f\u0890\u0891\u08e2\u115f\u1160\u17b4\u17b5\u180b-\u180f"
    "\u200b\u2060-\u206f\u3164\ufe00-\ufe0d\ufeff\uffa0\ufff0-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e0fff"
    "\u2028\u2029"  # line breaks a reviewer's view may not show
)
_JOINERS = "\u200c\u200d"  # ZERO WIDTH NON-JOINER and JOINER: Persian, the Indic scripts and emoji need them
_SELECTORS = "\ufe0e\ufe0f"  # draw the symbol before as text or as an emoji
_IN_PLACE = _JOINERS + _SELECTORS
_FORBIDDEN = re.compile(f"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f{_BIDI}{_INVISIBLE}{_IN_PLACE}\ud800-\udfff]")
# What a joiner joins and a selector selects: a character outside ASCII that is drawn, not a space
_DRAWN = re.compile(f"[^\x00-\x9f\\s{_BIDI}{_INVISIBLE}{_IN_PLACE}\ud800-\udfff]")
_INVISIBLE_CHARS = re.compile(f"[{_INVISIBLE}]")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_FILE_KINDS = {
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFDIR: "a directory",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFLNK: "a symbolic link",
}


def refuse(what: str, rule: str, detail: str, location: str = "") -> RefusedInputError:
    """The error for one refusal: ``WHAT: LOCATION: RULE: DETAIL``."""
    where = f"{what}: {location}" if location else what
    return RefusedInputError(f"{where}: {rule}: {detail}", rule=rule, location=location, detail=detail)


# -- files ---------------------------------------------------------------------------------


def read_bytes(path: str | Path, *, what: str, limit: int) -> bytes:
    """The bytes of the regular file at ``path``, at most ``limit`` of them."""
    label = f"{what} {str(path)!r}"
    try:
        kind = stat.S_IFMT(os.stat(path).st_mode)
        if kind != stat.S_IFREG:
            raise _not_regular(label, kind)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise refuse(f"cannot read {label}", "cannot-open", exc.strerror or str(exc)) from None
    try:
        info = os.fstat(fd)  # what was opened, in case the file was swapped after the stat
        if not stat.S_ISREG(info.st_mode):
            raise _not_regular(label, stat.S_IFMT(info.st_mode))
        if info.st_size > limit:
            raise _too_large(label, limit)
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 16))):
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise refuse(f"cannot read {label}", "cannot-open", exc.strerror or str(exc)) from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:  # grew since the fstat, or a file whose size the kernel does not know
        raise _too_large(label, limit)
    return data


def read_text(path: str | Path, *, what: str, limit: int) -> str:
    """The text of the regular file at ``path``: at most ``limit`` bytes of UTF-8."""
    return decode(read_bytes(path, what=what, limit=limit), what=f"{what} {str(path)!r}")


def decode(data: bytes, *, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise refuse(what, "not-utf8", f"not UTF-8 text: {exc.reason} at byte {exc.start}") from None


def _not_regular(label: str, kind: int) -> RefusedInputError:
    name = _FILE_KINDS.get(kind, "not a regular file")
    return refuse(f"cannot read {label}", "not-a-regular-file", f"it is {name}; only regular files are read")


def _too_large(label: str, limit: int) -> RefusedInputError:
    return refuse(f"cannot read {label}", "too-large", f"it is over the limit of {limit} bytes")


# -- JSON ----------------------------------------------------------------------------------


class _Duplicated(dict[str, Any]):
    """An object in which a key was given twice (the last value kept): refused by the walk, with its path."""

    key: str


@dataclass(frozen=True)
class _Unacceptable:
    """A number the decoder met that no JSON reader agrees on: refused by the walk, with its path."""

    rule: str
    detail: str


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) == len(pairs):
        return result
    duplicated = _Duplicated(result)
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            duplicated.key = key
            break
        seen.add(key)
    return duplicated


def _constant(name: str) -> _Unacceptable:
    return _Unacceptable("non-finite-number", f"{name} is not a JSON number")


def _integer(text: str) -> int | _Unacceptable:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        return _Unacceptable("number-too-large", f"an integer of more than {MAX_INT_DIGITS} digits")
    return int(text)


def loads_strict(
    text: str | bytes,
    *,
    what: str,
    limit: int | None = None,
    max_depth: int = MAX_DEPTH,
    max_string: int | None = None,
) -> Any:
    """Decode JSON text, refusing what :func:`check_value` refuses and anything over ``limit``."""
    value = decode_json(text, what=what, limit=limit, max_depth=max_depth)
    check_value(value, what=what, max_depth=max_depth, max_string=max_string)
    return value


def decode_json(text: str | bytes, *, what: str, limit: int | None = None, max_depth: int = MAX_DEPTH) -> Any:
    """The first half of :func:`loads_strict`, for a caller that runs :func:`check_value` itself.

    What no reader agrees on (a duplicate key, ``NaN``, an integer too long) is left in
    the value as a marker that only :func:`check_value` understands and refuses, with its
    path: never use the value without that check.
    """
    if limit is not None and len(text) > limit:
        unit = "bytes" if isinstance(text, bytes) else "characters"
        raise refuse(what, "too-large", f"{len(text)} {unit} is over the limit of {limit}")
    if isinstance(text, bytes):
        text = decode(text, what=what)
    try:
        return json.loads(text, object_pairs_hook=_object, parse_constant=_constant, parse_int=_integer)
    except json.JSONDecodeError as exc:
        raise refuse(what, "not-json", f"line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise _too_deep(what, _deep_path(text, max_depth), max_depth) from None


_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},]', re.DOTALL)


def _deep_path(text: str, max_depth: int) -> str:
    """The JSON path of the first array or object nested deeper than ``max_depth``.

    Only for the error message, after the decoder gave up: it reads tokens up to that
    point and never recurses, so even ``[[[[...`` a million deep costs ``max_depth`` steps.
    """
    stack: list[list[Any]] = []  # per open container: [is an object, current key or index, a key is next]
    for match in _TOKEN.finditer(text):
        token = match.group()
        first = token[0]
        if first in "[{":
            if len(stack) >= max_depth:
                break
            stack.append([first == "{", None if first == "{" else 0, first == "{"])
        elif first in "]}":
            if stack:
                stack.pop()
        elif first == ",":
            if stack and stack[-1][0]:
                stack[-1][2] = True
            elif stack:
                stack[-1][1] += 1
        elif stack and stack[-1][0] and stack[-1][2]:
            stack[-1][1], stack[-1][2] = _key(token), False
    return render_path("", [entry[1] for entry in stack if entry[1] is not None])


def _key(token: str) -> str:
    try:
        return str(json.loads(token))
    except ValueError:
        return token.strip('"')


# -- the walk --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Rules:
    what: str
    root: str
    max_depth: int
    max_string: int | None


_Trail = tuple[Any, ...] | None
"""A value's path, as (parent trail, key or index): built for free, rendered only for a refusal."""


def check_value(
    value: Any, path: str = "", *, what: str = "input", max_depth: int = MAX_DEPTH, max_string: int | None = None
) -> None:
    """Refuse a decoded value that breaks an input rule; ``path`` is the value's own JSON path.

    Walks dicts, lists and tuples to ``max_depth`` levels and no further (so even a value
    nested a million deep cannot exhaust the stack), checking every string and key,
    every float (finite) and every integer (at most 1,000 digits).
    """
    _walk(value, None, 1, _Rules(what, path, max_depth, max_string))


def _walk(value: Any, trail: _Trail, level: int, rules: _Rules) -> None:
    if type(value) is str:
        _check_string(value, trail, rules)
    elif isinstance(value, dict | list | tuple):
        if level > rules.max_depth:
            raise _too_deep(rules.what, _render(rules.root, trail), rules.max_depth)
        if isinstance(value, dict):
            _walk_object(value, trail, level, rules)
        else:
            for index, item in enumerate(value):
                _walk(item, (trail, index), level + 1, rules)
    else:
        _check_number(value, trail, rules)


def _walk_object(value: dict[Any, Any], trail: _Trail, level: int, rules: _Rules) -> None:
    if isinstance(value, _Duplicated):
        detail = "the key is given more than once in its object; readers disagree on which value counts"
        raise refuse(rules.what, "duplicate-key", detail, _render(rules.root, (trail, value.key)))
    for key, item in value.items():
        if type(key) is str:
            _check_string(key, (trail, key), rules, is_key=True)
        _walk(item, (trail, key), level + 1, rules)


def _check_number(value: Any, trail: _Trail, rules: _Rules) -> None:
    kind = type(value)
    if kind is float and not math.isfinite(value):
        detail = "NaN is not a JSON number" if math.isnan(value) else "an infinite number is not a JSON number"
        raise refuse(rules.what, "non-finite-number", detail, _render(rules.root, trail))
    if kind is int and value.bit_length() > _MAX_INT_BITS:
        detail = f"an integer of more than {MAX_INT_DIGITS} digits"
        raise refuse(rules.what, "number-too-large", detail, _render(rules.root, trail))
    if kind is _Unacceptable:
        raise refuse(rules.what, value.rule, value.detail, _render(rules.root, trail))


def _check_string(text: str, trail: _Trail, rules: _Rules, *, is_key: bool = False) -> None:
    if rules.max_string is not None and len(text) > rules.max_string:
        detail = f"a {'key' if is_key else 'string'} of {len(text)} characters is over the limit of {rules.max_string}"
        raise refuse(rules.what, "string-too-long", detail, _render(rules.root, trail))
    found = _FORBIDDEN.search(text)
    while found is not None and _in_place(text, found.start()):
        found = _FORBIDDEN.search(text, found.end())
    if found is not None:
        rule, detail = _character(found.group(), found.start(), "key" if is_key else "text")
        raise refuse(rules.what, rule, detail, _render(rules.root, trail))


def _in_place(text: str, at: int) -> bool:
    """A selector right after a character it can select; a joiner between two it can join (an emoji's
    selector may come between). Anywhere else they draw nothing, so ``"to\u200d"`` reads as ``"to"``."""
    char = text[at]
    if char not in _IN_PLACE:
        return False
    after_drawn = at > 0 and _DRAWN.match(text, at - 1) is not None
    if char in _SELECTORS:
        return after_drawn
    after_selector = at > 0 and text[at - 1] in _SELECTORS  # itself in place: the scan is left to right
    return (after_drawn or after_selector) and _DRAWN.match(text, at + 1) is not None


def _character(char: str, index: int, kind: str) -> tuple[str, str]:
    code = f"U+{ord(char):04X}"
    if char in _BIDI:
        name = unicodedata.name(char, "")
        return "bidi-control", (
            f"{code} {name} at character {index} of the {kind}: it can make text display differently "
            "from what it says; remove it"
        )
    if char in _JOINERS:
        return "invisible-character", (
            f"{code} {unicodedata.name(char)} at character {index} of the {kind} joins nothing: a joiner is kept "
            "only between two characters outside ASCII (letters of a script, emoji); remove it"
        )
    if char in _SELECTORS:
        return "invisible-character", (
            f"{code} at character {index} of the {kind} selects nothing: a text or emoji selector is kept only "
            "right after a character outside ASCII (a symbol, an emoji); remove it"
        )
    if _INVISIBLE_CHARS.match(char):
        return "invisible-character", f"{code} at character {index} of the {kind} shows nothing where it is; remove it"
    if "\ud800" <= char <= "\udfff":
        return "lone-surrogate", f"{code} at character {index} of the {kind} is half a surrogate pair, not a character"
    return "control-character", (
        f"{code} at character {index} of the {kind} is a control character; "
        "only tab, line feed and carriage return are allowed"
    )


def check_text(value: Any, path: str, *, what: str) -> str:
    """A text field a reviewer reads (a comment): text, and free of bidi and control characters."""
    if not isinstance(value, str):
        raise refuse(what, "not-text", f"expected text, got {type(value).__name__}", path)
    _check_string(value, None, _Rules(what, path, MAX_DEPTH, None))
    return value


def _too_deep(what: str, location: str, max_depth: int) -> RefusedInputError:
    return refuse(what, "too-deep", f"nested deeper than {max_depth} levels", location)


def _render(root: str, trail: _Trail) -> str:
    parts: list[Any] = []
    while trail is not None:
        trail, part = trail
        parts.append(part)
    return render_path(root, reversed(parts))


def render_path(root: str, parts: Any) -> str:
    """``steps[2].params.note``: keys that are identifiers after a dot, others quoted in brackets."""
    out = root
    for part in parts:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        elif isinstance(part, str) and _IDENTIFIER.fullmatch(part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(str(part), ensure_ascii=True)}]"
    return out


# -- YAML ----------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader without anchors, aliases or duplicate keys, and nested at most so deep.

    Anchors are refused where they are met, before anything they name is built: a
    "billion laughs" document is refused at its first anchor, after a few events.
    """

    what = "YAML"
    max_depth = MAX_DEPTH
    depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _at(self.what, event.start_mark, "yaml-alias", _ALIASES)
        self.depth += 1
        try:
            if self.depth > self.max_depth:
                raise _at(self.what, event.start_mark, "too-deep", f"nested deeper than {self.max_depth} levels")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        self.flatten_mapping(node)
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node)
            except TypeError:
                continue  # an unhashable key: the constructor says so below
            if first is not key_node:
                detail = f"the key {key!r} is given again (first at line {first.start_mark.line + 1})"
                raise _at(self.what, key_node.start_mark, "duplicate-key", detail)
        return super().construct_mapping(node, deep)


_ALIASES = "anchors and aliases (&name, *name) are not allowed; write each value out"


def _at(what: str, mark: Any, rule: str, detail: str) -> RefusedInputError:
    return refuse(what, rule, detail, f"line {mark.line + 1}")


def load_yaml(text: str, *, what: str, max_depth: int = MAX_DEPTH) -> Any:
    """Decode YAML text under the rules above; an empty document is ``None``."""
    try:
        loader = _StrictLoader(text)  # its reader refuses some characters (a NUL) already here
    except yaml.YAMLError as exc:
        raise refuse(what, "not-yaml", str(exc).replace("\n", " ")) from None
    loader.what, loader.max_depth = what, max_depth
    try:
        value = loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        raise refuse(what, "not-yaml", " ".join(filter(None, (exc.context, exc.problem))), where) from None
    except yaml.YAMLError as exc:
        raise refuse(what, "not-yaml", str(exc).replace("\n", " ")) from None
    finally:
        loader.dispose()
    check_value(value, what=what, max_depth=max_depth)
    return value
