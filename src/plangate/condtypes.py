"""A condition's types, worked out before it runs: `${2.restarts} > "1"` is refused by the checker.

Types are JSON types (:mod:`plangate._jsontypes`), as the checker knows them for each
reference; an unknown type (``None``) could be anything and is never refused. A condition
is refused only when no values of the types it reads could make it work: a comparison of a
number with a string, arithmetic on text, ``and`` over a number, a result that cannot be
true or false. At run time the same rules hold (:mod:`plangate.expr`), so a plan that
passes here fails there only on a value its output schema did not rule out.
"""

from __future__ import annotations

from collections.abc import Callable

from plangate._jsontypes import Types, describe, value_type
from plangate.expr import Binary, ListNode, Literal, Node, RefNode, Unary
from plangate.references import Ref

NUMBERS = frozenset({"number", "integer"})
TEXT = frozenset({"string"})
BOOLEAN = frozenset({"boolean"})
CONTAINERS = frozenset({"array", "string", "object"})
_LITERAL_TYPES = {kind: frozenset({kind}) for kind in ("string", "number", "integer", "boolean", "null")}


class ConditionTypeError(Exception):
    """What no values of these types could make work, in plain words."""


def problem(tree: Node, types_of: Callable[[Ref], Types]) -> str | None:
    """Why the condition cannot work whatever the values of its types, or None if it may."""
    try:
        result = _infer(tree, types_of)
        if not _may_be(result, BOOLEAN):
            raise ConditionTypeError(f"it gives {describe(result)}, never true or false")
    except ConditionTypeError as exc:
        return str(exc)
    return None


def _may_be(types: Types, wanted: frozenset[str]) -> bool:
    if types is None:
        return True
    return bool(types & wanted) or ("integer" in types and "number" in wanted)


def _infer(node: Node, types_of: Callable[[Ref], Types]) -> Types:
    if isinstance(node, Literal):
        named = value_type(node.value)
        return _LITERAL_TYPES.get(named) or frozenset({named})
    if isinstance(node, RefNode):
        return types_of(node.ref)
    if isinstance(node, ListNode):
        for item in node.items:
            _infer(item, types_of)
        return frozenset({"array"})
    if isinstance(node, Unary):
        operand = _infer(node.operand, types_of)
        wanted = BOOLEAN if node.op == "not" else NUMBERS
        if not _may_be(operand, wanted):
            raise ConditionTypeError(f"'{node.op}' takes {describe(wanted)}, not {describe(operand)}")
        return wanted if node.op == "not" else (operand & NUMBERS if operand is not None else NUMBERS)
    return _binary(node, _infer(node.left, types_of), _infer(node.right, types_of))


def _binary(node: Binary, left: Types, right: Types) -> Types:
    op = node.op
    if op in ("and", "or"):
        for side in (left, right):
            if not _may_be(side, BOOLEAN):
                raise ConditionTypeError(f"'{op}' takes true or false, not {describe(side)}")
        return BOOLEAN
    if op in ("==", "!="):
        return BOOLEAN
    if op in ("in", "not in"):
        return _membership(op, left, right)
    return _arithmetic(op, left, right)


def _membership(op: str, left: Types, right: Types) -> Types:
    if not _may_be(right, CONTAINERS):
        raise ConditionTypeError(f"'{op}' needs a list, string or object on its right, not {describe(right)}")
    if right == TEXT and not _may_be(left, TEXT):
        raise ConditionTypeError(f"'{op}' on a string needs a string on its left, not {describe(left)}")
    return BOOLEAN


def _arithmetic(op: str, left: Types, right: Types) -> Types:
    """Comparisons and arithmetic: numbers with numbers, or strings with strings (``+`` and comparisons)."""
    numbers = _may_be(left, NUMBERS) and _may_be(right, NUMBERS)
    text = _may_be(left, TEXT) and _may_be(right, TEXT)
    if op in ("<", "<=", ">", ">="):
        if not (numbers or text):
            raise ConditionTypeError(
                f"cannot compare {describe(left)} {op} {describe(right)}: compare numbers or strings"
            )
        return BOOLEAN
    if op == "+" and text:
        return TEXT | NUMBERS if numbers else TEXT
    if not numbers:
        raise ConditionTypeError(f"cannot compute {describe(left)} {op} {describe(right)}: both sides must be numbers")
    return NUMBERS


def not_null(tree: Node) -> frozenset[int]:
    """The steps whose output the condition, when true, shows is not null.

    A conjunct ``${N} != null`` (or ``${N.field} != null``: every field of a null output
    is null) at the top of the condition's ``and`` chain guards step N: the step under
    that condition runs only when step N gave a value.
    """
    if isinstance(tree, Binary) and tree.op == "and":
        return not_null(tree.left) | not_null(tree.right)
    if isinstance(tree, Binary) and tree.op == "!=":
        for ref_side, other in ((tree.left, tree.right), (tree.right, tree.left)):
            if isinstance(ref_side, RefNode) and isinstance(other, Literal) and other.value is None:
                return frozenset({ref_side.ref.step})
    return frozenset()


def value_reads(tree: Node, guarded: frozenset[int] = frozenset()) -> frozenset[Ref]:
    """The references the condition reads as values where they may be null: all but those it only
    tests for null, and those of steps an earlier operand of ``and`` or ``or`` shows are not null.

    With a null in place of a value, a test against anything else may come out true
    (``null != "blocked"``, ``null not in [...]``, ``not (null == 1)``): only ``== null`` and
    ``!= null`` say plainly what a null does. ``guarded``: steps already shown not null.
    """
    if isinstance(tree, RefNode):
        return frozenset() if tree.ref.step in guarded else frozenset({tree.ref})
    if isinstance(tree, Unary):
        return value_reads(tree.operand, guarded)
    if isinstance(tree, ListNode):
        return frozenset().union(*(value_reads(item, guarded) for item in tree.items))
    if not isinstance(tree, Binary) or _null_test(tree, "==") or _null_test(tree, "!="):
        return frozenset()
    left = value_reads(tree.left, guarded)
    if tree.op == "and":  # the right is read only when the left is true
        return left | value_reads(tree.right, guarded | not_null(tree.left))
    if tree.op == "or":  # ... only when the left is false
        return left | value_reads(tree.right, guarded | _not_null_if_false(tree.left))
    return left | value_reads(tree.right, guarded)


def _not_null_if_false(tree: Node) -> frozenset[int]:
    """The steps whose output the condition, when false, shows is not null (``${N} == null or ...``)."""
    if isinstance(tree, Binary) and tree.op == "or":
        return _not_null_if_false(tree.left) | _not_null_if_false(tree.right)
    if isinstance(tree, Binary) and _null_test(tree, "=="):
        return frozenset(side.ref.step for side in (tree.left, tree.right) if isinstance(side, RefNode))
    return frozenset()


def _null_test(tree: Binary, op: str) -> bool:
    return tree.op == op and any(
        isinstance(ref_side, RefNode) and isinstance(other, Literal) and other.value is None
        for ref_side, other in ((tree.left, tree.right), (tree.right, tree.left))
    )
