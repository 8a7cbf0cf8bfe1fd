"""A store outage in the middle of a run: the worker keeps what its tools already answered.

The connections are cut from inside a step's tool call (:mod:`tests.outage`); the run's take-back is the
runtime's own (``Runtime.drive``, tested directly in ``tests/test_runtime_outage.py``): here, that a worker's
runs get it, under the worker's lease, with its pool and its drain.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest

from plangate import Catalogue, ledger
from plangate.errors import StoreError
from plangate.runtime import Runtime
from plangate.store import open_store
from plangate.worker import Worker
from tests import outage
from tests.helpers import plan
from tests.outage import CALLS, PAID, cut_armed_commits, ran_once_and_verifies, submitted, tools


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

    def refused(self: Runtime) -> None:  # the store stays out of reach once cut
        raise StoreError("cannot open the PostgreSQL store: connection refused")

    monkeypatch.setattr(Runtime, "_reconnect", refused)
    with caplog.at_level(logging.ERROR, logger="plangate.worker"):
        result, w = run_one(pg_db, lease_seconds=1.0)
    assert result is None
    assert len(w.failed) == 1 and "lost its store" in w.failed[0]
    said = [r.getMessage() for r in caplog.records if "not back within the run's lease" in r.getMessage()]
    assert len(said) == 1 and "steps [1]) are not recorded" in said[0], said
    with closing(open_store(pg_db)) as store:
        assert store.steps(plan_id)[1].status == "started"  # for the next claim to decide, as before


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
