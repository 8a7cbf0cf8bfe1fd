from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from plangate import RULES, Catalogue, Plan, check, tool
from tests.conftest import load_plan


class Invoice(BaseModel):
    id: str
    total: float
    count: int
    lines: list[dict[str, str]]
    note: str | None


@tool
def fetch(invoice_id: str) -> Invoice:
    return Invoice(id=invoice_id, total=1.0, count=1, lines=[], note=None)


@tool
def maybe(invoice_id: str) -> Invoice | None:
    return None


@tool
def pay(amount: float, times: int = 1, memo: str = "") -> dict[str, str]:
    return {}


@tool
def label(text: str, tags: list[str] = []) -> str:  # noqa: B006 - a JSON default, never mutated
    return text


@tool
def anything(x: Any) -> Any:
    return x


CAT = Catalogue([fetch, maybe, pay, label, anything])


def plan(*steps: dict[str, Any]) -> dict[str, Any]:
    full = [{"rationale": "because", **s} for s in steps]
    return {"task": "t", "category": "c", "steps": full}


def rules(result: Any) -> list[tuple[int | None, str]]:
    return [(v.step, v.rule) for v in result.violations]


def test_a_clean_plan_with_typed_references() -> None:
    result = check(
        plan(
            {"id": 1, "tool": "fetch", "params": {"invoice_id": "42"}, "expected_output": "object"},
            {"id": 2, "tool": "pay", "params": {"amount": "${1.total}", "times": "${1.count}", "memo": "inv ${1.id}"}},
            {"id": 3, "tool": "pay", "params": {"amount": "${1.count}"}, "condition": "${1.total} > 100"},
            {"id": 4, "tool": "label", "params": {"text": "${1.lines.0.sku}", "tags": ["${1.id}", "x"]}},
            {"id": 5, "tool": "anything", "params": {"x": "${4}"}, "expected_output": "string|null"},
            {"id": 6, "tool": "label", "params": {"text": "${5.whatever.goes}"}, "rollback": "undo ${6} after ${1}"},
        ),
        CAT,
    )
    assert result.ok, [str(v) for v in result.violations]
    assert result.decision is None and result.plan_hash is not None


def test_every_rule_reports_at_once() -> None:
    result = check(
        plan(
            {"id": 1, "tool": "fetch", "params": {"invoice_id": "42"}},
            {"id": 1, "tool": "fetch", "params": {"invoice_id": "43"}},
            {"id": 2, "tool": "fecth", "params": {}},
            {"id": 3, "tool": "pay", "params": {"times": "two", "extra": 1}},
            {"id": 4, "tool": "pay", "params": {"amount": "${1.id}", "memo": "${1.nope}"}},
            {"id": 5, "tool": "pay", "params": {"amount": "${4}", "times": "${99}", "memo": "${5}"}},
            {"id": 6, "tool": "pay", "params": {"amount": "${7.total}"}, "expected_output": "string"},
            {"id": 7, "tool": "pay", "params": {"amount": "${6.x}", "memo": "${oops}"}, "condition": "${1.total} >>"},
            {"id": 8, "tool": "pay", "params": {"amount": "${1.total} EUR"}},
            {"id": 9, "tool": "fetch", "params": {"invoice_id": "${8}"}, "rollback": "see ${10}"},
        ),
        CAT,
    )
    found = rules(result)
    assert found == [
        (1, "duplicate-step-id"),
        (2, "unknown-tool"),
        (3, "missing-param"),
        (3, "unknown-param"),
        (3, "param-type"),
        (4, "ref-type"),
        (4, "ref-path"),
        (5, "ref-type"),
        (5, "ref-missing-step"),
        (5, "ref-self"),
        (6, "ref-forward"),
        (6, "expected-output"),
        (6, "cycle"),
        (7, "ref-syntax"),
        (7, "ref-type"),
        (7, "condition-syntax"),
        (8, "param-type"),
        (9, "ref-type"),
        (9, "ref-missing-step"),
    ]
    assert {rule for _, rule in found} <= set(RULES)
    messages = {(v.step, v.rule): v.message for v in result.violations}
    assert "did you mean 'fetch'?" in messages[(2, "unknown-tool")]
    assert messages[(4, "ref-type")] == "param 'amount' takes number, but ${1.id} is string"
    assert "has no field 'nope'" in messages[(4, "ref-path")]
    assert messages[(6, "cycle")] == "steps depend on each other in a circle: 6 -> 7 -> 6"
    assert "value is text with ${1.total} inside" in messages[(8, "param-type")]
    assert messages[(9, "ref-type")] == "param 'invoice_id' takes string, but ${8} is object"


def test_integer_output_feeds_a_number_but_not_the_reverse() -> None:
    ok = check(
        plan(
            {"id": 1, "tool": "fetch", "params": {"invoice_id": "1"}},
            {"id": 2, "tool": "pay", "params": {"amount": "${1.count}", "times": "${1.total}"}},
        ),
        CAT,
    )
    assert rules(ok) == [(2, "ref-type")]
    assert "takes integer, but ${1.total} is number" in ok.violations[0].message


def test_nullable_outputs_are_caught() -> None:
    result = check(
        plan(
            {"id": 1, "tool": "maybe", "params": {"invoice_id": "1"}},
            {"id": 2, "tool": "pay", "params": {"amount": "${1.total}"}},
            {"id": 3, "tool": "fetch", "params": {"invoice_id": "1"}},
            {"id": 4, "tool": "label", "params": {"text": "${3.note}"}},
        ),
        CAT,
    )
    assert rules(result) == [(2, "ref-path"), (4, "ref-type")]
    assert "may lack 'total': in one of its forms it is null" in result.violations[0].message
    assert "takes string, but ${3.note} is null or string" in result.violations[1].message


def test_list_paths_need_indices() -> None:
    result = check(
        plan(
            {"id": 1, "tool": "fetch", "params": {"invoice_id": "1"}},
            {"id": 2, "tool": "label", "params": {"text": "${1.lines.first}"}},
        ),
        CAT,
    )
    assert rules(result) == [(2, "ref-path")]
    assert "is a list: use an index" in result.violations[0].message


def test_references_in_conditions_are_checked() -> None:
    result = check(
        plan(
            {"id": 1, "tool": "fetch", "params": {"invoice_id": "1"}},
            {"id": 2, "tool": "label", "params": {"text": "x"}, "condition": "${1.totl} > 1 and ${3} == 1"},
            {"id": 3, "tool": "label", "params": {"text": "y"}},
        ),
        CAT,
    )
    assert rules(result) == [(2, "ref-path"), (2, "ref-forward")]


def test_unreadable_input_becomes_plan_schema_violations() -> None:
    assert rules(check("{nope", CAT)) == [(None, "plan-schema")]
    result = check({"task": "t", "category": "c", "steps": [{"id": 4, "tool": "fetch"}]}, CAT)
    assert rules(result) == [(4, "plan-schema")]
    assert result.plan_hash is None and not result.ok


def test_accepts_a_plan_object_text_or_dict() -> None:
    data = load_plan("refund")
    cat = Catalogue.from_module("examples/business.py")
    by_model = check(Plan.parse(data), cat)
    assert by_model.ok and by_model.plan_hash == Plan.parse(data).hash
    import json

    assert check(json.dumps(data), cat).plan_hash == by_model.plan_hash
    assert check(data, cat).to_dict()["ok"] is True


@pytest.mark.parametrize(
    ("expected", "ok"),
    [("object", True), ("object|null", True), ("string", False), ("any", True), ("integer|string", False)],
)
def test_expected_output_against_declared_output(expected: str, ok: bool) -> None:
    result = check(plan({"id": 1, "tool": "fetch", "params": {"invoice_id": "1"}, "expected_output": expected}), CAT)
    assert result.ok is ok


@pytest.mark.parametrize(
    ("condition", "why"),
    [
        ('${1.total} > "100"', "cannot compare number > string"),
        ("${1.id} - 1 > 0", "cannot compute string - integer"),
        ("not ${1.total}", "'not' takes boolean, not number"),
        ("${1.total} and true", "'and' takes true or false, not number"),
        ("${1.total} in ${1.id}", "'in' on a string needs a string on its left"),
        ("${1.total} + 1", "it gives integer or number, never true or false"),
    ],
)
def test_condition_types_are_checked_before_anyone_approves(condition: str, why: str) -> None:
    result = check(
        plan(
            {"id": 1, "tool": "fetch", "params": {"invoice_id": "1"}},
            {"id": 2, "tool": "label", "params": {"text": "x"}, "condition": condition},
        ),
        CAT,
    )
    assert rules(result) == [(2, "condition-type")]
    assert why in result.violations[0].message


@pytest.mark.parametrize(
    "condition",
    ["${1.total} > 100", '${1.id} + "x" == "1x"', "'a' in ${1.id}", "${1} != null", "${2} == 1 or ${1.total} >= 1"],
)
def test_conditions_that_can_work_pass(condition: str) -> None:
    steps = [
        {"id": 1, "tool": "fetch", "params": {"invoice_id": "1"}},
        {"id": 2, "tool": "anything", "params": {"x": 1}},
        {"id": 3, "tool": "label", "params": {"text": "x"}, "condition": condition},
    ]
    assert rules(check(plan(*steps), CAT)) == []


@tool(effect="write")
def refund(invoice_id: str) -> str:
    return invoice_id


@tool
def find(email: str) -> str:
    return email


@tool
def note(text: str | None) -> str:
    return text or ""


ORDERED = Catalogue([fetch, pay, label, refund, find, note])


@pytest.mark.parametrize(
    ("after", "why"),
    [
        ([2], "names this step itself"),
        ([9], "names step 9, which does not exist"),
        ([3], "names step 3, which comes later; a step may wait only for steps listed before it"),
        ([1, 1], "names step 1 twice"),
    ],
)
def test_after_names_earlier_steps_only(after: list[int], why: str) -> None:
    result = check(
        plan(
            {"id": 1, "tool": "find", "params": {"email": "a@x"}},
            {"id": 2, "tool": "find", "params": {"email": "b@x"}, "after": after},
            {"id": 3, "tool": "find", "params": {"email": "c@x"}},
        ),
        ORDERED,
    )
    assert rules(result) == [(2, "after-step")]
    assert result.violations[0].message == f"after: {why}"


def test_after_that_closes_a_circle_is_a_cycle() -> None:
    result = check(
        plan(
            {"id": 1, "tool": "find", "params": {"email": "a@x"}, "after": [2]},
            {"id": 2, "tool": "find", "params": {"email": "${1}"}},
        ),
        ORDERED,
    )
    assert rules(result) == [(1, "after-step"), (1, "cycle")]
    assert "1 -> 2 -> 1" in result.violations[1].message


def test_only_reads_may_fail_and_let_the_plan_go_on() -> None:
    result = check(
        plan(
            {"id": 1, "tool": "find", "params": {"email": "a@x"}, "on_failure": "continue"},
            {"id": 2, "tool": "refund", "params": {"invoice_id": "42"}, "on_failure": "continue"},
        ),
        ORDERED,
    )
    assert rules(result) == [(2, "optional-effect")]
    assert "'refund' is a write tool" in result.violations[0].message


def optional_lookup_then(*later: dict[str, Any]) -> Any:
    first = {"id": 1, "tool": "find", "params": {"email": "a@x"}, "on_failure": "continue"}
    return check(plan(first, *later), ORDERED)


def test_an_optional_steps_output_is_nullable_until_a_condition_guards_it() -> None:
    unguarded = optional_lookup_then({"id": 2, "tool": "refund", "params": {"invoice_id": "${1}"}})
    assert rules(unguarded) == [(2, "ref-optional")]
    assert unguarded.violations[0].message == (
        "param 'invoice_id' takes string, but ${1} is null when step 1 fails (its on_failure is 'continue'); "
        "give this step the condition '${1} != null'"
    )
    in_text = optional_lookup_then({"id": 2, "tool": "label", "params": {"text": "found ${1}"}})
    assert rules(in_text) == [(2, "ref-optional")] and "would read 'null' in its text" in in_text.violations[0].message
    for guard in ("${1} != null", "null != ${1}", "${1} != null and 1 < 2"):
        guarded = optional_lookup_then(
            {"id": 2, "tool": "refund", "params": {"invoice_id": "${1}"}, "condition": guard}
        )
        assert guarded.ok, (guard, rules(guarded))
    for not_a_guard in ("${1} != null or 1 < 2", "${1} == null", "not (${1} == null)"):
        loose = optional_lookup_then(
            {"id": 2, "tool": "refund", "params": {"invoice_id": "${1}"}, "condition": not_a_guard}
        )
        assert rules(loose) == [(2, "ref-optional")], not_a_guard
    takes_null = optional_lookup_then({"id": 2, "tool": "note", "params": {"text": "${1}"}})
    assert takes_null.ok, "a parameter that takes null needs no guard"
    fallback = optional_lookup_then({"id": 2, "tool": "find", "params": {"email": "b@x"}, "condition": "${1} == null"})
    assert fallback.ok, "a condition may test the optional step's output for null"


def test_a_condition_that_tests_an_optional_output_against_a_value_must_say_what_null_means() -> None:
    """`null != 'blocked'` is true: a failed lookup must not open a gate by accident."""
    for fails_open in ("${1} != 'blocked'", "${1} not in ['x']", "not (${1} == 'x')", "${1} == null and ${1} > 'a'"):
        loose = optional_lookup_then(
            {"id": 2, "tool": "refund", "params": {"invoice_id": "42"}, "condition": fails_open}
        )
        assert rules(loose) == [(2, "ref-optional")], fails_open
        assert "test it with '${1} == null', or guard it" in loose.violations[0].message
    for says in (
        "${1} == null",
        "${1} != null and ${1} != 'blocked'",
        "${1} != 'blocked' and ${1} != null",
        "${1} == null or ${1} != 'blocked'",
    ):
        clear = optional_lookup_then({"id": 2, "tool": "refund", "params": {"invoice_id": "42"}, "condition": says})
        assert clear.ok, (says, rules(clear))
