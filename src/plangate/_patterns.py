"""A policy's patterns, matched in time linear in the text they are held against.

Policies hold patterns against text a plan's author chooses (resources filled from
parameters, parameter values), so no pattern and no text may make a match slow. Python's
``fnmatch`` and ``re`` both backtrack: ``re.search("a*a*x", "a" * 2000)`` takes most of a
second, and each more ``a*`` multiplies that by the text's length. Neither is used on
such text.

- :class:`Glob`: shell-style patterns (``get_*``, ``invoice:4?``, ``[a-c]*``), exactly
  :func:`fnmatch.fnmatchcase`'s language. The pattern is cut at its ``*``; the first piece
  must match at the start, the last at the end, and each piece between is found once,
  leftmost, after the one before. A piece has a fixed length and no repetition, so
  finding it never backtracks, and the text is never read twice.
- :func:`star_match`: the same walk for a pattern made from a plan's values, where only
  ``*`` is special (``?`` and ``[`` are whatever the value said).
- Deny rules' regular expressions: ``plangate._regex``.

Both count their work in an optional :class:`Meter`, so tests can assert the bound
instead of timing it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from fnmatch import translate
from functools import lru_cache
from typing import NamedTuple


@dataclass
class Meter:
    """Work done by matches: each piece searched (a glob), each character read and each state built (a regex).

    With a ``budget``, a match that would do more work than that stops with :class:`TooCostlyError`;
    ``grow``, if given, works out a larger budget once the first is spent (only then).
    """

    steps: int = 0
    budget: int | None = None
    grow: Callable[[], int] | None = None

    def spend(self, steps: int) -> None:
        self.steps += steps
        if self.budget is not None and self.steps > self.budget:
            if self.grow is not None:
                self.budget, self.grow = max(self.budget, self.grow()), None
                if self.steps <= self.budget:
                    return
            raise TooCostlyError(f"more than {self.budget:,} steps")


class TooCostlyError(Exception):
    """A match stopped at its meter's budget: the answer is unknown, so the caller refuses."""


class PatternError(ValueError):
    """A pattern that cannot be used; the message says why, and where."""


# -- globs ---------------------------------------------------------------------------------


class _Token(NamedTuple):
    text: str
    wild: bool  # ``?`` or a ``[...]`` set, as opposed to one literal character


@dataclass(frozen=True)
class _Piece:
    """A run of the pattern between two ``*``: fixed length, found by ``str.find`` or a regex without repetition."""

    size: int
    literal: str | None
    regex: re.Pattern[str] | None = None

    @classmethod
    def of(cls, tokens: list[_Token]) -> _Piece:
        if not any(token.wild for token in tokens):
            return cls(len(tokens), "".join(token.text for token in tokens))
        # fnmatch's own translation of a piece without '*': fixed width, nothing repeats
        text = "".join(token.text if token.wild else _escaped(token.text) for token in tokens)
        return cls(len(tokens), None, re.compile(translate(text).removesuffix(r"\Z"), re.DOTALL))

    def at(self, text: str, pos: int) -> bool:
        if self.literal is not None:
            return text.startswith(self.literal, pos)
        assert self.regex is not None
        return self.regex.match(text, pos) is not None

    def find(self, text: str, start: int, end: int) -> int:
        """The leftmost position in ``text[start:end]`` where the whole piece fits, or -1."""
        if self.literal is not None:
            return text.find(self.literal, start, end)
        assert self.regex is not None
        found = self.regex.search(text, start, end)
        return found.start() if found else -1


def _escaped(char: str) -> str:
    return f"[{char}]" if char in "*?[" else char


@dataclass(frozen=True)
class Glob:
    """A compiled shell-style pattern; :meth:`match` answers as ``fnmatchcase`` would."""

    pattern: str
    pieces: tuple[_Piece, ...]

    def match(self, text: str, meter: Meter | None = None) -> bool:
        first, last = self.pieces[0], self.pieces[-1]
        if len(self.pieces) == 1:
            return len(text) == first.size and first.at(text, 0)
        end = len(text) - last.size
        if end < first.size or not first.at(text, 0) or not last.at(text, end):
            return False
        pos = first.size
        for piece in self.pieces[1:-1]:
            if meter is not None:
                meter.steps += 1
            found = piece.find(text, pos, end)
            if found < 0:
                return False
            pos = found + piece.size
        return True


@lru_cache(maxsize=4096)
def glob(pattern: str) -> Glob:
    """The compiled form of a policy's ``pattern`` (remembered: a policy uses the same few patterns)."""
    pieces: list[_Piece] = []
    tokens: list[_Token] = []
    for token in _glob_tokens(pattern):
        if token.text == "*" and token.wild:
            pieces.append(_Piece.of(tokens))
            tokens = []
        else:
            tokens.append(token)
    pieces.append(_Piece.of(tokens))
    return Glob(pattern, tuple(pieces))


def matches_any(patterns: tuple[str, ...], value: str) -> bool:
    """Whether ``value`` matches one of the shell-style ``patterns`` (answers for short values are remembered)."""
    if len(value) <= REMEMBERED:
        return _matches_short(patterns, value)
    return any(glob(pattern).match(value) for pattern in patterns)


REMEMBERED = 256
"""Values up to this long have their answers kept; a plan's long values would only fill the memory."""


@lru_cache(maxsize=65536)
def _matches_short(patterns: tuple[str, ...], value: str) -> bool:
    return any(glob(pattern).match(value) for pattern in patterns)


def like(pattern: str) -> str:
    """A SQL ``LIKE`` pattern (escaped with ``\\``) that every text ``pattern`` matches also matches.

    ``*`` is ``%``, ``?`` is ``_``, and so is a ``[...]`` set, which LIKE cannot say: there it is
    looser than the pattern, and so is a LIKE that ignores case (SQLite's, for ASCII letters).
    The database narrows with it what Python then checks with :func:`matches_any`.
    """
    return "".join(
        "%" if token == _STAR else "_" if token.wild else like_escaped(token.text) for token in _glob_tokens(pattern)
    )


def like_escaped(text: str) -> str:
    """``text`` as itself in a SQL ``LIKE`` pattern escaped with ``\\``."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def star_match(pattern: str, text: str, meter: Meter | None = None) -> bool:
    """Whether ``text`` matches ``pattern`` in which only ``*`` is special (any text).

    For patterns made from a plan's values (a resource with a part known only at run
    time), so never remembered and never compiled: ``?`` and ``[`` are what the value
    said. The same walk as :meth:`Glob.match`, on plain strings.
    """
    parts = pattern.split("*")
    first, last = parts[0], parts[-1]
    if len(parts) == 1:
        return text == pattern
    end = len(text) - len(last)
    if end < len(first) or not text.startswith(first) or not text.endswith(last):
        return False
    pos = len(first)
    for part in filter(None, parts[1:-1]):
        if meter is not None:
            meter.steps += 1
        found = text.find(part, pos, end)
        if found < 0:
            return False
        pos = found + len(part)
    return True


def may_match_any(patterns: tuple[str, ...], template: str) -> bool:
    """Whether some text ``template`` stands for matches one of the shell-style ``patterns``.

    In ``template`` (a resource with a part known only at run time) each ``*`` is any text,
    and every other character is itself. Read once, character by character, over the set of
    places each pattern may have reached (a bit each): linear in the template's length.
    """
    return any(_may_match(pattern, template) for pattern in patterns)


def _may_match(pattern: str, template: str) -> bool:
    tokens = _glob_tokens(pattern)
    stars = sum(1 << i for i, token in enumerate(tokens) if token == _STAR)
    everywhere = (1 << (len(tokens) + 1)) - 1
    fits: dict[str, int] = {}
    places = 1 | (1 & stars) << 1
    for char in template:
        if not places:
            return False
        if char == "*":  # any text: every place from the first reached on (each token takes some text)
            places = everywhere & ~((places & -places) - 1)
            continue
        fit = fits.get(char)
        if fit is None:
            fit = fits[char] = sum(1 << i for i, token in enumerate(tokens) if _takes(token, char))
        places = (places & stars) | (places & fit) << 1
        places |= (places & stars) << 1
    return bool(places >> len(tokens) & 1)


def _takes(token: _Token, char: str) -> bool:
    """Whether one token other than ``*`` matches ``char``."""
    if token == _STAR:
        return False
    if not token.wild:
        return token.text == char
    return token.text == "?" or re.fullmatch(translate(token.text), char, re.DOTALL) is not None


def _glob_tokens(pattern: str) -> list[_Token]:
    """One token per character the pattern matches, and one per run of ``*``."""
    tokens: list[_Token] = []
    i = 0
    while i < len(pattern):
        char = pattern[i]
        end = _class_end(pattern, i) if char == "[" else -1
        if end > 0:
            tokens.append(_Token(pattern[i : end + 1], wild=True))
            i = end + 1
            continue
        if char != "*" or not tokens or tokens[-1] != _STAR:
            tokens.append(_Token(char, wild=char in "*?"))
        i += 1
    return tokens


_STAR = _Token("*", wild=True)


def _class_end(pattern: str, start: int) -> int:
    """Where the ``[...]`` set opened at ``start`` closes, as fnmatch reads it; -1: a literal ``[``."""
    j = start + 1
    if j < len(pattern) and pattern[j] == "!":
        j += 1
    if j < len(pattern) and pattern[j] == "]":
        j += 1
    return pattern.find("]", j)
