"""Approvals, corrections and the audit log held against interleavings and indirect paths."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue, Policy, ledger, retention, tool
from plangate.accounts import Accounts, User
from plangate.errors import GovernanceError, StateError
from plangate.register import Register
from plangate.runtime import Runtime
from tests.conftest import EXAMPLES
from tests.helpers import FixedClock, plan
from tests.test_recovery import REFUND_THEN_FAIL, halted

OLD = datetime(2020, 1, 1, 9, 0, tzinfo=UTC)


@pytest.fixture
def rt(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> Runtime:
    return Runtime(
        catalogue, policy, db=f"sqlite:///{tmp_path}/r.db", clock=FixedClock(), tools=str(EXAMPLES / "business.py")
    )


def with_step(data: dict[str, Any], index: int, **changes: Any) -> dict[str, Any]:
    steps = [dict(s) for s in data["steps"]]
    steps[index] = steps[index] | changes
    return dict(data, steps=steps)


def test_a_second_edit_of_a_correction_may_not_change_a_step_that_succeeded(rt: Runtime) -> None:
    plan_id = halted(rt, REFUND_THEN_FAIL)
    corrected = with_step(REFUND_THEN_FAIL, 2, params={"invoice_id": "43", "amount": 50.0})
    assert rt.edit(plan_id, corrected, "carol").status == "pending_approval"
    rewritten = with_step(corrected, 1, params={"invoice_id": "42", "amount": 999.0})
    with pytest.raises(StateError, match="step 2 already ran"):
        rt.edit(plan_id, rewritten, "carol")


def test_a_correction_sent_back_for_approval_by_a_policy_change_keeps_what_succeeded(
    tmp_path: Path, rt: Runtime, policy: Policy
) -> None:
    from examples import business

    plan_id = halted(rt, REFUND_THEN_FAIL)
    data = policy.model_dump(mode="json")
    data["sequences"] = [
        *data["sequences"],
        {
            "name": "refund-after-lookup",
            "after": {"tools": ["get_invoice"]},
            "forbid": {"tools": ["issue_refund"]},
            "unless_approved_by": "privacy-officer",
        },
    ]
    stricter = Policy.from_data(data)
    later = Runtime(rt.catalogue, stricter, db=rt.store, clock=rt.clock, tools=rt.tools)
    with pytest.raises(GovernanceError, match="back for approval"):
        later.resume(plan_id)
    assert later.get(plan_id).status == "pending_approval"
    rewritten = with_step(REFUND_THEN_FAIL, 1, params={"invoice_id": "42", "amount": 999.0})
    rewritten = with_step(rewritten, 2, params={"invoice_id": "43", "amount": 5.0})
    with pytest.raises(StateError, match="step 2 already ran"):
        later.edit(plan_id, rewritten, "carol")
    assert business.effect_counts() == {"refund": 1}


@tool
def look(key: str) -> str:
    return key


def test_a_category_held_by_the_register_after_its_automatic_approval_does_not_run_without_a_person(
    tmp_path: Path,
) -> None:
    policy = Policy.from_yaml("version: 1\nname: reg\napproval: {auto: [lookups]}\n")
    rt = Runtime(Catalogue([look]), policy, db=f"sqlite:///{tmp_path}/r.db", clock=FixedClock())
    Accounts(rt.store).add("gina", "governance")
    record = rt.submit(plan({"id": 1, "tool": "look", "params": {"key": "a"}}, category="lookups"), "ann")
    assert record.status == "approved"
    Register(rt.store, rt.clock).set("lookups", False, by="gina", reason="until the audit")
    with pytest.raises(GovernanceError, match="a person"):
        rt.execute(record.id)
    held = rt.get(record.id)
    assert (held.status, held.needs) == ("pending_approval", ("a person",))
    assert not rt.store.steps(record.id), "nothing ran"
    rt.approve(record.id, "dave", held.hash)
    assert rt.execute(record.id).ok
    assert ledger.verify(rt.store).ok


def test_a_purged_plan_is_finished_for_good_and_is_not_edited_back_to_life(
    tmp_path: Path, catalogue: Catalogue, policy: Policy
) -> None:
    """A rejected plan is purged as finished; an edit would make it run again over the blanked evidence."""
    url = f"sqlite:///{tmp_path}/r.db"
    old = Runtime(catalogue, policy, db=url, clock=FixedClock(OLD), tools=str(EXAMPLES / "business.py"))
    plan_id = halted(old, REFUND_THEN_FAIL)
    corrected = with_step(REFUND_THEN_FAIL, 2, params={"invoice_id": "43", "amount": 50.0})
    record = old.edit(plan_id, corrected, "carol")
    old.reject(plan_id, "dave", "not like this", record.hash)
    done = retention.purge(old.store, days=365, policy=policy, now=datetime.now(UTC), actor="gina")
    assert done.plans == (plan_id,)
    rt = Runtime(catalogue, policy, db=old.store, tools=old.tools)
    with pytest.raises(StateError, match="purged"):
        rt.edit(plan_id, with_step(REFUND_THEN_FAIL, 2, params={"invoice_id": "43", "amount": 40.0}), "carol")
    assert rt.get(plan_id).status == "rejected"
    assert ledger.verify(rt.store).ok


CHARGES: list[str] = []


@tool(effect="write", compensate="refund_charge", timeout=0.2)
def charge(account: str, amount: float) -> str:
    """Charge an account (not idempotent: twice is twice); account "slow" answers too late."""
    CHARGES.append(f"charge {amount} to {account}")
    if account == "slow":
        time.sleep(0.5)
    return f"charged {amount}"


@tool(effect="write", idempotent=True)
def refund_charge(account: str, amount: float) -> str:
    CHARGES.append(f"refund {amount} to {account}")
    return f"refunded {amount}"


def test_a_rollback_waits_until_every_unknown_outcome_is_settled(tmp_path: Path) -> None:
    """A charge that may have happened is neither undone nor settled: the plan must not end compensated."""
    CHARGES.clear()
    rt = Runtime(Catalogue([charge, refund_charge]), None, db=f"sqlite:///{tmp_path}/r.db", clock=FixedClock())
    body = plan(
        {"id": 1, "tool": "charge", "params": {"account": "a", "amount": 3.0}},
        {"id": 2, "tool": "charge", "params": {"account": "slow", "amount": 5.0}},
    )
    record = rt.submit(body, "alice")
    rt.approve(record.id, "dave", record.hash)
    result = rt.execute(record.id)
    assert result.status == "halted" and (result.error or "").startswith("outcome unknown"), result.error
    with pytest.raises(StateError, match="settle it first"):
        rt.compensate(record.id, actor="dave", reason="customer cancelled")
    assert rt.get(record.id).status == "halted"
    rt.settle(record.id, 2, done=True, actor="dave", output="charged 5.0", note="seen on the statement")
    assert rt.compensate(record.id, actor="dave", reason="customer cancelled").status == "compensated"
    assert CHARGES == ["charge 3.0 to a", "charge 5.0 to slow", "refund 5.0 to slow", "refund 3.0 to a"]


@tool(effect="write")
def pay(amount: float) -> str:
    CHARGES.append(f"pay {amount}")
    return "paid"


FINANCE = """
version: 1
name: finance
roles:
  support: {tools: ["*"], scopes: ["*"]}
  approver: {tools: ["*"], scopes: ["*"]}
  finance: {tools: ["*"], scopes: ["*"]}
users: {alice: support, dave: approver, eve: finance}
sequences:
  - name: a-second-payment
    after: {tools: [pay]}
    forbid: {tools: [pay]}
    unless_approved_by: finance
"""


def test_an_approver_moved_out_of_a_role_does_not_meet_that_roles_approval(tmp_path: Path) -> None:
    """Eve leaves finance in the policy now in force: her sign-off no longer stands for finance's."""
    CHARGES.clear()
    db = f"sqlite:///{tmp_path}/r.db"
    before = Runtime(Catalogue([pay]), Policy.from_yaml(FINANCE), db=db, clock=FixedClock())
    two = plan({"id": 1, "tool": "pay", "params": {"amount": 1.0}}, {"id": 2, "tool": "pay", "params": {"amount": 2.0}})
    record = before.submit(two, "alice")
    assert record.needs == ("a person", "finance")
    moved = Policy.from_yaml(FINANCE.replace("eve: finance", "eve: support, fred: finance"))
    rt = Runtime(Catalogue([pay]), moved, db=db, clock=FixedClock())
    rt.approve(record.id, "eve", record.hash)  # as finance, under the policy the version was checked against
    with pytest.raises(GovernanceError, match="now needs approval by finance"):
        rt.execute(record.id)
    assert CHARGES == []
    assert rt.approve(record.id, "dave", record.hash).needs == ("finance",), "eve counts as a person only"
    assert rt.approve(record.id, "fred", record.hash).status == "approved"
    assert rt.execute(record.id).ok and CHARGES == ["pay 1.0", "pay 2.0"]
    assert ledger.verify(rt.store).ok


def test_a_requester_moved_out_of_a_role_does_not_keep_its_tools_for_an_approved_plan(tmp_path: Path) -> None:
    """The role a plan is held against is the one the policy in force gives its requester, not one recorded."""
    CHARGES.clear()
    db = f"sqlite:///{tmp_path}/r.db"
    before = Runtime(Catalogue([pay]), Policy.from_yaml(FINANCE), db=db, clock=FixedClock())
    record = before.submit(plan({"id": 1, "tool": "pay", "params": {"amount": 1.0}}), "alice")
    before.approve(record.id, "dave", record.hash)
    viewer = FINANCE.replace("roles:\n", 'roles:\n  viewer: {tools: ["look*"], scopes: []}\n')
    moved = Policy.from_yaml(viewer.replace("alice: support", "alice: viewer"))
    rt = Runtime(Catalogue([pay]), moved, db=db, clock=FixedClock())
    with pytest.raises(GovernanceError, match=r"no longer passes: .*role 'viewer' may not use tool 'pay'"):
        rt.execute(record.id)
    assert CHARGES == []
    edited = rt.edit(record.id, plan({"id": 1, "tool": "pay", "params": {"amount": 0.5}}), "alice")
    assert edited.status == "rejected", "an edit is held against the requester's role now, too"


DAVE = User(name="dave", role="approver", categories=("maintenance",))
"""Dave on a dashboard that makes him an approver of maintenance plans only: refunds are not his to decide."""


def _halted_in_refunds_again(rt: Runtime, plan_id: str) -> None:
    """A correction moves the halted plan into ``refunds`` (step 3 still too large), approved and run: halted again."""
    corrected = dict(with_step(REFUND_THEN_FAIL, 2, params={"invoice_id": "43", "amount": 6000.0}))
    record = rt.edit(plan_id, corrected, "carol")
    rt.approve(plan_id, "alice", record.hash)
    assert rt.execute(plan_id).status == "halted" and rt.get(plan_id).category == "refunds"


def _actions_module() -> Any:
    from plangate.server import _actions

    return _actions


AFTER_THE_CHECK: dict[str, Any] = {
    "close": lambda rt, plan_id: _actions_module().close(rt, DAVE, plan_id, "no longer needed"),
    "compensate": lambda rt, plan_id: _actions_module().compensate(rt, DAVE, plan_id, "undo it"),
    "settle": lambda rt, plan_id: _actions_module().settle(rt, DAVE, plan_id, 3, done=False, output=None, note=None),
}


@pytest.mark.parametrize("doing", sorted(AFTER_THE_CHECK))
def test_a_decision_after_a_halt_is_refused_when_the_category_changed_after_the_check(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch, doing: str
) -> None:
    from plangate.server import _actions

    plan_id = halted(rt, {**REFUND_THEN_FAIL, "category": "maintenance"})
    checked = _actions.may_decide

    def then_corrected(user: User, record: Any) -> None:
        checked(user, record)  # dave may decide maintenance plans: passes
        _halted_in_refunds_again(rt, record.id)  # between his check and his decision

    monkeypatch.setattr(_actions, "may_decide", then_corrected)
    before = [e.kind for e in rt.trace(plan_id)]
    with pytest.raises(StateError, match=r"category changed after the right to .* was checked .* 'maintenance'"):
        AFTER_THE_CHECK[doing](rt, plan_id)
    assert rt.get(plan_id).status == "halted"
    assert [e.kind for e in rt.trace(plan_id)][len(before) :][-1] == "run.halted"  # nothing of dave's


BEFORE_APPROVAL: dict[str, Any] = {
    "reject": lambda rt, plan_id: _actions_module().decide(rt, DAVE, plan_id, None, "not this", approve=False),
    "edit": lambda rt, plan_id: _actions_module().edit(rt, DAVE, plan_id, {**REFUND_THEN_FAIL, "task": "other"}),
}


@pytest.mark.parametrize("doing", sorted(BEFORE_APPROVAL))
def test_a_rejection_or_edit_is_refused_when_the_category_changed_after_the_check(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch, doing: str
) -> None:
    from plangate.server import _actions

    record = rt.submit({**REFUND_THEN_FAIL, "category": "maintenance"}, "bob")
    name = "may_decide" if doing == "reject" else "permit"  # the dashboard's check of the right to do it
    checked = getattr(_actions, name)

    def then_edited(user: User, *args: Any, **kwargs: Any) -> None:
        checked(user, *args, **kwargs)  # dave may decide maintenance plans: passes
        rt.edit(record.id, REFUND_THEN_FAIL, "carol")  # now a refunds plan

    monkeypatch.setattr(_actions, name, then_edited)
    with pytest.raises(StateError, match=f"category changed after the right to {doing} it was checked"):
        BEFORE_APPROVAL[doing](rt, record.id)
    assert (rt.get(record.id).status, rt.get(record.id).version) == ("pending_approval", 2)
