"""A store outage in the middle of a run: the worker keeps what its tools already answered.

The connections are cut from inside a step's tool call (:mod:`tests.outage`); the run's take-back is the
runtime's own (``Runtime.drive``, tested directly in ``tests/test_runtime_outage.py``): here, that a worker's
runs get it, under the worker's lease, with its pool and its drain.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest

from plangate import Catalogue, ledger, timeouts
from plangate.errors import StoreError
from plangate.policy import Policy
from plangate.runtime import Runtime
from plangate.store import open_store
from plangate.worker import Worker
from tests import outage
from tests.helpers import ROLLING, plan, rolled_back_on_halt, until
from tests.outage import CALLS, PAID, cut_armed_commits, ran_once_and_verifies, store_stays_away, submitted, tools
from tests.test_runtime_outage import book, declined, refund


@pytest.fixture(autouse=True)
def quick_retries(pg_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from outage.quick_retries(pg_db, monkeypatch)


def run_one(db: str, **options: Any) -> Any:
    w = Worker(Catalogue(tools()), db=db, **options)
    try:
        return w.run_one(), w
    finally:
        w.close()


def test_a_known_payment_is_recorded_after_the_store_comes_back(pg_db: str) -> None:
    """The payment succeeded during the outage: it used to be read as started with no outcome, and the
    plan halted for a person to settle a payment plangate knew had been made. The worker now waits for
    the store, takes the run back under its own lease, records the payment once, and carries on."""
    plan_id = submitted(
        pg_db,
        {"id": 1, "tool": "pay", "params": {"amount": 5}},
        {"id": 2, "tool": "note", "params": {"n": 1}},
    )
    result, w = run_one(pg_db)
    assert result is not None and result.status == "succeeded", result
    assert result.outputs == {1: "paid 5", 2: 1}
    assert w.failed == []
    ran_once_and_verifies(pg_db, plan_id, 2)


def test_calls_in_flight_side_by_side_are_all_kept(pg_db: str) -> None:
    """Two payments run side by side; the store goes away during them: both answers are recorded."""
    PAID.clear()
    rt = Runtime(Catalogue(tools()), db=pg_db)
    body = plan(
        {"id": 1, "tool": "pay_first", "params": {"amount": 5}},
        {"id": 2, "tool": "pay_beside", "params": {"amount": 6}},
    )
    record = rt.submit({**body, "order": "dataflow"}, "ann")
    rt.approve(record.id, "ben", record.hash)
    rt.close()
    result, _ = run_one(pg_db)
    assert result is not None and result.status == "succeeded", result
    assert result.outputs == {1: "paid 5", 2: "paid 6 too"}
    ran_once_and_verifies(pg_db, record.id, 2)


def test_an_idempotent_step_is_not_called_again_after_an_outage(pg_db: str) -> None:
    plan_id = submitted(pg_db, {"id": 1, "tool": "put", "params": {"n": 7}})
    result, _ = run_one(pg_db)
    assert result is not None and result.status == "succeeded" and result.outputs == {1: 7}
    ran_once_and_verifies(pg_db, plan_id, 1)


def test_a_store_not_back_within_the_lease_fails_the_run_as_before(
    pg_db: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker waits for the store only while its lease could still hold: past that, another runner
    may hold the plan, so the run fails as any run does, and the next claim resumes it by the usual rules."""
    plan_id = submitted(pg_db, {"id": 1, "tool": "pay", "params": {"amount": 5}})

    store_stays_away(monkeypatch)
    with caplog.at_level(logging.ERROR, logger="plangate.worker"):
        result, w = run_one(pg_db, lease_seconds=1.0)
    assert result is None
    assert len(w.failed) == 1 and "lost its store" in w.failed[0]
    said = [r.getMessage() for r in caplog.records if "not back within the run's lease" in r.getMessage()]
    assert len(said) == 1 and "steps [1]) are not recorded" in said[0], said
    with closing(open_store(pg_db)) as store:
        assert store.steps(plan_id)[1].status == "started"  # for the next claim to decide, as before


def test_the_last_wait_for_the_store_is_cut_short_to_try_once_more_within_the_lease(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waits between tries double (0.4 s, 0.8 s, then 1.6 s): a run whose next whole wait would overrun
    the lease gave up there, with a third of the lease (with a 30 s lease, 14.5 s) still to go, and the payment
    its tool had answered was left for a person to settle. The last wait now ends at the lease's end, and the
    store back by then gets the outcome recorded."""
    monkeypatch.setattr(timeouts, "STORE_RETRY_SECONDS", (0.4, 30.0))
    plan_id = submitted(
        pg_db, {"id": 1, "tool": "pay", "params": {"amount": 5}}, {"id": 2, "tool": "note", "params": {"n": 1}}
    )
    made = Runtime._reconnect
    tries: list[int] = []

    def back_at_the_third_try(self: Runtime) -> None:
        tries.append(1)
        if len(tries) <= 2:  # the store is away for two tries
            raise StoreError("cannot open the PostgreSQL store: connection refused")
        made(self)

    monkeypatch.setattr(Runtime, "_reconnect", back_at_the_third_try)
    result, w = run_one(pg_db, lease_seconds=2.0)
    assert result is not None and result.status == "succeeded", (result, w.failed)
    assert result.outputs == {1: "paid 5", 2: 1}
    assert len(tries) == 3
    ran_once_and_verifies(pg_db, plan_id, 2)


def test_a_stop_lets_a_run_cut_off_take_itself_back_within_the_drain(pg_db: str) -> None:
    """A stop drains: running plans go on for up to the drain timeout. A run cut off from its store gave up
    waiting for it at the stop, at once, and the payment its tool had answered was left for a person to
    settle. It now takes itself back and records it; only the drain's end (its lease given back) stops it."""
    plan_id = submitted(pg_db, {"id": 1, "tool": "pay_then_stop", "params": {"amount": 5}})
    w = Worker(Catalogue(tools()), db=pg_db)
    outage.STOPPING[:] = [w]
    try:
        result = w.run_one()
    finally:
        w.close()
    assert result is not None and result.status == "succeeded", (result, w.failed)
    assert result.outputs == {1: "paid 5"}
    ran_once_and_verifies(pg_db, plan_id, 1)


def test_a_run_cut_off_gives_up_at_the_drains_end(
    pg_db: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The store stays away past the drain: the drain gives the run up, and its wait for the store ends there,
    not a lease later (30 s here), saying so."""
    plan_id = submitted(pg_db, {"id": 1, "tool": "pay_then_stop", "params": {"amount": 5}})

    store_stays_away(monkeypatch)
    w = Worker(Catalogue(tools()), db=pg_db, lease_seconds=30.0, drain_timeout=0.2)
    outage.STOPPING[:] = [w]

    def gave_up() -> bool:
        return any(plan_id in m and "before its runner gave it up" in m for m in caplog.messages)

    with caplog.at_level(logging.ERROR, logger="plangate.worker"):
        try:
            w.serve(poll=0.05)
            until("the run gave up at the drain's end", gave_up)
        finally:
            w.close()
    assert w.left == [plan_id]
    assert not any("within the run's lease" in m for m in caplog.messages)


def test_a_late_outcome_is_not_recorded_once_another_runner_took_the_plan(
    pg_db: str, caplog: pytest.LogCaptureFixture
) -> None:
    plan_id = submitted(pg_db, {"id": 1, "tool": "pay_and_lose_the_lease", "params": {"amount": 5}})
    with caplog.at_level(logging.WARNING, logger="plangate.worker"):
        result, _ = run_one(pg_db, lease_seconds=1.0)
    assert result is None
    said = [r.getMessage() for r in caplog.records if "not recorded" in r.getMessage()]
    assert len(said) == 1 and "steps [1]" in said[0] and "no longer holds" in said[0], said
    assert [(plan_id, 1)] == CALLS
    with closing(open_store(pg_db)) as store:
        row = store.steps(plan_id)[1]
        assert (row.status, row.output) == ("outcome_unknown", None)  # the other run's decision stands
        plan_row = store.get_plan(plan_id)
        assert plan_row is not None and plan_row.status == "halted"
        assert "step.succeeded" not in [e.kind for e in store.events(plan_id)]
        report = ledger.verify(store)
        assert report.ok, str(report)


def test_a_commit_cut_in_flight_is_read_back_not_written_twice(pg_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a commit whose answer never came took effect is not known: the worker reads the step's row
    on its return, and records the outcome only if the row is still the started one (here it is done). The
    same commit recorded the next step as started, whose tool was never called: it is not read as of unknown
    outcome (a payment a person would have to settle), it starts again."""
    cut_armed_commits(monkeypatch)
    plan_id = submitted(
        pg_db,
        {"id": 1, "tool": "pay_then_cut_the_commit", "params": {"amount": 5}},
        {"id": 2, "tool": "ship", "params": {"n": 1}},
    )
    w = Worker(Catalogue(tools()), db=pg_db)
    try:
        result = w.run_one()
    finally:
        w.close()
    assert result is not None and result.status == "succeeded", result
    assert result.outputs == {1: "paid 5", 2: 1}
    ran_once_and_verifies(pg_db, plan_id, 2, restarted=2)


def test_a_run_whose_last_commit_was_cut_in_flight_ended_and_says_so(
    pg_db: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The commit that records the last outcome and the plan's end goes through, and its answer never comes:
    the plan has ended. The worker gives back the run's result as recorded, where it logged the plan as refused
    (the claim to take the run back found it ended) and set it aside."""
    cut_armed_commits(monkeypatch)
    plan_id = submitted(pg_db, {"id": 1, "tool": "pay_then_cut_the_commit", "params": {"amount": 7}})
    caplog.set_level(logging.INFO, logger="plangate")
    result, w = run_one(pg_db)
    assert result is not None and result.status == "succeeded", result
    assert result.plan_id == plan_id and result.outputs == {1: "paid 7"}
    assert not w.refused and not w.failed, (w.refused, w.failed)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    ran_once_and_verifies(pg_db, plan_id, 1)


def test_a_worker_that_served_and_drained_before_still_takes_its_runs_back(pg_db: str) -> None:
    """A worker that served until nothing was left (``serve(drain=True)``) serves again: a run cut off from its
    store still waits for it and records the payment, where the first drain's end, never cleared, made every
    later run give up at once and leave a known payment for a person to settle."""
    w = Worker(Catalogue(tools()), db=pg_db)
    try:
        assert w.serve(drain=True, poll=0.05) == 0  # nothing to do yet: the drain ends at once
        plan_id = submitted(pg_db, {"id": 1, "tool": "pay", "params": {"amount": 5}})
        assert w.serve(drain=True, poll=0.05) == 1
    finally:
        w.close()
    assert w.failed == [], w.failed
    ran_once_and_verifies(pg_db, plan_id, 1)


@pytest.mark.parametrize("answered", [True, False], ids=["answered", "answer-lost"])
def test_a_run_that_takes_itself_back_as_the_drain_ends_leaves_no_lease_held(
    pg_db: str, monkeypatch: pytest.MonkeyPatch, answered: bool
) -> None:
    """The run's claim to take itself back commits just as the drain ends. It claimed under a new lease, which the
    worker learnt of only once the claim answered: the drain released the old one, no longer the plan's, and the
    new one was still held when serve() returned (given back by the runner afterwards, which a process that exits
    then never does; with the claim's answer lost, never). No other worker could take the plan until it ran out.
    The take-back now claims under the run's own lease, which the drain releases wherever the claim lands."""
    plan_id = submitted(pg_db, {"id": 1, "tool": "pay", "params": {"amount": 5}})
    w = Worker(Catalogue(tools()), db=pg_db, drain_timeout=0.05)
    served, start = threading.Event(), Runtime.start

    def claimed_as_the_drain_ends(self: Runtime, plan_id: str, **kwargs: Any) -> Any:
        claim = start(self, plan_id, **kwargs)
        if kwargs.get("lease") is not None:  # the take-back's claim (the run's first names no lease): it went through
            w.stop()
            assert served.wait(30)
            if not answered:  # and its connection broke before the answer came
                outage.cut_every_connection()
                self.store.query("SELECT 1")
        return claim

    monkeypatch.setattr(Runtime, "start", claimed_as_the_drain_ends)
    try:
        w.serve(poll=0.05)
        held = lease_of(pg_db, plan_id)
        served.set()
        until("the run ended", lambda: not [t for t in threading.enumerate() if t.name.startswith("plangate-worker")])
    finally:
        served.set()
        w.close()
    assert w.left == [plan_id]
    assert held is None, f"the drain ended with the plan under the lease {held}"
    assert lease_of(pg_db, plan_id) is None


def test_the_policys_rollback_waiting_for_its_store_gives_up_at_the_drains_end(
    pg_db: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The run halts, and the store goes away as the policy's rollback begins, just as the worker is stopped. The
    rollback's wait for the store did not heed the drain: it went on for the whole lease (30 s here) after the
    worker returned, and began once the store was back, under the lease the drain had given back, past it. It
    now gives up at the drain's end, as the runs do, and says to run plangate compensate."""
    rt, plan_id = rolled_back_on_halt(pg_db, [book, refund, declined], "book", "declined")
    rt.close()
    w = Worker(Catalogue([book, refund, declined]), db=pg_db, policy=Policy.from_yaml(ROLLING), drain_timeout=0.2)
    roll_back = Runtime._roll_back

    def cut_as_it_begins(self: Runtime, plan_id: str, **kwargs: Any) -> Any:
        if not w.left:  # the first try: the store goes away, and a SIGTERM comes
            store_stays_away(monkeypatch)
            outage.cut_every_connection()
            w.stop()
        return roll_back(self, plan_id, **kwargs)

    monkeypatch.setattr(Runtime, "_roll_back", cut_as_it_begins)

    def gave_up() -> bool:
        return any(plan_id in m and "before its runner gave it up" in m and "compensate" in m for m in caplog.messages)

    with caplog.at_level(logging.ERROR, logger="plangate.worker"):
        try:
            w.serve(poll=0.05)
            until("the rollback gave up at the drain's end", gave_up, limit=10)
        finally:
            w.close()
    assert w.left == [plan_id]
    with closing(open_store(pg_db)) as store:
        row = store.get_plan(plan_id)
        assert row is not None and row.status == "halted" and row.lease_owner is None


def lease_of(db: str, plan_id: str) -> str | None:
    with closing(open_store(db)) as store:
        row = store.get_plan(plan_id)
        assert row is not None
        return row.lease_owner
