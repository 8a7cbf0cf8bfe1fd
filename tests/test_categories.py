"""Attacks on automatic approval through a plan's category, which its requester picks freely.

A category must not buy an approval: a plan is held to its category's envelope (what
plans of that category may do), and a category cleared for automatic approval covers a
write only when its envelope names the write tool.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue, Policy, PolicyError, check
from plangate.runtime import Runtime
from tests.conftest import EXAMPLES
from tests.helpers import FixedClock

EXAMPLE = (EXAMPLES / "policy.yaml").read_text()
REFUND_980 = {"id": 1, "tool": "issue_refund", "params": {"invoice_id": "42", "amount": 980}}
LOOKUP = {"id": 1, "tool": "get_invoice", "params": {"invoice_id": "42"}}


def plan(*steps: dict[str, Any], category: str) -> dict[str, Any]:
    return {"task": "t", "category": category, "steps": [{"rationale": "r", **s} for s in steps]}


def policy(body: str) -> Policy:
    return Policy.from_yaml("version: 1\nname: test\n" + textwrap.dedent(body))


def without_categories(text: str) -> Policy:
    """The example policy as it would be with no ``categories`` section."""
    data = Policy.from_yaml(text).model_dump(mode="json", exclude={"categories"})
    return Policy.from_data(data)


def runtime(tmp_path: Path, catalogue: Catalogue, rules: Policy) -> Runtime:
    return Runtime(catalogue, rules, db=f"sqlite:///{tmp_path}/plangate.db", clock=FixedClock())


# -- (a) a refund labelled "lookups" ---------------------------------------------------------------
def test_a_refund_labelled_lookups_is_rejected_by_the_check(catalogue: Catalogue, policy: Policy) -> None:
    result = check(plan(REFUND_980, category="lookups"), catalogue, policy, user="alice")
    assert [str(v) for v in result.violations] == [
        "step 1: category-envelope: category 'lookups' allows only read tools; 'issue_refund' is write"
    ]
    assert result.decision is not None and result.decision.approval == "human"


def test_a_refund_labelled_lookups_is_rejected_at_submit(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> None:
    rt = runtime(tmp_path, catalogue, policy)
    record = rt.submit(plan(REFUND_980, category="lookups"), "alice")
    assert record.status == "rejected"
    assert [(v.step, v.rule) for v in record.violations] == [(1, "category-envelope")]
    assert rt.store.approvals(record.id) == [], "no automatic approval was recorded"


def test_an_edit_cannot_smuggle_a_refund_into_an_auto_approved_lookup(
    tmp_path: Path, catalogue: Catalogue, policy: Policy
) -> None:
    rt = runtime(tmp_path, catalogue, policy)
    record = rt.submit(plan(LOOKUP, category="lookups"), "alice")
    assert record.status == "approved"
    edited = rt.edit(record.id, plan(LOOKUP, {**REFUND_980, "id": 2}, category="lookups"), "bob")
    assert edited.status == "rejected"
    assert [(v.step, v.rule) for v in edited.violations] == [(2, "category-envelope")]


def test_without_envelopes_a_refund_labelled_lookups_still_needs_a_person(tmp_path: Path, catalogue: Catalogue) -> None:
    bare = without_categories(EXAMPLE)
    assert bare.categories is None and bare.approval.auto == ("lookups",)
    result = check(plan(REFUND_980, category="lookups"), catalogue, bare, user="alice")
    assert result.ok and result.decision is not None and result.decision.approval == "human"
    assert result.decision.reasons == (
        "category 'lookups' is cleared for automatic approval only for read-only plans; step 1 (issue_refund) is write",
    )
    record = runtime(tmp_path, catalogue, bare).submit(plan(REFUND_980, category="lookups"), "alice")
    assert record.status == "pending_approval" and record.needs == ("a person",)


# -- (b) a write the envelope names is cleared ----------------------------------------------------
CREDITS = """
categories:
  credits: {tools: [get_invoice, "issue_*"]}
approval: {auto: [credits]}
"""


def test_a_write_named_in_the_envelope_is_approved_automatically(tmp_path: Path, catalogue: Catalogue) -> None:
    rules = policy(CREDITS)
    refund = {**REFUND_980, "id": 2, "params": {"invoice_id": "42", "amount": "${1.total}"}}
    data = plan(LOOKUP, refund, category="credits")
    decision = check(data, catalogue, rules).decision
    assert decision is not None and decision.approval == "auto"
    assert decision.reasons == (
        "category 'credits' is cleared for automatic approval",
        "step 2 (issue_refund) is write, a tool its envelope names",
    )
    rt = runtime(tmp_path, catalogue, rules)
    record = rt.submit(data, "ann")
    assert record.status == "approved"
    assert [(a.kind, a.actor) for a in rt.store.approvals(record.id)] == [("auto", "policy:test")]


def test_only_the_named_writes_are_cleared(catalogue: Catalogue) -> None:
    rules = policy(CREDITS.replace('"issue_*"', '"issue_*", "*"'))
    sql = {"id": 3, "tool": "run_sql", "params": {"query": "select 1"}}
    result = check(plan(LOOKUP, {**REFUND_980, "id": 2}, sql, category="credits"), catalogue, rules)
    assert result.ok and result.decision is not None and result.decision.approval == "human"
    assert result.decision.reasons == (
        "category 'credits' is cleared for automatic approval only for read tools and the writes its envelope "
        "names (get_invoice, issue_*); step 3 (run_sql) is write",
    )


def test_a_named_irreversible_tool_still_escalates(catalogue: Catalogue) -> None:
    rules = policy("categories: {notes: {tools: [send_email]}}\napproval: {auto: [notes]}\n")
    email = {"id": 1, "tool": "send_email", "params": {"to": "a", "subject": "s", "body": "b"}}
    decision = check(plan(email, category="notes"), catalogue, rules).decision
    assert decision is not None and decision.approval == "human"
    assert decision.reasons == ("step 1 (send_email) is irreversible",)


# -- (c) a bare wildcard clears nothing ------------------------------------------------------------
@pytest.mark.parametrize("tools", ['["*"]', '["?*"]', '["[a-z]*"]', '["*", "get_*"]'])
def test_a_wildcard_alone_does_not_clear_a_write(catalogue: Catalogue, tools: str) -> None:
    rules = policy(f"categories: {{ops: {{tools: {tools}}}}}\napproval: {{auto: [ops]}}\n")
    result = check(plan(REFUND_980, category="ops"), catalogue, rules)
    assert result.ok, "the envelope allows the tool"
    assert result.decision is not None and result.decision.approval == "human"
    assert result.decision.reasons[0].startswith("category 'ops' is cleared for automatic approval only for ")
    assert result.decision.reasons[0].endswith("; step 1 (issue_refund) is write")


def test_effects_alone_do_not_clear_a_write(catalogue: Catalogue) -> None:
    rules = policy("categories: {ops: {effects: [read, write]}}\napproval: {default: auto}\n")
    decision = check(plan(LOOKUP, {**REFUND_980, "id": 2}, category="ops"), catalogue, rules).decision
    assert decision is not None and decision.approval == "human"
    assert rules.auto_approves("ops", catalogue["get_invoice"])
    assert not rules.auto_approves("ops", catalogue["issue_refund"])


# -- (d) a category the policy does not know --------------------------------------------------------
def test_an_unknown_category_is_refused(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> None:
    result = check(plan(LOOKUP, category="lookup"), catalogue, policy, user="alice")
    assert [str(v) for v in result.violations] == [
        "plan: unknown-category: category 'lookup' is not defined "
        "(categories: lookups, maintenance, react, refunds); did you mean 'lookups'?"
    ]
    record = runtime(tmp_path, catalogue, policy).submit(plan(LOOKUP, category="anything"), "alice")
    assert record.status == "rejected" and [v.rule for v in record.violations] == ["unknown-category"]


# -- (e) no categories section: automatic approval for read-only plans only -----------------------
@pytest.mark.parametrize("approval", ["{auto: [lookups]}", "{default: auto}", "{auto: ['*'], escalate: []}"])
def test_without_categories_only_read_only_plans_go_automatically(catalogue: Catalogue, approval: str) -> None:
    rules = policy(f"approval: {approval}\n")
    reads = check(plan(LOOKUP, category="lookups"), catalogue, rules).decision
    writes = check(plan(LOOKUP, {**REFUND_980, "id": 2}, category="lookups"), catalogue, rules).decision
    assert reads is not None and reads.approval == "auto"
    assert writes is not None and writes.approval == "human"
    assert any("only for read-only plans; step 2 (issue_refund) is write" in r for r in writes.reasons)
    assert rules.category_envelope("lookups") is None


# -- the envelope itself ---------------------------------------------------------------------------
def test_envelopes_limit_tools_effects_and_external_calls(catalogue: Catalogue) -> None:
    rules = policy("""
        categories:
          reads: {effects: [read], external: false}
          refunds: {tools: [get_invoice, issue_refund], effects: [read, write]}
        """)
    email = {"id": 2, "tool": "send_email", "params": {"to": "a", "subject": "s", "body": "b"}}
    sql = {"id": 3, "tool": "run_sql", "params": {"query": "select 1"}}
    reads = check(plan(LOOKUP, email, category="reads"), catalogue, rules)
    assert [str(v) for v in reads.violations] == [
        "step 2: category-envelope: category 'reads' allows only read tools and allows no external calls; "
        "'send_email' is irreversible and calls outside"
    ]
    refunds = check(plan(LOOKUP, email, sql, category="refunds"), catalogue, rules)
    assert [str(v) for v in refunds.violations] == [
        "step 2: category-envelope: category 'refunds' may use only the tools get_invoice, issue_refund; "
        "'send_email' (irreversible) is not one of them",
        "step 3: category-envelope: category 'refunds' may use only the tools get_invoice, issue_refund; "
        "'run_sql' (write) is not one of them",
    ]
    envelope = rules.category_envelope("refunds")
    assert envelope is not None and envelope.tools == ("get_invoice", "issue_refund")
    assert rules.category_envelope("nope") is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("categories: {a: {effects: [delete]}}", "categories.a.effects[0]: Input should be 'read', 'write' or"),
        ("categories: {a: {}}", "categories.a: .*an envelope needs tools or effects"),
        ("categories: {a: {tools: []}}", "categories.a.tools: Tuple should have at least 1 item"),
        ("categories: {a: {tool: [x]}}", "categories.a.tool: not a known field"),
    ],
)
def test_bad_envelopes_fail_clearly(body: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message.replace("[", r"\[").replace("]", r"\]")):
        policy(body)


def test_the_example_policy_clears_read_only_lookups(catalogue: Catalogue, policy: Policy) -> None:
    assert policy.categories is not None
    assert set(policy.categories) == {"lookups", "refunds", "maintenance", "react"}
    decision = check(plan(LOOKUP, category="lookups"), catalogue, policy, user="alice").decision
    assert decision is not None and decision.approval == "auto"
