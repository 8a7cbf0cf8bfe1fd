"""The policy's rollbacks cut off, carried on: a person's rollback never taken over by the policy, two runners on
one rollback given back, a begin whose answer was lost, and a runner that failed mid-rollback.

The policy rolls back halted plans on its own (``compensation.on_halt: auto``); a worker carries on a rollback
it began whose runner stopped (:meth:`Runtime.carry_on_rollback`). Each undo runs at most once, and a rollback
a person began or left is theirs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest

from plangate import Catalogue, lifecycle, tool
from plangate import worker as worker_module
from plangate.errors import GovernanceError, LeaseLostError, StateError, StoreError
from plangate.policy import Policy
from plangate.runtime import Runtime
from plangate.store import open_store
from plangate.worker import Worker
from tests import outage
from tests.helpers import ROLLING, rolled_back_on_halt

REFUNDS: list[str] = []
REFUSING: list[str] = []  # while it holds a reason, the bank refuses each refund with it


@tool(effect="write", compensate="refund")
def charge(n: int) -> dict[str, str]:
    """A charge, undone by refund."""
    return {"charge_id": f"c{n}"}


@tool(effect="write", idempotent=True)
def refund(charge_id: str) -> str:
    """Refund a charge (under the undo's idempotency key)."""
    REFUNDS.append(charge_id)
    if REFUSING:
        raise RuntimeError(REFUSING[0])
    return f"refunded {charge_id}"


@tool(effect="write")
def fails(n: int) -> int:
    """Always fails: the plan halts."""
    raise RuntimeError("no")


@tool(effect="write", compensate="refund_by_wire")
def charge_by_card(n: int) -> dict[str, str]:
    """A charge, undone by a wire transfer back (not idempotent)."""
    return {"charge_id": f"w{n}"}


@tool(effect="write")
def refund_by_wire(charge_id: str) -> str:
    """Wire the money back; under :func:`quick_outage`, the store goes away while the wire is sent (it is sent)."""
    REFUNDS.append(charge_id)
    if outage.DB:
        outage.cut_every_connection()
    return f"wired {charge_id}"


TOOLS = [charge, refund, fails]


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    REFUNDS.clear()
    REFUSING.clear()
    yield
    REFUNDS.clear()
    REFUSING.clear()


def given_back(db: str) -> str:
    """A plan whose run halted and whose rollback the policy began, its lease given back before any undo (as a
    worker's drain's end gives it back): ``compensating`` with no lease, for the next worker to carry on."""
    rt, plan_id = rolled_back_on_halt(db, TOOLS, "charge", "fails")
    with closing(rt), pytest.raises(LeaseLostError, match="drain ended"):
        rt.drive(rt.start(plan_id, actor="worker:w"), stop=_set())
    with closing(open_store(db)) as store:
        row = store.get_plan(plan_id)
        assert row is not None and (row.status, row.lease_owner) == ("compensating", None)
    assert REFUNDS == []
    return plan_id


def _set() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


def _runtime(db: str) -> Runtime:
    return Runtime(Catalogue(TOOLS), Policy.from_yaml(ROLLING), db=db)


def _began(db: str, plan_id: str) -> list[str]:
    with closing(open_store(db)) as store:
        return [e.actor for e in store.events(plan_id) if e.kind == "compensation.started"]


def test_a_rollback_a_person_took_over_and_left_is_not_carried_on_by_the_policy(
    any_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker read the policy's rollback given back at a drain, and proved from the log that the policy began
    it; before its begin, a person took the rollback over and left it incomplete (the bank refused the refund:
    theirs to deal with now). The worker's begin only asked for a plan nobody holds, so it began the policy's
    rollback over the person's, on a plan left ``compensation_incomplete``, and refunded again. Whose rollback
    it is is now proven under the lock of the begin itself."""
    plan_id = given_back(any_db)
    roll_back = Runtime._roll_back

    def a_person_first(self: Runtime, plan_id: str, **kwargs: Any) -> Any:
        if not kwargs["by_person"]:  # between the worker's proof and its begin
            REFUSING.append("the bank refused the refund")
            with closing(_runtime(any_db)) as person:
                assert person.compensate(plan_id, actor="dave", reason="by hand").status == "compensation_incomplete"
            REFUSING.clear()
        return roll_back(self, plan_id, **kwargs)

    monkeypatch.setattr(Runtime, "_roll_back", a_person_first)
    with closing(_runtime(any_db)) as rt:
        with pytest.raises(GovernanceError, match=r"begun by dave.*plangate compensate"):
            rt.carry_on_rollback(plan_id)
        assert rt.get(plan_id).status == "compensation_incomplete"
    assert REFUNDS == ["c1"], "the policy refunded again over the person's rollback"
    assert _began(any_db, plan_id) == ["policy:rolling", "dave"]


def test_two_runners_carrying_on_a_rollback_given_back_undo_once(any_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers both find the policy's rollback with no lease and both prove it the policy's before either
    begins: one carries it on, the other is refused at its begin, and the charge is refunded once."""
    plan_id = given_back(any_db)
    roll_back, both = Runtime._roll_back, threading.Barrier(2, timeout=30)

    def together(self: Runtime, plan_id: str, **kwargs: Any) -> Any:
        both.wait()
        return roll_back(self, plan_id, **kwargs)

    monkeypatch.setattr(Runtime, "_roll_back", together)
    ended: list[object] = []

    def carry_on() -> None:
        with closing(_runtime(any_db)) as rt:
            try:
                ended.append(rt.carry_on_rollback(plan_id).status)
            except StateError as refused:
                ended.append(refused)

    runners = [threading.Thread(target=carry_on) for _ in range(2)]
    for runner in runners:
        runner.start()
    for runner in runners:
        runner.join(60)
    assert "compensated" in ended and len(ended) == 2, ended
    assert REFUNDS == ["c1"]
    assert _began(any_db, plan_id) == ["policy:rolling"] * 2


def test_carrying_on_under_the_name_of_a_live_rollbacks_lease_is_refused(any_db: str) -> None:
    """Only a begin whose answer was lost finds the plan under its own lease and begins again: a caller that
    names the lease of a rollback still running (its fences would pass the running one's) is refused."""
    plan_id = given_back(any_db)
    live = lifecycle.runner("policy:rolling")
    with closing(open_store(any_db)) as store, store.transaction():
        store.command("UPDATE plans SET lease_owner = ?, lease_until = '2999-01-01T00:00:00.000000Z'", (live,))
    with closing(_runtime(any_db)) as rt, pytest.raises(StateError, match="must wait until it stops"):
        rt.carry_on_rollback(plan_id, owner=live)
    assert REFUNDS == []


def test_a_worker_never_sends_again_a_wire_whose_rollback_was_killed_mid_call(
    any_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process running the policy's rollback is killed after the wire back went out, before its outcome was
    recorded, and its lease is given back. The worker that carries the rollback on finds the wire started with
    no outcome, its tool not idempotent: it may have gone, so it is left for a person to settle, not sent again."""
    rt, plan_id = rolled_back_on_halt(any_db, [charge_by_card, refund_by_wire, fails], "charge_by_card", "fails")
    put_step = type(rt.store).put_step

    def killed(self: Any, row: Any) -> None:
        if row.step_id < 0 and row.status == "succeeded":
            raise SystemExit("killed")
        put_step(self, row)

    with closing(rt), monkeypatch.context() as patched:
        patched.setattr(type(rt.store), "put_step", killed)
        with pytest.raises(SystemExit):
            rt.execute(plan_id)
    with closing(open_store(any_db)) as store, store.transaction():
        store.command("UPDATE plans SET lease_owner = NULL, lease_until = NULL WHERE id = ?", (plan_id,))
    catalogue = Catalogue([charge_by_card, refund_by_wire, fails])
    with closing(Worker(catalogue, db=any_db, policy=Policy.from_yaml(ROLLING))) as w:
        w.serve(drain=True, poll=0.05)
    assert REFUNDS == ["w1"], "the wire was sent again"
    with closing(open_store(any_db)) as store:
        row = store.get_plan(plan_id)
        assert row is not None and (row.status, row.lease_owner) == ("compensation_incomplete", None), row
        (finished,) = [e for e in store.events(plan_id) if e.kind == "compensation.finished"]
        assert "plangate settle" in finished.data["failed"][0][1] and "--undo" in finished.data["failed"][0][1]
        assert store.verify_audit().ok


def test_a_worker_whose_rollback_failed_gives_its_lease_back(any_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run halts and the policy's rollback begins on the worker's runner thread; the store refuses the
    undo's start (a database locked past its wait) and the rollback fails. The worker gave back only the run's
    lease, which the rollback had taken the place of: the rollback's was held until it ran out, after the
    worker's drain had returned (a process that exits then leaves it to nobody). It is given back now, and the
    next look carries the rollback on at once."""
    rt, plan_id = rolled_back_on_halt(any_db, TOOLS, "charge", "fails")
    rt.close()
    put_step, refused = type(rt.store).put_step, []

    def locked_once(self: Any, row: Any) -> None:
        if row.step_id < 0 and not refused:
            refused.append(row.step_id)
            raise StoreError("database is locked")
        put_step(self, row)

    monkeypatch.setattr(type(rt.store), "put_step", locked_once)
    with closing(Worker(Catalogue(TOOLS), db=any_db, policy=Policy.from_yaml(ROLLING))) as w:
        w.serve(drain=True, poll=0.05)
    assert refused == [-1] and any("database is locked" in why for why in w.failed), w.failed
    with closing(open_store(any_db)) as store:
        row = store.get_plan(plan_id)
        assert row is not None and (row.status, row.lease_owner) == ("compensating", None), row
    monkeypatch.setattr(worker_module, "ASIDE_SECONDS", (0.0, 0.0))
    with closing(Worker(Catalogue(TOOLS), db=any_db, policy=Policy.from_yaml(ROLLING))) as w:
        w.serve(drain=True, poll=0.05)
    with closing(open_store(any_db)) as store:
        row = store.get_plan(plan_id)
        assert row is not None and (row.status, row.lease_owner) == ("compensated", None), row
        assert store.verify_audit().ok
    assert REFUNDS == ["c1"]


@pytest.fixture
def quick_outage(pg_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from outage.quick_retries(pg_db, monkeypatch)


def test_the_policys_rollback_whose_begin_lost_its_answer_is_carried_on(
    pg_db: str, quick_outage: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run halts, and the policy's rollback begins: its commit goes through as its answer is lost. The begin
    tried again once the store was back (under a lease of a new name) found the plan under the first try's, live,
    and refused as if another runner held it: the caller got a StateError, and the rollback waited, begun, under a
    lease nobody renewed, until it ran out. The begin is tried again under the same lease now, and finds it its
    own: the rollback is carried on, and the charge refunded once."""
    outage.cut_armed_commits(monkeypatch)
    rt, plan_id = rolled_back_on_halt(pg_db, TOOLS, "charge", "fails")
    roll_back, armed = Runtime._roll_back, []

    def its_answer_lost(self: Runtime, plan_id: str, **kwargs: Any) -> Any:
        if not armed:  # the first begin's commit goes through, its answer lost
            armed.append(plan_id)
            outage.ARMED["thread"] = threading.get_ident()
        return roll_back(self, plan_id, **kwargs)

    monkeypatch.setattr(Runtime, "_roll_back", its_answer_lost)
    with closing(rt):
        result = rt.execute(plan_id)
    assert result.status == "halted" and armed == [plan_id] and "thread" not in outage.ARMED
    with closing(open_store(pg_db)) as store:
        row = store.get_plan(plan_id)
        assert row is not None and (row.status, row.lease_owner) == ("compensated", None), row
        assert store.verify_audit().ok
    assert REFUNDS == ["c1"]


def test_a_rollback_cut_off_from_its_store_mid_undo_never_sends_a_wire_twice(pg_db: str, quick_outage: None) -> None:
    """The policy's rollback sends a wire back (not idempotent) and the store goes away as it does, before its
    outcome is recorded. Once the store is back the rollback is carried on at once, under its own lease, where it
    was left under that lease until it ran out: the wire, started with no outcome on record, may have gone, and is
    left for a person to settle, never sent again."""
    rt, plan_id = rolled_back_on_halt(pg_db, [charge_by_card, refund_by_wire, fails], "charge_by_card", "fails")
    with closing(rt):
        assert rt.execute(plan_id).status == "halted"
    assert REFUNDS == ["w1"]
    with closing(open_store(pg_db)) as store:
        row = store.get_plan(plan_id)
        assert row is not None and (row.status, row.lease_owner) == ("compensation_incomplete", None), row
        assert store.steps(plan_id)[-1].status == "started"
        (finished,) = [e for e in store.events(plan_id) if e.kind == "compensation.finished"]
        assert "--undo" in finished.data["failed"][0][1], finished.data
        assert store.verify_audit().ok


def test_the_policys_rollback_whose_end_lost_its_answer_gives_the_run_its_result(
    pg_db: str, quick_outage: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run halts and the policy's rollback refunds the charge; the commit that ends the rollback goes through
    as its answer is lost. The rollback tried again once the store was back found the plan ``compensated`` and
    refused to begin ("only a halted plan's steps can be settled or undone"): the caller got that StateError for a
    run that had halted and been rolled back in full. It is found ended under its own lease, and the run's halted
    result comes back; nothing is undone twice, nothing begun again."""
    outage.cut_armed_commits(monkeypatch)
    rt, plan_id = rolled_back_on_halt(pg_db, TOOLS, "charge", "fails")
    move, armed = lifecycle.move, []

    def its_answer_lost(store: Any, plan: Any, to: Any, **kwargs: Any) -> Any:
        if kwargs.get("kind") == "compensation.finished" and not armed:  # the rollback's end commits, unanswered
            armed.append(plan.id)
            outage.ARMED["thread"] = threading.get_ident()
        return move(store, plan, to, **kwargs)

    monkeypatch.setattr(lifecycle, "move", its_answer_lost)
    with closing(rt):
        result = rt.execute(plan_id)
    assert result.status == "halted" and armed == [plan_id] and "thread" not in outage.ARMED
    assert REFUNDS == ["c1"]
    assert _began(pg_db, plan_id) == ["policy:rolling"]
    with closing(open_store(pg_db)) as store:
        row = store.get_plan(plan_id)
        assert row is not None and (row.status, row.lease_owner) == ("compensated", None), row
        assert store.verify_audit().ok
