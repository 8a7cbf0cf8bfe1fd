"""Attacks on the provenance of values: an attacker who writes what an untrusted tool returns tries to reach a sink."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue, Plan, check, tool
from plangate._decide import decide
from plangate.errors import GovernanceError
from plangate.provenance import analyse
from plangate.runtime import Runtime
from tests.helpers import FixedClock, plan
from tests.test_provenance import CAT, READ, policy

DENY_PAY = "  - {name: pay, tools: [pay_bill], params: [iban], untrusted: deny, control: true}\n"


@tool(effect="irreversible", external=True)
def pay_many(payments: list[dict[str, Any]]) -> str:
    """Pay several bills at once."""
    return f"paid {len(payments)}"


WIDE = Catalogue([*CAT, pay_many])


def rules(body: dict[str, Any], sinks: str = DENY_PAY, catalogue: Catalogue = CAT) -> list[str]:
    return [v.rule for v in check(body, catalogue, policy(sinks)).violations]


def test_a_reference_deep_inside_a_parameter_is_caught() -> None:
    nested = {"payments": [{"to": {"iban": "${1.iban}"}, "amount": 1}]}
    body = plan(READ, {"id": 2, "tool": "pay_many", "params": nested})
    assert rules(body, "  - {name: pay, tools: [pay_many], untrusted: deny}\n", WIDE) == ["sink:pay"]


def test_a_reference_written_as_a_dictionary_key_stays_plan_text() -> None:
    keyed = {"payments": [{"${1.iban}": 1}]}
    body = plan(READ, {"id": 2, "tool": "pay_many", "params": keyed})
    step = Plan.parse(body).steps[1]
    made = decide(step, pay_many, None, {1: {"iban": "XX00 ATTACKER"}}, ())
    assert made.params == keyed  # the key is not resolved: the attacker's value never reaches the call


def test_a_field_path_interpolated_into_text_is_caught() -> None:
    body = plan(READ, {"id": 2, "tool": "pay_bill", "params": {"iban": "DE${1.iban}", "amount": 1}})
    assert rules(body) == ["sink:pay"]


def test_a_whole_output_with_a_nested_untrusted_field_is_caught() -> None:
    body = plan(READ, {"id": 2, "tool": "pay_many", "params": {"payments": ["${1}"]}})
    assert rules(body, "  - {name: pay, tools: [pay_many], untrusted: deny}\n", WIDE) == ["sink:pay"]


def test_an_extract_of_an_extract_is_still_untrusted() -> None:
    body = plan(
        READ,
        {"id": 2, "tool": "extract_iban", "params": {"text": "${1.iban}"}},
        {"id": 3, "tool": "extract_iban", "params": {"text": "${2}"}},
        {"id": 4, "tool": "pay_bill", "params": {"iban": "${3}", "amount": 1}},
    )
    assert rules(body) == ["sink:pay"]


def test_a_condition_choosing_between_two_literal_recipients_is_reported_and_held_by_control_rules() -> None:
    body = plan(
        READ,
        {"id": 2, "tool": "pay_bill", "params": {"iban": "XX00 A", "amount": 1}, "condition": "${1.payee} == 'a'"},
        {"id": 3, "tool": "pay_bill", "params": {"iban": "XX00 B", "amount": 1}, "condition": "${1.payee} != 'a'"},
    )
    found = analyse(Plan.parse(body), CAT)
    assert [o.source for o in found.of(2).untrusted_control] == ["step:1"]  # type: ignore[union-attr]
    assert rules(body) == ["sink:pay", "sink:pay"]
    held = check(body, CAT, policy())
    assert held.ok and held.decision.approval == "human"  # type: ignore[union-attr]


def test_a_step_that_reads_a_conditional_step_is_control_dependent_too() -> None:
    # step 3 runs only when step 2 ran, and step 2 runs only when the bill says so
    body = plan(
        READ,
        {"id": 2, "tool": "payee_iban", "params": {"payee": "Mallory"}, "condition": "${1.payee} == 'Mallory'"},
        {"id": 3, "tool": "pay_bill", "params": {"iban": "${2}", "amount": 1}},
    )
    found = analyse(Plan.parse(body), CAT)
    assert [o.source for o in found.of(3).untrusted_control] == ["step:1"]  # type: ignore[union-attr]
    assert rules(body) == ["sink:pay"]
    message = check(body, CAT, policy(DENY_PAY)).violations[0].message
    assert message == (
        "step 3 (pay_bill) parameter 'iban' takes data from step 1 (untrusted: read_bill)"
        " through whether it runs (it reads a step whose condition does)"
    )


def test_a_policy_that_marks_a_tool_untrusted_is_believed_by_the_check() -> None:
    body = plan(
        {"id": 1, "tool": "payee_iban", "params": {"payee": "p"}},
        {"id": 2, "tool": "pay_bill", "params": {"iban": "${1}", "amount": 1}},
    )
    assert rules(body) == []
    marked = policy(DENY_PAY, "tools:\n  payee_iban: {untrusted_output: true}\n")
    assert [v.rule for v in check(body, CAT, marked).violations] == ["sink:pay"]
    trusted = policy(DENY_PAY, "tools:\n  read_bill: {untrusted_output: false}\n")  # the policy's own word
    assert check(PAY_FROM_BILL, CAT, trusted).ok


PAY_FROM_BILL = plan(READ, {"id": 2, "tool": "pay_bill", "params": {"iban": "${1.iban}", "amount": 1}})


def test_a_null_guard_after_a_failed_untrusted_read_is_control_dependent() -> None:
    body = plan(
        {**READ, "on_failure": "continue"},
        {"id": 2, "tool": "pay_bill", "params": {"iban": "XX00 B", "amount": 1}, "condition": "${1} == null"},
    )
    assert rules(body) == ["sink:pay"]


def test_the_run_time_check_refuses_a_transitively_conditional_payment() -> None:
    body = plan(
        READ,
        {"id": 2, "tool": "payee_iban", "params": {"payee": "Mallory"}, "condition": "${1.payee} == 'Mallory'"},
        {"id": 3, "tool": "pay_bill", "params": {"iban": "${2}", "amount": 1}},
    )
    parsed = Plan.parse(body)
    flow = analyse(parsed, CAT).of(3)
    outputs = {1: {"payee": "Mallory", "iban": "x", "amount": 1.0}, 2: "XX00 ONFILE"}
    made = decide(parsed.steps[2], CAT["pay_bill"], policy(DENY_PAY), outputs, (), flow=flow)
    assert made.action == "fail" and made.violation is not None and made.violation.rule == "sink:pay"
    # the call refuses only a deny rule: an approval rule was the check's to ask for
    assert decide(parsed.steps[2], CAT["pay_bill"], policy(), outputs, (), flow=flow).action == "start"


def runtime(tmp_path: Path, sinks: str = "") -> Runtime:
    db = f"sqlite:///{tmp_path}/attack.db"
    return Runtime(CAT, policy(sinks), db=db, clock=FixedClock(), tools="tests.test_provenance")


def test_an_edit_that_swaps_a_literal_for_a_reference_after_approval_is_checked_again(tmp_path: Path) -> None:
    rt = runtime(tmp_path, DENY_PAY)
    literal = plan(READ, {"id": 2, "tool": "pay_bill", "params": {"iban": "XX00 ONFILE", "amount": 1}})
    record = rt.submit(literal, "ann")
    rt.approve(record.id, "ben", record.hash)
    edited = rt.edit(record.id, PAY_FROM_BILL, "ann")
    assert edited.status == "rejected" and edited.hash != record.hash
    assert [v.rule for v in edited.violations] == ["sink:pay"]


def test_a_run_under_a_policy_with_a_new_deny_sink_refuses_the_call(tmp_path: Path) -> None:
    rt = runtime(tmp_path)  # checked and approved with no sink rules: the default asks a person
    record = rt.submit(PAY_FROM_BILL, "ann")
    rt.approve(record.id, "ben", record.hash)
    rt.close()
    strict = Runtime(CAT, policy(DENY_PAY), db=rt.store.url, clock=FixedClock(), tools="tests.test_provenance")
    with pytest.raises(GovernanceError, match=r"the policy changed since v1 was checked.*sink:pay"):
        strict.execute(record.id)
    assert not [e for e in strict.store.events(record.id) if e.kind == "step.started"]


def test_the_default_rule_shows_control_dependence_but_holds_only_data_as_documented() -> None:
    cleared = "approval: {auto: [ops]}\ncategories: {ops: {tools: [read_bill, send_email]}}\n"
    chosen = {"id": 2, "tool": "send_email", "params": {"to": "a@x", "body": "hi"}, "condition": "${1.payee} == 'a'"}
    body = plan(READ, chosen)
    body["category"] = "ops"
    result = check(body, CAT, policy("", cleared))
    assert result.ok and result.decision.approval == "auto"  # type: ignore[union-attr]
    assert result.provenance.to_dict()["2"]["control"] == [{"step": 1, "tool": "read_bill", "untrusted": True}]
    held = check(body, CAT, policy("  - {name: mail, tools: [send_email], control: true}\n", cleared))
    assert [v.rule for v in held.violations] == ["sink:mail", "sink:mail"]  # to and body
