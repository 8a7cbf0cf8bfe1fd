"""Attacks on the provenance of values: an attacker who writes what an untrusted tool returns tries to reach a sink."""

from __future__ import annotations

from typing import Any

from plangate import Catalogue, Plan, check, tool
from plangate._decide import decide
from plangate.provenance import analyse
from tests.helpers import plan
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
