"""The condition language: a small, safe expression language over earlier outputs.

A step's ``condition`` decides whether it runs, e.g. ``${1.total} > 100 and not
${2.blocked}``. It is parsed here by a hand-written recursive-descent parser into a tiny
tree and evaluated by walking that tree; Python's ``eval`` is never involved, names
cannot be looked up, and nothing can be called.

Grammar (lowest precedence first)::

    expr  := and ("or" and)*
    and   := not ("and" not)*
    not   := "not" not | cmp
    cmp   := sum [("==" | "!=" | "<" | "<=" | ">" | ">=" | "in" | "not" "in") sum]
    sum   := prod (("+" | "-") prod)*
    prod  := unary (("*" | "/" | "%") unary)*
    unary := "-" unary | atom
    atom  := NUMBER | STRING | "true" | "false" | "null" | REF | "(" expr ")"
           | "[" [expr ("," expr)*] "]"
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from plangate.errors import ConditionError, RefError
from plangate.references import Ref, _parse_body

MAX_LENGTH = 1000
MAX_DEPTH = 32

_TOKENS = re.compile(
    r"""(?P<ws>\s+)
      | (?P<ref>\$\{[^}]*\})
      | (?P<num>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)
      | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<op>==|!=|<=|>=|[<>+\-*/%(),\[\]])
      | (?P<word>[A-Za-z_][A-Za-z0-9_]*)""",
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "not", "in", "true", "false", "null"}
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'"}


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str
    text: str
    col: int


@dataclass(frozen=True, slots=True)
class Literal:
    value: Any


@dataclass(frozen=True, slots=True)
class RefNode:
    ref: Ref


@dataclass(frozen=True, slots=True)
class ListNode:
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Unary:
    op: str
    operand: Node


@dataclass(frozen=True, slots=True)
class Binary:
    op: str
    left: Node
    right: Node


Node = Literal | RefNode | ListNode | Unary | Binary


@dataclass(frozen=True, slots=True)
class Condition:
    """A parsed condition: its source text, its tree and the references it reads."""

    source: str
    tree: Node

    @property
    def refs(self) -> list[Ref]:
        return list(_refs(self.tree))

    def evaluate(self, lookup: Callable[[Ref], Any]) -> bool:
        """Evaluate against outputs; ``lookup`` gives the value a reference points at."""
        value = _eval(self.tree, lookup)
        if not isinstance(value, bool):
            raise ConditionError(f"the condition gave {value!r}, not true or false")
        return value


def parse(source: str) -> Condition:
    """Parse a condition; raises :class:`ConditionError` naming the column at fault."""
    if len(source) > MAX_LENGTH:
        raise ConditionError(f"the condition is {len(source)} characters; the limit is {MAX_LENGTH}")
    parser = _Parser(_tokenize(source))
    tree = parser.expr(0)
    parser.expect_end()
    return Condition(source, tree)


def _tokenize(source: str) -> list[_Tok]:
    tokens: list[_Tok] = []
    pos = 0
    while pos < len(source):
        match = _TOKENS.match(source, pos)
        if match is None:
            raise ConditionError(f"unexpected character {source[pos]!r}", column=pos + 1)
        kind = match.lastgroup or ""
        if kind == "word" and match.group(0) not in _KEYWORDS:
            raise ConditionError(
                f"unknown name {match.group(0)!r}: conditions read step outputs as ${{N.field}}"
                " and know only and, or, not, in, true, false, null",
                column=pos + 1,
            )
        if kind != "ws":
            tokens.append(_Tok(kind, match.group(0), pos + 1))
        pos = match.end()
    tokens.append(_Tok("end", "", len(source) + 1))
    return tokens


class _Parser:
    def __init__(self, tokens: list[_Tok]) -> None:
        self.tokens = tokens
        self.pos = 0

    @property
    def tok(self) -> _Tok:
        return self.tokens[self.pos]

    def take(self, *texts: str) -> _Tok | None:
        tok = self.tok
        if tok.kind in ("op", "word") and tok.text in texts:
            self.pos += 1
            return tok
        return None

    def fail(self, expected: str) -> ConditionError:
        found = "the end" if self.tok.kind == "end" else repr(self.tok.text)
        return ConditionError(f"expected {expected}, found {found}", column=self.tok.col)

    def expect_end(self) -> None:
        if self.tok.kind != "end":
            raise self.fail("the end of the condition")

    def expr(self, depth: int) -> Node:
        if depth > MAX_DEPTH:
            raise ConditionError(f"nested deeper than {MAX_DEPTH} levels", column=self.tok.col)
        node = self.and_(depth)
        while self.take("or"):
            node = Binary("or", node, self.and_(depth))
        return node

    def and_(self, depth: int) -> Node:
        node = self.not_(depth)
        while self.take("and"):
            node = Binary("and", node, self.not_(depth))
        return node

    def not_(self, depth: int) -> Node:
        if self.take("not"):
            if depth > MAX_DEPTH:
                raise ConditionError(f"nested deeper than {MAX_DEPTH} levels", column=self.tok.col)
            return Unary("not", self.not_(depth + 1))
        return self.cmp(depth)

    def cmp(self, depth: int) -> Node:
        left = self.sum(depth)
        op = self.take("==", "!=", "<", "<=", ">", ">=", "in")
        if op is not None:
            return Binary(op.text, left, self.sum(depth))
        if self.tok.text == "not" and self.tokens[self.pos + 1].text == "in":
            self.pos += 2
            return Binary("not in", left, self.sum(depth))
        return left

    def sum(self, depth: int) -> Node:
        node = self.prod(depth)
        while (op := self.take("+", "-")) is not None:
            node = Binary(op.text, node, self.prod(depth))
        return node

    def prod(self, depth: int) -> Node:
        node = self.unary(depth)
        while (op := self.take("*", "/", "%")) is not None:
            node = Binary(op.text, node, self.unary(depth))
        return node

    def unary(self, depth: int) -> Node:
        if self.take("-"):
            if depth > MAX_DEPTH:
                raise ConditionError(f"nested deeper than {MAX_DEPTH} levels", column=self.tok.col)
            return Unary("-", self.unary(depth + 1))
        return self.atom(depth)

    def atom(self, depth: int) -> Node:
        tok = self.tok
        if tok.kind == "num":
            self.pos += 1
            number = float(tok.text)
            return Literal(int(tok.text) if tok.text.isdigit() else number)
        if tok.kind == "str":
            self.pos += 1
            return Literal(_unquote(tok))
        if tok.kind == "ref":
            self.pos += 1
            try:
                return RefNode(_parse_body(tok.text[2:-1]))
            except RefError as exc:
                raise ConditionError(str(exc), column=tok.col) from None
        if tok.kind == "word" and tok.text in ("true", "false", "null"):
            self.pos += 1
            return Literal({"true": True, "false": False, "null": None}[tok.text])
        if self.take("("):
            node = self.expr(depth + 1)
            if not self.take(")"):
                raise self.fail("')'")
            return node
        if self.take("["):
            return self.list_(depth)
        raise self.fail("a value (number, string, true, false, null, ${N.field} or '(')")

    def list_(self, depth: int) -> Node:
        items: list[Node] = []
        if not self.take("]"):
            items.append(self.expr(depth + 1))
            while self.take(","):
                items.append(self.expr(depth + 1))
            if not self.take("]"):
                raise self.fail("',' or ']'")
        return ListNode(tuple(items))


def _unquote(tok: _Tok) -> str:
    body = tok.text[1:-1]
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


def _refs(node: Node) -> Iterator[Ref]:
    if isinstance(node, RefNode):
        yield node.ref
    elif isinstance(node, ListNode):
        for item in node.items:
            yield from _refs(item)
    elif isinstance(node, Unary):
        yield from _refs(node.operand)
    elif isinstance(node, Binary):
        yield from _refs(node.left)
        yield from _refs(node.right)


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
