"""The condition language: a small, safe expression language over earlier outputs.

A step's ``condition`` decides whether it runs, e.g. ``${1.total} > 100 and not
${2.blocked}``. It is parsed here by a hand-written recursive-descent parser into a tiny
tree and evaluated by walking that tree; Python's ``eval`` is never involved, names
cannot be looked up, and nothing can be called.

Grammar (lowest precedence first; comparisons do not chain)::

    expr  := and ("or" and)*
    and   := not ("and" not)*
    not   := "not" not | cmp
    cmp   := sum [("==" | "!=" | "<" | "<=" | ">" | ">=" | "in" | "not" "in") sum]
    sum   := prod (("+" | "-") prod)*
    prod  := unary (("*" | "/" | "%") unary)*
    unary := "-" unary | atom
    atom  := NUMBER | STRING | "true" | "false" | "null" | REF | "(" expr ")"
           | "[" [expr ("," expr)*] "]"

It is parsed by precedence climbing over a table of binding powers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

from plangate.errors import ConditionError, RefError
from plangate.references import Ref, _parse_body

MAX_LENGTH = 1000
MAX_DEPTH = 32

_TOKENS = re.compile(
    r"""\s*(?:(?P<ref>\$\{[^}]*\})
      | (?P<num>[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)  # 0-9 alone: \d takes any script's digits
      | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<op>==|!=|<=|>=|[<>+\-*/%(),\[\]])
      | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<bad>.)
      | \Z)""",
    re.VERBOSE | re.DOTALL,
)
_new_tuple = tuple.__new__
_KEYWORDS = {"and", "or", "not", "in", "true", "false", "null"}
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'"}


class _Tok(NamedTuple):
    kind: str
    text: str
    col: int


class Literal(NamedTuple):
    value: Any


class RefNode(NamedTuple):
    ref: Ref


class ListNode(NamedTuple):
    items: tuple[Node, ...]


class Unary(NamedTuple):
    op: str
    operand: Node


class Binary(NamedTuple):
    op: str
    left: Node
    right: Node


Node = Literal | RefNode | ListNode | Unary | Binary


@dataclass(frozen=True, slots=True)
class Condition:
    """A parsed condition: its source text, its tree and the references it reads."""

    source: str
    tree: Node
    refs: tuple[Ref, ...]

    def evaluate(self, lookup: Callable[[Ref], Any]) -> bool:
        """Evaluate against outputs; ``lookup`` gives the value a reference points at."""
        value = _eval(self.tree, lookup)
        if not isinstance(value, bool):
            raise ConditionError(f"the condition gave {value!r}, not true or false")
        return value


@lru_cache(maxsize=2048)
def parse(source: str) -> Condition:
    """Parse a condition; raises :class:`ConditionError` naming the column at fault.

    Parsed conditions are immutable, so the same text is parsed once and shared; and conditions
    that differ only in their numbers and strings (``${1.total} > 100``, ``> 250``) share one
    parsed shape, whose literals are filled in (:func:`_shaped`).
    """
    if len(source) > MAX_LENGTH:
        raise ConditionError(f"the condition is {len(source)} characters; the limit is {MAX_LENGTH}")
    try:
        shaped = _shaped(source)
    except RecursionError:  # filling a shape in recurses once per operator of a chain (0+0+...+0), where the
        shaped = None  # condition's own parse loops: with less stack left than that, its own parse decides
    return shaped or _parse(source)


def _parse(source: str) -> Condition:
    parser = _Parser(_tokenize(source))
    tree = parser.expr(0, 0)
    parser.expect_end()
    return Condition(source, tree, tuple(parser.refs))


# A condition's literals, found without tokenizing it: references first (their step numbers are not
# literals), then strings, then numbers that no letter, digit, underscore or dot touches, nor an
# exponent's sign (the 5 of 1e-5 is not a token).
_LITERALS_IN = re.compile(
    r"""(\$\{[^}]*\})|("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')|(?<![\w.])(?<![eE][+-])([0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)(?![\w.])""",
    re.DOTALL,
)
_NOT_PLAIN = re.compile(r"[\d\"']")
"""A digit or a quote between the literals found: a number or string not found whole (1.2.3, 1e+5x,
an unclosed quote), so the condition goes through its own parse."""


def _shaped(source: str) -> Condition | None:
    """The condition through the parsed shape it shares with others that differ only in literals; None
    when it has no literal, or when its shape is not sure to be its own (its own parse then decides).

    Each literal found is a whole token of the tokenizer's, and so is what takes its place in the
    shape (``""`` or ``0``): nothing next to it could join it into a longer token, and between the
    literals there is no digit or quote, so every number and string of the shape is a placeholder
    and the shape's tokens are the condition's own but for the literals' text.
    """
    parts = _LITERALS_IN.split(source)  # text, then (ref, string, number) with one of them set, text, ...
    if len(parts) == 1 or _NOT_PLAIN.search("".join(parts[::4])):
        return None
    shape: list[str] = []
    values: list[Any] = []
    try:
        for at in range(0, len(parts) - 1, 4):
            text, ref, string, number = parts[at : at + 4]
            shape.append(text)
            if ref is not None:
                shape.append(ref)
            elif string is not None:
                shape.append('""')
                values.append(_unquote(_Tok("str", string, 0)))
            else:
                shape.append("0")
                values.append(int(number) if number.isdigit() else float(number))
    except ConditionError:  # a bad escape: said, with its column, by the condition's own parse
        return None
    if not values:
        return None
    shape.append(parts[-1])
    parsed = _shape("".join(shape))
    if parsed is None:
        return None
    filling = iter(values)
    try:
        tree = _fill(parsed.tree, filling)
    except StopIteration:  # fewer literals than placeholders: never, by the rules above; the parse decides
        return None
    return Condition(source, tree, parsed.refs) if next(filling, _NOTHING) is _NOTHING else None


_NOTHING = object()


@lru_cache(maxsize=2048)
def _shape(text: str) -> Condition | None:
    try:
        return _parse(text)
    except ConditionError:
        return None


def _fill(node: Node, values: Iterator[Any]) -> Node:
    """``node`` with each literal of the shape (every number and string in it) replaced, in the order
    written, by the condition's own: the tree's children are in the order of the text."""
    kind = type(node)
    if kind is Binary:
        op, left, right = node  # type: ignore[misc]
        return _new_tuple(Binary, (op, _fill(left, values), _fill(right, values)))
    if kind is Literal:
        value = node.value  # type: ignore[union-attr]
        if type(value) is int or type(value) is str:  # a placeholder: true, false and null are not
            return _new_tuple(Literal, (next(values),))
        return node
    if kind is Unary:
        return _new_tuple(Unary, (node.op, _fill(node.operand, values)))  # type: ignore[union-attr]
    if kind is ListNode:
        return _new_tuple(ListNode, (tuple([_fill(item, values) for item in node.items]),))  # type: ignore[union-attr]
    return node  # a reference


def _tokenize(source: str) -> list[_Tok]:
    tokens: list[_Tok] = []
    for match in _TOKENS.finditer(source):  # each match: the whitespace before a token, then the token
        kind = match.lastgroup
        if kind is None:  # the end, after any whitespace
            continue
        start, end = match.span(kind)
        text, column = source[start:end], start + 1
        if kind == "bad":
            raise ConditionError(f"unexpected character {text!r}", column=column)
        if kind == "word" and text not in _KEYWORDS:
            raise ConditionError(
                f"unknown name {text!r}: conditions read step outputs as ${{N.field}}"
                " and know only and, or, not, in, true, false, null",
                column=column,
            )
        tokens.append(_new_tuple(_Tok, (kind, text, column)))  # positionally: cheaper than _Tok(...)
    tokens.append(_Tok("end", "", len(source) + 1))
    return tokens


# Binding power of each binary operator: a precedence-climbing parser needs only this table.
_BINARY = {
    "or": 1,
    "and": 2,
    "==": 4,
    "!=": 4,
    "<": 4,
    "<=": 4,
    ">": 4,
    ">=": 4,
    "in": 4,
    "not in": 4,
    "+": 5,
    "-": 5,
    "*": 6,
    "/": 6,
    "%": 6,
}
_NOT_POWER = 3  # "not" binds looser than comparisons: not a == b is not (a == b)
_COMPARISON = 4
_LITERALS = {"true": True, "false": False, "null": None}


class _Parser:
    def __init__(self, tokens: list[_Tok]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.refs: list[Ref] = []
        """The references read, in the order written (the tree's order, left to right)."""

    def fail(self, expected: str) -> ConditionError:
        tok = self.tokens[self.pos]
        found = "the end" if tok.kind == "end" else repr(tok.text)
        return ConditionError(f"expected {expected}, found {found}", column=tok.col)

    def expect(self, text: str) -> None:
        if self.tokens[self.pos].text != text or self.tokens[self.pos].kind not in ("op", "word"):
            raise self.fail(repr(text))
        self.pos += 1

    def expect_end(self) -> None:
        if self.tokens[self.pos].kind != "end":
            raise self.fail("the end of the condition")

    def expr(self, min_power: int, depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise ConditionError(f"nested deeper than {MAX_DEPTH} levels", column=self.tokens[self.pos].col)
        left = self.prefix(depth)
        tokens = self.tokens
        while True:  # each binary operator, in place: this loop runs once per operator of every condition
            kind, op, _ = tokens[self.pos]
            if kind not in ("op", "word"):
                break
            if op == "not" and tokens[self.pos + 1].text == "in":
                op = "not in"
            power = _BINARY.get(op)
            if power is None or power < min_power:
                break
            self.pos += 2 if op == "not in" else 1
            right = self.expr(power + 1, depth + 1)
            if power == _COMPARISON and isinstance(left, Binary) and _BINARY.get(left.op) == _COMPARISON:
                raise ConditionError(
                    f"comparisons cannot be chained: use 'and' before {op!r}", column=self.tokens[self.pos - 1].col
                )
            left = _new_tuple(Binary, (op, left, right))
        return left

    def prefix(self, depth: int) -> Node:
        tok = self.tokens[self.pos]
        if tok.kind == "word" and tok.text == "not":
            self.pos += 1
            return Unary("not", self.expr(_NOT_POWER, depth + 1))
        if tok.kind == "op" and tok.text == "-":
            self.pos += 1
            if depth > MAX_DEPTH:
                raise ConditionError(f"nested deeper than {MAX_DEPTH} levels", column=tok.col)
            return Unary("-", self.prefix(depth + 1))
        return self.atom(tok, depth)

    def atom(self, tok: _Tok, depth: int) -> Node:
        self.pos += 1
        if tok.kind == "num":
            return _new_tuple(Literal, (int(tok.text) if tok.text.isdigit() else float(tok.text),))
        if tok.kind == "str":
            return _new_tuple(Literal, (_unquote(tok),))
        if tok.kind == "ref":
            try:
                ref = _parse_body(tok.text[2:-1])
            except RefError as exc:
                raise ConditionError(str(exc), column=tok.col) from None
            self.refs.append(ref)
            return _new_tuple(RefNode, (ref,))
        if tok.kind == "word" and tok.text in _LITERALS:
            return Literal(_LITERALS[tok.text])
        if tok.kind == "op" and tok.text == "(":
            node = self.expr(0, depth + 1)
            self.expect(")")
            return node
        if tok.kind == "op" and tok.text == "[":
            return self.list_(depth)
        self.pos -= 1
        raise self.fail("a value (number, string, true, false, null, ${N.field} or '(')")

    def list_(self, depth: int) -> Node:
        items: list[Node] = []
        if self.tokens[self.pos].text != "]":
            items.append(self.expr(0, depth + 1))
            while self.tokens[self.pos].text == "," and self.tokens[self.pos].kind == "op":
                self.pos += 1
                items.append(self.expr(0, depth + 1))
        if self.tokens[self.pos].text != "]" or self.tokens[self.pos].kind != "op":
            raise self.fail("',' or ']'")
        self.pos += 1
        return ListNode(tuple(items))


def _unquote(tok: _Tok) -> str:
    body = tok.text[1:-1]
    if "\\" not in body:
        return body
    out: list[str] = []
    chars = iter(body)
    for ch in chars:
        if ch == "\\":
            nxt = next(chars, "")
            if nxt not in _ESCAPES:
                raise ConditionError(f"unknown escape '\\{nxt}' in string", column=tok.col)
            out.append(_ESCAPES[nxt])
        else:
            out.append(ch)
    return "".join(out)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _eval(node: Node, lookup: Callable[[Ref], Any]) -> Any:
    if isinstance(node, Literal):
        return node.value
    if isinstance(node, RefNode):
        return lookup(node.ref)
    if isinstance(node, ListNode):
        return [_eval(item, lookup) for item in node.items]
    if isinstance(node, Unary):
        value = _eval(node.operand, lookup)
        if node.op == "not":
            return not _truth(value)
        if not _is_number(value):
            raise ConditionError(f"cannot negate {value!r}: it is not a number")
        return -value
    if node.op == "and":
        return _truth(_eval(node.left, lookup)) and _truth(_eval(node.right, lookup))
    if node.op == "or":
        return _truth(_eval(node.left, lookup)) or _truth(_eval(node.right, lookup))
    return _binary(node.op, _eval(node.left, lookup), _eval(node.right, lookup))


def _truth(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConditionError(f"'and', 'or' and 'not' take true or false, not {value!r}")
    return value


def _binary(op: str, left: Any, right: Any) -> Any:
    if op in ("==", "!="):
        equal = left == right and _is_number(left) == _is_number(right)
        return equal if op == "==" else not equal
    if op in ("in", "not in"):
        if not isinstance(right, list | str | dict):
            raise ConditionError(f"'{op}' needs a list, string or object on its right, not {right!r}")
        if isinstance(right, str) and not isinstance(left, str):
            raise ConditionError(f"'{op}' on a string needs a string on its left, not {left!r}")
        return (left in right) == (op == "in")
    if op in ("<", "<=", ">", ">="):
        return _order(op, left, right)
    return _arith(op, left, right)


def _order(op: str, left: Any, right: Any) -> bool:
    both_numbers = _is_number(left) and _is_number(right)
    if not both_numbers and not (isinstance(left, str) and isinstance(right, str)):
        raise ConditionError(f"cannot compare {left!r} {op} {right!r}: compare numbers or strings")
    if op == "<":
        return bool(left < right)
    if op == "<=":
        return bool(left <= right)
    if op == ">":
        return bool(left > right)
    return bool(left >= right)


def _arith(op: str, left: Any, right: Any) -> Any:
    if op == "+" and isinstance(left, str) and isinstance(right, str):
        return left + right
    if not (_is_number(left) and _is_number(right)):
        raise ConditionError(f"cannot compute {left!r} {op} {right!r}: both sides must be numbers")
    if op in ("/", "%") and right == 0:
        raise ConditionError(f"division by zero in {left!r} {op} {right!r}")
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        return left * right
    return left / right if op == "/" else left % right
