"""The bundled example business: its plans give the documented results and its tools really work."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from plangate import Catalogue, Policy, RunContext, check
from tests.conftest import load_plan


@pytest.mark.parametrize(
    ("name", "user", "expected"),
    [
        ("refund", "alice", []),
        (
            "cleanup",
            "alice",
            [
                (None, "max-external-calls"),
                (1, "tool-not-allowed"),
                (1, "deny:no-destructive-sql-in-production"),
                (3, "resource-conflict"),
            ],
        ),
        (
            "cleanup",
            "bob",
            [(None, "max-external-calls"), (1, "deny:no-destructive-sql-in-production"), (3, "resource-conflict")],
        ),
        (
            "broken",
            "alice",
            [
                (1, "unknown-tool"),
                (2, "ref-forward"),
                (2, "unknown-param"),
                (2, "expected-output"),
                (2, "cycle"),
                (3, "param-type"),
                (4, "ref-path"),
                (4, "condition-syntax"),
                (4, "missing-param"),
            ],
        ),
    ],
)
def test_example_plans(
    catalogue: Catalogue, policy: Policy, name: str, user: str, expected: list[tuple[int | None, str]]
) -> None:
    result = check(load_plan(name), catalogue, policy, user=user)
    assert [(v.step, v.rule) for v in result.violations] == expected


def test_the_refund_plan_needs_a_person_and_the_privacy_officer(catalogue: Catalogue, policy: Policy) -> None:
    decision = check(load_plan("refund"), catalogue, policy, user="alice").decision
    assert decision is not None
    assert decision.approval == "human" and decision.required_approvals == ("privacy-officer",)
    assert decision.policy_hash == policy.hash and decision.role == "support"


def test_the_business_tools_work_and_count_their_effects(catalogue: Catalogue) -> None:
    from examples import business

    invoice = catalogue["get_invoice"](invoice_id="42")
    assert invoice.total == 120.0 and invoice.customer_id == "c-7"
    assert catalogue["lookup_customer"](customer_id="c-7")["email"] == "ada@example.com"
    ctx = RunContext(plan_id="0b5c3c1e-0000-4000-8000-000000000001", step_id=3, now=datetime(2026, 11, 29, tzinfo=UTC))
    first = catalogue["issue_refund"](invoice_id="42", amount=20.0, ctx=ctx)
    again = catalogue["issue_refund"](invoice_id="42", amount=20.0, ctx=ctx)
    assert first == again, "the same idempotency key refunds once"
    catalogue["void_refund"](refund_id=first.refund_id)
    catalogue["void_refund"](refund_id=first.refund_id)
    assert catalogue["send_email"](to="ada@example.com", subject="s", body="b").startswith("message-")
    assert business.effect_counts() == {"refund": 1, "void": 1, "email": 1}
    with pytest.raises(ValueError, match="not between 0 and the invoice total"):
        catalogue["issue_refund"](
            invoice_id="43", amount=1000.0, ctx=ctx.__class__(plan_id="p", step_id=1, now=ctx.now)
        )
    with pytest.raises(LookupError, match="no invoice '99'"):
        catalogue["get_invoice"](invoice_id="99")
