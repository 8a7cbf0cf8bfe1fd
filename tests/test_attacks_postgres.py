"""A runner that lost its lease records nothing, on PostgreSQL (where a transaction's writes wait for its commit)."""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from plangate import Catalogue, lifecycle, tool
from plangate.errors import LeaseLostError
from plangate.runtime import Runtime
from tests.helpers import plan


@pytest.fixture
def db(pg_db: str) -> str:
    """A fresh database on the session's cluster (tests/conftest.py)."""
    return pg_db


_state: dict[str, Any] = {}


def _take_over(owner: str) -> None:
    with psycopg.connect(_state["db"], autocommit=True) as conn:
        conn.execute("UPDATE plans SET lease_owner = %s WHERE kind = 'plan'", (owner,))


# -- an outcome recorded while other calls are in flight, after another runner took the plan --------------------
@tool(effect="irreversible", name="charge")
def charge(n: int) -> int:
    """Charge; meanwhile another runner takes the plan over (its lease ran out while this runner was paused)."""
    _take_over("intruder")
    _state["returned"].set()
    return n


@tool(effect="irreversible", name="ship")
def ship(n: int) -> int:
    """Ship; returns once the run's transaction that recorded charge's outcome ended (committed or not)."""
    _state["recorded"].wait(30)
    return n


@tool(name="receipt")
def receipt(a: int, b: int) -> int:
    return a + b


def test_an_outcome_is_not_recorded_by_a_runner_whose_plan_was_taken_over_while_other_calls_run(db: str) -> None:
    """Two steps run at once, a third waits for both. The plan is taken over during the first call; the
    transaction that records its outcome starts nothing (the third step still waits for the second),
    so it carried no fence and committed: the runner that had lost the plan wrote the step's outcome
    and its event. Every transaction of a run that does not end it commits only under the runner's lease."""
    _state.update(db=db, returned=threading.Event(), recorded=threading.Event())
    rt = Runtime(Catalogue([charge, ship, receipt]), db=db)
    real = rt.store._log_released  # type: ignore[attr-defined]

    def released() -> None:  # each transaction's end: the one after charge returned recorded its outcome
        real()
        if _state["returned"].is_set():
            _state["recorded"].set()

    rt.store._log_released = released  # type: ignore[attr-defined]
    try:
        steps = (
            {"id": 1, "tool": "charge", "params": {"n": 1}},
            {"id": 2, "tool": "ship", "params": {"n": 2}},
            {"id": 3, "tool": "receipt", "params": {"a": "${1}", "b": "${2}"}},
        )
        record = rt.submit({**plan(*steps), "order": "dataflow"}, "ann")  # 1 and 2 at once, whatever their effects
        rt.approve(record.id, "ben", record.hash)
        with pytest.raises(LeaseLostError, match="held by intruder"):
            rt.execute(record.id)
        assert rt.store.steps(record.id)[1].status == "started", "recorded by a runner that had lost the plan"
        assert "step.succeeded" not in [e.kind for e in rt.trace(record.id)]
        assert rt.store.verify_audit().ok
    finally:
        rt.close()
        _state.clear()


# -- an outcome recorded after the lease keeper found the plan taken over ----------------------------------------
@tool(effect="irreversible", name="wire")
def wire(n: int) -> int:
    """Wire money; meanwhile the plan is taken over by another runner, and this one's keeper notices."""
    plan_id = _state["plan_id"]
    with psycopg.connect(_state["db"], autocommit=True) as conn:  # this runner looked dead: its lease ran out
        conn.execute("UPDATE plans SET lease_until = '2000-01-01T00:00:00.000000Z' WHERE id = %s", (plan_id,))
    _state["claim"] = _state["other"].start(plan_id, actor="other", owner="other#1@elsewhere:1")
    assert _state["keepers"][-1].lost.wait(30), "the keeper never found the lease taken"
    return n


@tool(name="confirm")
def confirm(n: int) -> int:
    return n


def test_an_outcome_is_not_recorded_after_the_keeper_found_the_plan_taken_over(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keeper's renewal finds the plan held by another runner, which has already claimed it and read its
    steps (step 1 started, no outcome). The call then ends: its outcome was written over the started
    record, with its event, after the other runner's claim; the other runner, going by what it read,
    then wrote the step over as of unknown outcome, erasing the output. A runner that lost the plan
    records nothing; the other runner decides from the started record."""
    keepers: list[lifecycle.LeaseKeeper] = []
    real_enter = lifecycle.LeaseKeeper.__enter__

    def enter(self: lifecycle.LeaseKeeper) -> lifecycle.LeaseKeeper:
        keepers.append(self)
        return real_enter(self)

    monkeypatch.setattr(lifecycle.LeaseKeeper, "__enter__", enter)
    rt = Runtime(Catalogue([wire, confirm]), db=db, lease_seconds=0.9)
    other = Runtime(Catalogue([wire, confirm]), db=db)
    try:
        steps = ({"id": 1, "tool": "wire", "params": {"n": 1}}, {"id": 2, "tool": "confirm", "params": {"n": "${1}"}})
        record = rt.submit(plan(*steps), "ann")
        rt.approve(record.id, "ben", record.hash)
        _state.update(db=db, plan_id=record.id, other=other, keepers=keepers)
        with pytest.raises(LeaseLostError):
            rt.execute(record.id)
        kinds = [e.kind for e in rt.trace(record.id)]
        assert kinds[-2:] == ["step.started", "run.resumed"], "the first runner wrote after the plan was taken"
        result = other.drive(_state["claim"])
        assert result.status == "halted" and (result.error or "").startswith("outcome unknown")
        assert rt.store.verify_audit().ok
    finally:
        rt.close()
        other.close()
        _state.clear()


# -- a rollback's undo, recorded after the rollback was taken over ----------------------------------------------
@tool(effect="write", compensate="unbook", idempotent=False, name="book")
def book(room: int) -> dict[str, int]:
    return {"room": room}


@tool(effect="write", idempotent=False, name="unbook")
def unbook(room: int) -> int:
    """Cancel; meanwhile the rollback is taken over (its runner looked dead, its lease ran out)."""
    _take_over("rollback#2@elsewhere:1")
    return room


@tool(name="refuse")
def refuse(n: int) -> int:
    raise RuntimeError("no")


def test_an_undo_is_not_recorded_by_a_rollback_that_lost_its_lease(db: str) -> None:
    """The undo's started record commits only under the rollback's lease (a fence), but its outcome did not:
    a rollback whose lease was taken over wrote the undo as succeeded, with its event, over whatever
    the rollback that took over had decided. Its outcome commits only while it holds the plan."""
    _state.update(db=db)
    rt = Runtime(Catalogue([book, unbook, refuse]), db=db)
    try:
        steps = ({"id": 1, "tool": "book", "params": {"room": 7}}, {"id": 2, "tool": "refuse", "params": {"n": 1}})
        record = rt.submit(plan(*steps), "ann")
        rt.approve(record.id, "ben", record.hash)
        assert rt.execute(record.id).status == "halted"
        with pytest.raises(LeaseLostError):
            rt.compensate(record.id, actor="ben", reason="cancelled")
        assert rt.store.steps(record.id)[-1].status == "started", "recorded by a rollback that had lost the plan"
        assert "compensation.step_succeeded" not in [e.kind for e in rt.trace(record.id)]
        assert rt.store.verify_audit().ok
    finally:
        rt.close()
        _state.clear()


# -- the newest event, read while recorded events and other writes wait ------------------------------------------
def test_the_newest_event_read_in_a_transaction_counts_the_events_it_recorded(db: str) -> None:
    """An event recorded (waiting for the log's lock) and a step's write waiting beside it: the read of the plan's
    newest event went out with the waiting write alone, and named the event before the one just recorded
    (SQLite, which writes events at once, named the new one). Any read of the log writes the events first."""
    rt = Runtime(Catalogue([confirm]), db=db)
    try:
        record = rt.submit(plan({"id": 1, "tool": "confirm", "params": {"n": 1}}), "ann")
        rt.approve(record.id, "ben", record.hash)
        assert rt.execute(record.id).ok
        row = rt.store.steps(record.id)[1]
        with rt.store.transaction():
            rt.store.record_event(
                plan_id=record.id, version=1, step_id=None, kind="probe", actor="ann", at="t", data={}
            )
            rt.store.put_step(replace(row, step_id=2))
            seen = rt.store.newest_event(record.id)
        assert seen == list(rt.store.events(record.id))[-1].hash
        assert rt.store.verify_audit().ok
    finally:
        rt.close()


# -- one step at a time (an orchestrator's activity): the retry's record --------------------------------------------
@tool(idempotent=True, retries=2, name="lookup")
def lookup(n: int) -> int:
    """Fails; meanwhile the plan is taken over (the orchestrator's lease ran out)."""
    _take_over("intruder")
    raise RuntimeError("the service is busy")


def test_a_step_run_alone_records_no_retry_after_the_plan_was_taken_over(db: str) -> None:
    """A step run alone (Engine.one) whose call failed and may be retried: its retry was recorded (the event
    step.retrying) with no fence, by a runner that had lost the plan, before the retry's own start
    found the lease gone. Every transaction of the step commits only under the lease."""
    from plangate.engine import Engine
    from plangate.timeouts import Backoff

    _state.update(db=db)
    rt = Runtime(Catalogue([lookup]), db=db)
    try:
        record = rt.submit(plan({"id": 1, "tool": "lookup", "params": {"n": 1}}), "ann")
        rt.approve(record.id, "ben", record.hash)
        claim = rt.start(record.id, actor="orchestrator", owner="orchestrator#1@elsewhere")
        now = Backoff(first=0.0, cap=0.0)
        engine = Engine(store=rt.store, catalogue=Catalogue([lookup]), clock=rt.clock, owner=claim.owner, backoff=now)
        with pytest.raises(LeaseLostError, match="held by intruder"):
            engine.stepper(record.id, claim.plan.version, claim.body).one(1)
        assert [e.kind for e in rt.trace(record.id)][-2:] == ["run.started", "step.started"]
        assert rt.store.verify_audit().ok
    finally:
        rt.close()
        _state.clear()


# -- a ReAct run stopped as dead while its runner was still asking the model -------------------------------------
@tool(effect="write", name="post")
def post(text: str) -> str:
    return "posted"


def test_a_react_run_stopped_as_dead_is_not_revived_by_the_runner_that_lost_it(db: str) -> None:
    """The runner looked dead while the model thought (its lease ran out), and a resume stopped the run (halted:
    an action may or may not have happened). The model then asked for a write: the runner that had lost the
    run recorded the action and moved the stopped run on to pending approval, a new version beside it; a
    person's approval would then have run it. A runner that lost its run changes nothing of it."""
    from plangate.models.test import FunctionModel
    from plangate.react import ReActAgent
    from plangate.store import open_store

    store, other = open_store(db), open_store(db)

    def think(request: Any) -> str:
        with psycopg.connect(db, autocommit=True) as conn:
            (run_id,) = conn.execute("SELECT id FROM plans WHERE kind = 'react'").fetchone()
            conn.execute("UPDATE plans SET lease_until = '2000-01-01T00:00:00.000000Z' WHERE id = %s", (run_id,))
        assert ReActAgent(FunctionModel(lambda _: "never"), Catalogue([post]), other).resume(run_id).status == "stopped"
        return "Thought: post it.\nAction: post[hello]"

    try:
        with pytest.raises(LeaseLostError):
            ReActAgent(FunctionModel(think), Catalogue([post]), store).run("post hello")
        (row,) = store.list_plans()
        assert (row.status, row.version) == ("halted", 0)
        assert [e.kind for e in store.events(row.id)][-1] == "react.stopped"
        assert store.verify_audit().ok
    finally:
        store.close()
        other.close()
