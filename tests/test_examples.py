"""The bundled example business: its plans give the documented results and its tools really work."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

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
                (1, "require:read-only-sql-in-production"),
                (3, "resource-conflict"),
            ],
        ),
        (
            "cleanup",
            "bob",
            [(None, "max-external-calls"), (1, "require:read-only-sql-in-production"), (3, "resource-conflict")],
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


def sql_plan(query: str) -> dict[str, object]:
    step = {"id": 1, "tool": "run_sql", "params": {"query": query}, "rationale": "Look at the invoices."}
    return {"task": "Report on invoices", "category": "maintenance", "steps": [step]}


@pytest.mark.parametrize(
    ("query", "reported"),
    [
        ("UPDATE invoices SET total = 0 WHERE id = '42'", "SQLite reports UPDATE on invoices.total"),
        ("REPLACE INTO invoices VALUES ('42', 'c-7', 0, 'EUR', 'paid')", "SQLite reports INSERT on invoices"),
        ("ALTER TABLE invoices RENAME TO old_invoices", "SQLite reports ALTER TABLE on invoices"),
        ("PRAGMA writable_schema = 1", "SQLite reports PRAGMA writable_schema 1"),
        ("SELECT * FROM invoices; DELETE FROM invoices", "it is more than one statement"),
        ("ATTACH DATABASE '/tmp/elsewhere.db' AS elsewhere", "SQLite reports ATTACH /tmp/elsewhere.db"),
        ("VACUUM INTO '/tmp/copy.db'", "it is not a query: SQLite reports no SELECT"),
        ("/* SELECT */ uPdAtE/**/invoices SET status = 'void'", "SQLite reports UPDATE on invoices.status"),
        ("SELECT * FROM secrets", "SQLite cannot compile it: no such table: secrets"),
    ],
)
def test_the_example_policy_lets_run_sql_only_read(
    catalogue: Catalogue, policy: Policy, query: str, reported: str, example_db: Path
) -> None:
    result = check(sql_plan(query), catalogue, policy, user="bob")
    assert [(v.step, v.rule) for v in result.violations] == [(1, "require:read-only-sql-in-production")]
    message = result.violations[0].message
    assert message.startswith("param 'query': may only read production data; ") and reported in message
    assert not example_db.exists(), "the check never opens the business's database"


def test_the_example_policy_lets_a_select_through(catalogue: Catalogue, policy: Policy) -> None:
    query = "SELECT c.name, sum(i.total) FROM invoices i JOIN customers c ON c.id = i.customer_id GROUP BY c.name"
    result = check(sql_plan(query), catalogue, policy, user="bob")
    assert result.ok, result.violations
