from __future__ import annotations

import inspect
import random
import sys
from typing import Any

import pytest

from plangate import ConditionError, expr
from plangate.expr import MAX_LENGTH, parse
from plangate.references import Ref, lookup

OUTPUTS: dict[int, Any] = {1: {"total": 120.0, "status": "paid", "tags": ["vip"], "n": 3}, 2: True}


def run(source: str) -> bool:
    return parse(source).evaluate(lambda ref: lookup(ref, OUTPUTS))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("${1.total} > 100", True),
        ("${1.total} > 100 and ${1.status} == 'paid'", True),
        ('${1.status} != "paid" or not ${2}', False),
        ("'vip' in ${1.tags}", True),
        ("'x' not in ${1.tags}", True),
        ("${1.n} * 2 + 1 == 7", True),
        ("-${1.n} < 0", True),
        ("${1.total} / 4 >= 30 and ${1.n} % 2 == 1", True),
        ("(${1.n} - 1) * 2 == 4", True),
        ("${1.status} in ['paid', 'open']", True),
        ("null == null", True),
        ("1 == true", False),
        ("'pa' + 'id' == ${1.status}", True),
        ("1.5e2 > ${1.total}", True),
    ],
)
def test_evaluates(source: str, expected: bool) -> None:
    assert run(source) is expected


def test_whitespace_anywhere_is_only_a_separator() -> None:
    assert run(" \t${1.total}\n>\r\n10  ") is True
    assert parse("  ${1.total}  >  10  ").tree == parse("${1.total}>10").tree


def test_references_are_collected() -> None:
    assert parse("${1.total} > ${2} and ${3.a.b} == 1").refs == (Ref(1, ("total",)), Ref(2, ()), Ref(3, ("a", "b")))


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("${1.total} >", "column 13: expected a value"),
        ("${1.total} >   ", "column 16: expected a value"),  # the end: after the whitespace
        ("  ${1.total} ># 2", "column 15: unexpected character '#'"),  # columns count the leading whitespace
        ("\t${1.total}\n>\n\n  open", "column 18: unknown name 'open'"),
        ("   ", "column 4: expected a value"),
        ("__import__('os')", "unknown name '__import__'"),
        ("${1}.__class__", "unexpected character '.'"),
        ("open('x')", "unknown name 'open'"),
        ("1 +", "expected a value"),
        ("(1 == 1", r"expected '\)'"),
        ("${1.} == 1", "malformed reference"),
        ("'unterminated", "unexpected character"),
        ("1 == 1 2", "expected the end"),
        ("'a\\q'", "unknown escape"),
        ("x" * (MAX_LENGTH + 1), "limit is"),
        ("(" * 40 + "1" + ")" * 40, "nested deeper"),
        ("not " * 40 + "true", "nested deeper"),
        ("-" * 40 + "1", "nested deeper"),
        # Other scripts' digits are numbers to Python (Bengali's four, like an 8, is 4): a reviewer reading
        # "> 800" would approve "> 400", so numbers are written in 0-9 alone, whatever the path that parses them.
        ("${1.total} > \u09ea00", "unexpected character '\u09ea'"),
        ("${1.total} > 1\u0660\u0660", "unexpected character '\u0660'"),
        ("${1.total} > \uff18", "unexpected character '\uff18'"),
        ("'paid' == ${1.status} and ${1.total} > \u0668", "unexpected character '\u0668'"),
    ],
)
def test_refuses_what_does_not_parse(source: str, message: str) -> None:
    with pytest.raises(ConditionError, match=message):
        parse(source)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("${1.total}", "not true or false"),
        ("${1.status} > 1", "cannot compare"),
        ("${1.total} and true", "take true or false"),
        ("${1.total} / 0 > 1", "division by zero"),
        ("${1.status} * 2 == 1", "both sides must be numbers"),
        ("1 in 2", "needs a list"),
        ("-${1.status} == 1", "not a number"),
    ],
)
def test_evaluation_errors_are_condition_errors(source: str, message: str) -> None:
    with pytest.raises(ConditionError, match=message):
        run(source)


# -- conditions that differ only in literals share one parsed shape ------------------------------------


def _outcome(parse_one: Any, source: str) -> tuple[Any, ...]:
    try:
        condition = parse_one(source)
    except ConditionError as exc:
        return ("refused", str(exc), exc.column)
    return ("parsed", condition.source, condition.tree, condition.refs)


_PIECES = [
    *("${1}", "${1.total}", "${2.a.b}", "${x}", "${", "}", "$", "$${"),
    *("1", "0", "007", "1.5", "2e3", "1e+5", "1e-5", "1.", ".5", "1.2.3", "٣", "１", "²", "e-", "E+", "e", "x1"),
    *('"a"', "'b'", '"a\\"b"', '"\\n"', '"\\q"', '""', "'", '"', "é", "@", ".", "_a", "x"),
    *("and", "or", "not", "in", "true", "false", "null", "==", "!=", "<", "<=", ">", ">=", "+", "-", "*", "/", "%"),
    *("(", ")", "[", "]", ",", " ", "  ", "\t", "\n", "\u00a0"),
]


def _soup(rng: random.Random) -> str:
    return "".join(rng.choice(_PIECES) + rng.choice(("", " ")) for _ in range(rng.randint(1, 9)))


def _condition(rng: random.Random, depth: int = 0) -> str:
    def atom(depth: int) -> str:
        roll = rng.random()
        if depth > 3 or roll < 0.5:
            literals = [
                *("${1}", "${1.total}", "${2.a.b}", "true", "false", "null", "'q\\n'", '"a\\\\b"'),
                str(rng.randint(0, 10**6)),
                repr(rng.random() * 1000),
                f"{rng.randint(1, 9)}e{rng.randint(-5, 5)}",
                f'"s{rng.randint(0, 99)}"',
            ]
            return rng.choice(literals)
        if roll < 0.65:
            return f"({_condition(rng, depth + 1)})"
        if roll < 0.75:
            return "[" + ", ".join(_condition(rng, depth + 1) for _ in range(rng.randint(0, 3))) + "]"
        if roll < 0.85:
            return rng.choice(("-", "not ")) + atom(depth + 1)
        return atom(depth + 1)

    text = atom(depth)
    for _ in range(rng.randint(0, 2)):
        ops = ("==", "!=", "<", "<=", ">", ">=", "in", "not in", "+", "-", "*", "/", "%", "and", "or")
        text += rng.choice((" ", "")) + f" {rng.choice(ops)} " + atom(depth)
    return text


def test_a_condition_parsed_through_its_shape_is_exactly_what_its_own_parse_gives() -> None:
    """Differential: the parse through the shared shape against the condition's own parse, token by
    token, for token soups (numbers cut short, exponents, stray quotes, Unicode digits) and for
    well-formed conditions: the same tree and references, or the same refusal at the same column."""
    rng = random.Random(16)
    crafted = [
        *("1e+51.5", "1e+52e3 > 1", "1e-5 > 2", "true-5 > 3", "x1 > 2", "1.2.3 > 0", "1..2 > 3", "2 > 1."),
        "'a' > 1e5x",
        *('"a"5 == 1', "'a''b' == 1", '" "a" == 1', '${1.s} == "a\\q"', '${1} in [1, "x", 2.5e-3]', "٣ > ١"),
        *("-5 < ${1.a}", "${1}-5 > 0", '${1} == "${2}"', "[${1}, 2]", "not not 0", "(((1)))", "1 < 2 < 3"),
        *('${"} == 1', "${'} == 'a'", "${a}b} == 1", "$${1} == 1", "'${1}' == 1", "'a\\\\' == 1", "'a\\' == 1"),
        *("1\u00a0==\u20282", "1 not 'in' [2]", "١e٥ == 1", "1e400 == -0", "0.0 == 0 == true", "[1, 1.0, true]"),
    ]
    sources = crafted + [_soup(rng) for _ in range(20_000)] + [_condition(rng) for _ in range(10_000)]
    shaped = 0
    for source in sources:
        # by repr: the types too (a Literal(1) is equal to a Literal(1.0) and a Literal(True), but not the same)
        assert repr(_outcome(expr._parse, source)) == repr(_outcome(expr.parse.__wrapped__, source)), source
        shaped += expr._shaped(source) is not None
    assert shaped > 5_000  # the shapes were really used, not only the condition's own parse


def test_a_long_chain_of_operators_parses_through_its_shape_with_little_stack_left() -> None:
    """Filling a shape in recurses once per operator of a chain (0+0+...+0: 499 deep), where the
    condition's own parse loops over the chain: with less stack left than the chain is long, the
    condition's own parse decides, rather than a RecursionError that its own parse never raises."""
    source = "0" + "+0" * 499
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack(0)) + 200)
    try:
        shaped = _outcome(expr.parse.__wrapped__, source)
    finally:
        sys.setrecursionlimit(limit)
    assert shaped == _outcome(expr._parse, source)


def test_conditions_that_differ_only_in_literals_share_one_shape() -> None:
    first = parse("${1.total} > 120 and ${1.status} == 'paid'")
    second = parse("${1.total} > 7.5 and ${1.status} == 'x'")
    assert first.tree != second.tree and first.refs == second.refs
    assert second.tree.left.right.value == 7.5 and second.tree.right.right.value == "x"  # type: ignore[union-attr]
    assert expr._shape.cache_info().hits >= 1
    # Not through a shape: a number cut short (1.2.3), an exponent's digits, a bad escape: the parse says why.
    for bad, column in (("${1.total} > 1.2.3", 17), ("${1.n} == 1e+5x", 15), ("${1.s} == '\\q'", 11)):
        with pytest.raises(ConditionError) as refused:
            parse(bad)
        assert refused.value.column == column, bad
