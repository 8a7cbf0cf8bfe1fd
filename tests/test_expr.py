from __future__ import annotations

from typing import Any

import pytest

from plangate import ConditionError
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
