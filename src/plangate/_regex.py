"""A deny rule's regular expression, matched in time linear in the text.

A subset of Python's syntax is compiled to an automaton (a Thompson NFA run as a DFA
built as it is needed, as RE2 and Rust's ``regex`` do) that reads each character once:
a search costs at most (length of the text + 1) x (states of the pattern) steps,
whatever both are. What only a backtracking matcher can do (back-references,
look-around, atomic groups, possessive quantifiers) is refused when the pattern is
compiled, with its position. ``.`` matches every character, a line break included.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field

from plangate._patterns import Meter, PatternError

MAX_PATTERN = 1_000
MAX_STATES = 10_000
_CACHE_LIMIT = 20_000


@dataclass(frozen=True)
class _Set:
    """What one character may be: these characters, ranges and classes (``d w s``, upper case negated)."""

    chars: frozenset[str] = frozenset()
    ranges: tuple[tuple[str, str], ...] = ()
    classes: str = ""
    negated: bool = False
    fold: bool = False

    def has(self, char: str) -> bool:
        hit = self._has(char) or (self.fold and (self._has(char.lower()) or self._has(char.upper())))
        return hit != self.negated

    def _has(self, char: str) -> bool:
        if char in self.chars or any(lo <= char <= hi for lo, hi in self.ranges):
            return True
        return any(_CLASSES[c](char) for c in self.classes)


def _word(char: str) -> bool:
    return char.isalnum() or char == "_"


_CLASSES: dict[str, Callable[[str], bool]] = {
    "d": str.isdecimal,
    "w": _word,
    "s": str.isspace,
    "D": lambda c: not c.isdecimal(),
    "W": lambda c: not _word(c),
    "S": lambda c: not c.isspace(),
    ".": lambda c: True,
}
_ASSERTIONS = {"^": "start", "$": "dollar", "A": "start", "Z": "end", "b": "word", "B": "nonword"}
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}
_REFUSED_GROUPS = {
    "=": "look-ahead (?=...)",
    "!": "negative look-ahead (?!...)",
    "<": "look-behind (?<=...) or (?<!...)",
    ">": "an atomic group (?>...)",
    "(": "a conditional (?(...)...)",
}
_REFUSED_FLAGS = {"m": "MULTILINE", "x": "VERBOSE", "a": "ASCII", "L": "LOCALE"}


@dataclass(frozen=True)
class _Node:
    """A parsed pattern: ``set`` (one character), ``cat``, ``alt``, ``rep`` (min, max), ``assert``."""

    kind: str
    items: tuple[_Node, ...] = ()
    charset: _Set | None = None
    low: int = 0
    high: int | None = 0
    assertion: str = ""


_QUANTIFIER = re.compile(r"\{(\d*)(,?)(\d*)\}")


@dataclass
class _Parser:
    """Recursive descent over Python's regex syntax; ``re.compile`` has already said it is well formed."""

    text: str
    pos: int = 0
    fold: bool = False
    depth: int = 0

    def fail(self, what: str) -> PatternError:
        return PatternError(
            f"{what} at position {self.pos} is not supported: deny patterns are matched in linear time, "
            "without backtracking (see docs/policy.md)"
        )

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def take(self) -> str:
        char = self.peek()
        self.pos += 1
        return char

    def alternation(self) -> _Node:
        branches = [self.sequence()]
        while self.peek() == "|":
            self.pos += 1
            branches.append(self.sequence())
        return branches[0] if len(branches) == 1 else _Node("alt", tuple(branches))

    def sequence(self) -> _Node:
        items: list[_Node] = []
        while self.peek() not in ("", "|", ")"):
            atom = self.atom()
            if atom is not None:
                items.append(self.quantified(atom))
        return items[0] if len(items) == 1 else _Node("cat", tuple(items))

    def quantified(self, atom: _Node) -> _Node:
        bounds = self.quantifier()
        if bounds is None:
            return atom
        if self.peek() == "+":
            raise self.fail("a possessive quantifier")
        if self.peek() == "?":  # lazy: the same answer to "is there a match?"
            self.pos += 1
        return _Node("rep", (atom,), low=bounds[0], high=bounds[1])

    def quantifier(self) -> tuple[int, int | None] | None:
        char = self.peek()
        if char in ("*", "+", "?"):
            self.pos += 1
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[char]
        found = _QUANTIFIER.match(self.text, self.pos) if char == "{" else None
        if found is None or found.group() == "{}":
            return None
        self.pos = found.end()
        low = int(found.group(1) or 0)
        high = None if found.group(2) and not found.group(3) else int(found.group(3) or found.group(1) or 0)
        return low, high

    def atom(self) -> _Node | None:
        char = self.take()
        if char == "(":
            return self.group()
        if char == "[":
            return _Node("set", charset=self.char_class())
        if char == ".":
            return _Node("set", charset=_Set(classes="."))
        if char in "^$":
            return _Node("assert", assertion=_ASSERTIONS[char])
        if char == "\\":
            return self.escape()
        return self.literal(char)

    def literal(self, char: str) -> _Node:
        return _Node("set", charset=_Set(chars=frozenset(char), fold=self.fold))

    def escape(self) -> _Node:
        char = self.peek()
        if char in _ASSERTIONS and char not in "^$":
            self.pos += 1
            return _Node("assert", assertion=_ASSERTIONS[char])
        if char in "dwsDWS":
            self.pos += 1
            return _Node("set", charset=_Set(classes=char))
        return self.literal(self.escaped_char(in_class=False))

    def escaped_char(self, *, in_class: bool) -> str:
        start = self.pos
        char = self.take()
        if char in _ESCAPES:
            return _ESCAPES[char]
        if char == "b" and in_class:
            return "\b"
        if char in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[char]
            self.pos += width
            return chr(int(self.text[start + 1 : self.pos], 16))
        if char == "N":
            end = self.text.index("}", self.pos)
            name, self.pos = self.text[self.pos + 1 : end], end + 1
            return unicodedata.lookup(name)
        if char.isdigit():
            return self.octal(start, in_class=in_class)
        return char  # an escaped punctuation character stands for itself

    def octal(self, start: int, *, in_class: bool) -> str:
        digits = self.text[start : start + 3]
        octal = len(digits) == 3 and all(d in "01234567" for d in digits)
        if self.text[start] == "0" or octal or in_class:
            run = re.match(r"[0-7]{1,3}", self.text[start:])
            assert run is not None
            self.pos = start + len(run.group())
            return chr(int(run.group(), 8))
        self.pos = start
        raise self.fail("a back-reference")

    def char_class(self) -> _Set:
        negated = self.peek() == "^"
        self.pos += negated
        chars: set[str] = set()
        ranges: list[tuple[str, str]] = []
        classes = ""
        first = True
        while first or self.peek() != "]":
            first = False
            if self.text.startswith("\\", self.pos) and self.text[self.pos + 1 : self.pos + 2] in tuple("dwsDWS"):
                classes += self.text[self.pos + 1]
                self.pos += 2
                continue
            low = self.class_char()
            if self.peek() == "-" and self.text[self.pos + 1 : self.pos + 2] not in ("]", ""):
                self.pos += 1
                ranges.append((low, self.class_char()))
            else:
                chars.add(low)
        self.pos += 1
        return _Set(frozenset(chars), tuple(ranges), classes, negated, self.fold)

    def class_char(self) -> str:
        char = self.take()
        return self.escaped_char(in_class=True) if char == "\\" else char

    def group(self) -> _Node | None:
        if self.peek() != "?":
            return self.inner(self.fold)
        self.pos += 1
        kind = self.peek()
        if kind == ":":
            self.pos += 1
            return self.inner(self.fold)
        if kind == "P":
            return self.named_group()
        if kind == "#":
            self.pos = self.text.index(")", self.pos) + 1
            return None
        if kind in _REFUSED_GROUPS:
            raise self.fail(_REFUSED_GROUPS[kind])
        return self.flags()

    def named_group(self) -> _Node:
        if self.text.startswith("P=", self.pos):
            raise self.fail("a back-reference (?P=...)")
        self.pos = self.text.index(">", self.pos) + 1
        return self.inner(self.fold)

    def flags(self) -> _Node | None:
        found = re.match(r"([a-zA-Z]*)(?:-([a-zA-Z]*))?([:)])", self.text[self.pos :])
        assert found is not None
        on, off, end = found.group(1), found.group(2) or "", found.group(3)
        for flag in on + off:
            if flag in _REFUSED_FLAGS:
                raise self.fail(f"the {_REFUSED_FLAGS[flag]} flag ({flag})")
        self.pos += len(found.group())
        fold = (self.fold or "i" in on) and "i" not in off
        if end == ")":  # a global flag, at the start of the pattern
            self.fold = fold
            return None
        return self.inner(fold)

    def inner(self, fold: bool) -> _Node:
        saved, self.fold = self.fold, fold
        self.depth += 1
        if self.depth > 50:
            raise self.fail("nesting more than 50 groups deep")
        node = self.alternation()
        self.depth -= 1
        self.fold = saved
        self.pos += 1  # the closing ')'
        return node


# -- regular expressions: the automaton ---------------------------------------------------------

_UNKNOWN: frozenset[int] = frozenset({-1})
"""A transition not worked out yet (no real set of states holds -1)."""


@dataclass
class _Automaton:
    """A Thompson NFA: per state, a character set to read then go on, or empty moves, or an assertion."""

    sets: list[_Set | None] = field(default_factory=list)
    moves: list[tuple[int, ...]] = field(default_factory=list)
    asserts: list[str] = field(default_factory=list)

    def add(self, charset: _Set | None = None, moves: tuple[int, ...] = (), assertion: str = "") -> int:
        if len(self.sets) >= MAX_STATES:
            raise PatternError(f"the pattern needs more than {MAX_STATES} states; write shorter repetitions")
        self.sets.append(charset)
        self.moves.append(moves)
        self.asserts.append(assertion)
        return len(self.sets) - 1

    def build(self, node: _Node, then: int) -> int:
        """The state that matches ``node`` and goes on to ``then`` (built back to front)."""
        if node.kind == "set":
            return self.add(node.charset, (then,))
        if node.kind == "assert":
            return self.add(moves=(then,), assertion=node.assertion)
        if node.kind == "cat":
            for item in reversed(node.items):
                then = self.build(item, then)
            return then
        if node.kind == "alt":
            return self.add(moves=tuple(self.build(item, then) for item in node.items))
        return self.repeat(node.items[0], node.low, node.high, then)

    def repeat(self, item: _Node, low: int, high: int | None, then: int) -> int:
        if high is None:
            loop = self.add(moves=(then,))
            self.moves[loop] = (self.build(item, loop), then)
            tail = loop
        else:
            tail = then
            for _ in range(high - low):
                tail = self.add(moves=(self.build(item, tail), then))
        for _ in range(low):
            tail = self.build(item, tail)
        return tail


_START, _END, _DOLLAR, _PREV_WORD, _NEXT_WORD, _NONEMPTY = 1, 2, 4, 8, 16, 32


def _holds(assertion: str, context: int) -> bool:
    if assertion == "start":
        return bool(context & _START)
    if assertion == "end":
        return bool(context & _END)
    if assertion == "dollar":
        return bool(context & _DOLLAR)
    boundary = bool(context & _PREV_WORD) != bool(context & _NEXT_WORD)
    return bool(context & _NONEMPTY) and boundary == (assertion == "word")


def _context(text: str, i: int) -> int:
    """Where position ``i`` is, as far as ``^ $ \\A \\Z \\b \\B`` care."""
    n = len(text)
    context = _NONEMPTY if n else 0
    if i == 0:
        context |= _START
    if i == n:
        context |= _END | _DOLLAR
    elif i == n - 1 and text[i] == "\n":
        context |= _DOLLAR
    if i > 0 and _word(text[i - 1]):
        context |= _PREV_WORD
    if i < n and _word(text[i]):
        context |= _NEXT_WORD
    return context


class Regex:
    """A regular expression for ``search``: is there a match anywhere in the text?"""

    def __init__(self, pattern: str) -> None:
        if len(pattern) > MAX_PATTERN:
            raise PatternError(f"the pattern is {len(pattern)} characters; the limit is {MAX_PATTERN}")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise PatternError(f"not a valid regular expression: {exc}") from None
        parser = _Parser(pattern)
        tree = parser.alternation()
        self.pattern = pattern
        self._nfa = _Automaton()
        self._start = self._nfa.build(tree, self._nfa.add())  # state 0 accepts
        self._anchored = any(self._nfa.asserts)
        self._table: dict[tuple[frozenset[int], int, str], frozenset[int] | None] = {}

    @property
    def size(self) -> int:
        return len(self._nfa.sets)

    def search(self, text: str, meter: Meter | None = None) -> bool:
        """Whether the pattern matches somewhere in ``text``: each character is read once."""
        active: frozenset[int] = frozenset()
        table = self._table
        for i, char in enumerate(text):
            context = _context(text, i) if self._anchored else 0
            key = (active, context, char)
            following = table.get(key, _UNKNOWN)
            if following is _UNKNOWN:
                following = self._step(active, context, char, meter)
                if len(table) < _CACHE_LIMIT:
                    table[key] = following
            if following is None:
                return True
            active = following
            if meter is not None:
                meter.spend(1)
        return 0 in self._closure(active, _context(text, len(text)), meter)

    def _step(self, active: frozenset[int], context: int, char: str, meter: Meter | None) -> frozenset[int] | None:
        """The states after reading ``char``; None when a match ends before it."""
        states = self._closure(active, context, meter)
        if 0 in states:
            return None
        sets = self._nfa.sets
        return frozenset(self._nfa.moves[s][0] for s in states if (found := sets[s]) is not None and found.has(char))

    def _closure(self, active: frozenset[int], context: int, meter: Meter | None) -> set[int]:
        """Every state reachable without reading, from ``active`` and from the start (a match may begin anywhere)."""
        nfa = self._nfa
        seen: set[int] = set()
        todo = [self._start, *active]
        while todo:
            state = todo.pop()
            if state in seen:
                continue
            seen.add(state)
            if nfa.sets[state] is not None:
                continue
            if nfa.asserts[state] and not _holds(nfa.asserts[state], context):
                continue
            todo.extend(nfa.moves[state])
        if meter is not None:
            meter.spend(len(seen))
        return seen
