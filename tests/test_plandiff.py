"""What changed between two versions of a plan: steps by id, fields by name, the listed order."""

from __future__ import annotations

from typing import Any

from plangate.plan import Plan
from plangate.plandiff import Change, PlanDiff, compare
from tests.helpers import plan

ONE = plan(
    {"id": 1, "tool": "get_invoice", "params": {"invoice_id": "42"}},
    {"id": 2, "tool": "issue_refund", "params": {"invoice_id": "42", "amount": 20.0}},
    {"id": 3, "tool": "send_email", "params": {"to": "a@example.com", "subject": "s", "body": "b"}},
    category="refunds",
)


def diff(old: dict[str, Any], new: dict[str, Any]) -> PlanDiff:
    return compare(Plan.parse(old), Plan.parse(new), plan_id="p", from_version=1, to_version=2)


def test_nothing_changed() -> None:
    same = diff(ONE, ONE)
    assert not same.changed and same.lines()[1:] == ["  no change"]


def test_the_category_the_order_and_a_tool() -> None:
    steps = [dict(s) for s in ONE["steps"]]
    steps[1], steps[2] = steps[2], {**steps[1], "tool": "void_refund", "params": {"refund_id": "r-1"}}
    changed = diff(ONE, {**ONE, "category": "ops", "steps": steps})
    assert changed.fields == (Change(field="category", old="refunds", new="ops"),)
    assert changed.order == Change(field="order", old=[1, 2, 3], new=[1, 3, 2]), "effects run in the listed order"
    (step,) = changed.steps
    assert (step.id, step.kind, step.tool) == (2, "changed", "void_refund")
    assert [c.field for c in step.fields] == ["params.amount", "params.invoice_id", "params.refund_id", "tool"]
    assert step.fields[0] == Change(field="params.amount", old=20.0, new=None)
    assert "  order: [1, 2, 3] -> [1, 3, 2]" in changed.lines()
    assert '    tool: "issue_refund" -> "void_refund"' in changed.lines()


def test_a_diff_survives_the_api() -> None:
    steps = [*ONE["steps"][:2], {"id": 4, "tool": "get_invoice", "params": {"invoice_id": "9"}, "rationale": "r"}]
    changed = diff(ONE, {**ONE, "task": "other", "steps": steps})
    assert PlanDiff.from_dict(changed.to_dict()) == changed
    assert [(s.id, s.kind) for s in changed.steps] == [(3, "removed"), (4, "added")]
