"""The PostgreSQL store's deferred writes and the log's lock, under contention, on a real server."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import closing
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from plangate import Catalogue, tool
from plangate.errors import LeaseLostError
from plangate.runtime import Runtime
from plangate.store import open_store
from plangate.store.postgres import _LOG_LOCK
from tests.helpers import plan, until, waiting_for_the_log


@pytest.fixture
def db(pg_db: str) -> str:
    """A fresh database on the session's cluster (tests/conftest.py)."""
    return pg_db


@tool
def echo(n: int) -> int:
    """n."""
    return n


def _ran_one_step(db: str) -> tuple[Runtime, str]:
    rt = Runtime(Catalogue([echo]), db=db)
    record = rt.submit(plan({"id": 1, "tool": "echo", "params": {"n": 1}}), "ann")
    rt.approve(record.id, "ben", record.hash)
    assert rt.execute(record.id).ok
    return rt, record.id


def _wait_for_the_log(db: str) -> None:
    """Until some transaction of this database waits for the log's advisory lock."""
    until("a transaction waits for the log's lock", lambda: waiting_for_the_log(db) > 0)


def _in_thread(body: Callable[[], Any]) -> tuple[threading.Thread, list[BaseException]]:
    raised: list[BaseException] = []

    def run() -> None:
        try:
            body()
        except BaseException as exc:  # handed to the test
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, raised


def test_an_appender_that_waited_for_the_log_chains_after_the_one_it_waited_for(db: str) -> None:
    """The waiting appender's statement began before the holder committed: its head is still the newest."""
    with closing(open_store(db)) as first, closing(open_store(db)) as second:
        written: list[Any] = []

        def append() -> None:
            with second.transaction():
                written.append(second.append_event(**_event("second")))

        with first.transaction():
            mine = first.append_event(**_event("first"))
            thread, raised = _in_thread(append)
            _wait_for_the_log(db)
        thread.join()
        assert not raised and written[0].prev == mine.hash and written[0].seq == mine.seq + 1
        assert first.verify_audit().ok


def _event(actor: str) -> dict[str, Any]:
    return {"plan_id": None, "version": None, "step_id": None, "kind": "probe", "actor": actor, "at": "t", "data": {}}


def test_a_step_write_waiting_for_the_log_does_not_hold_its_row(db: str) -> None:
    """The step's write goes out with the log's lock, and is applied once the lock is had: a person who
    holds the log and settles the step meanwhile is not blocked by it, and the late outcome fails."""
    rt, plan_id = _ran_one_step(db)
    row = rt.store.steps(plan_id)[1]
    with rt.store.transaction():
        rt.store.put_step(replace(row, status="started", attempt=2, output=None, finished_at=None))
    rt.close()
    with closing(open_store(db)) as store, psycopg.connect(db, autocommit=True) as person:

        def finish() -> None:
            with store.transaction():
                store.finish_step(plan_id, 1, attempt=2, status="succeeded", output=5, error=None, at="t", lost="moved")
                store.lock_log()

        person.execute("BEGIN")
        person.execute("SELECT pg_advisory_xact_lock(%s)", (_LOG_LOCK,))
        thread, raised = _in_thread(finish)
        _wait_for_the_log(db)
        person.execute("SET LOCAL lock_timeout = '20s'")
        person.execute("UPDATE steps SET status = 'outcome_unknown' WHERE plan_id = %s AND step_id = 1", (plan_id,))
        person.execute("COMMIT")
        thread.join()
        assert [str(exc) for exc in raised] == ["moved"] and isinstance(raised[0], LeaseLostError)
        assert store.steps(plan_id)[1].status == "outcome_unknown"


def test_more_waiting_writes_than_one_statement_takes_go_out_one_by_one(db: str) -> None:
    """Over the waiting writes' parameter bound, they go out one by one before the log's lock."""
    rt, plan_id = _ran_one_step(db)
    row = rt.store.steps(plan_id)[1]
    with rt.store.transaction():
        for step_id in range(2, 2002):  # 11 parameters each: more than a statement of waiting writes takes
            rt.store.put_step(replace(row, step_id=step_id))
        rt.store.append_event(**_event("many"))
    assert len(rt.store.steps(plan_id)) == 2001 and rt.store.verify_audit().ok
    rt.close()


def test_a_transaction_may_record_more_events_than_one_statement_takes(db: str) -> None:
    """The events a transaction records go out in INSERTs of a bounded size, chained as one."""
    rt, _ = _ran_one_step(db)
    with rt.store.transaction():
        for _ in range(6000):  # 12 parameters each: 72,000, over PostgreSQL's 65,535 a statement
            rt.store.record_event(**_event("many"))
    assert rt.store.verify_audit().ok
    rt.close()


def test_a_lease_lost_during_a_call_fails_the_next_transaction_at_its_commit(db: str) -> None:
    """The fence goes out with the commit's writes; its failure names the holder, and none of them land."""

    @tool
    def taken(n: int) -> int:
        """Meanwhile another worker takes the plan over."""
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("UPDATE plans SET lease_owner = 'intruder' WHERE kind = 'plan'")
        return n

    rt = Runtime(Catalogue([taken, echo]), db=db)
    steps = ({"id": 1, "tool": "taken", "params": {"n": 1}}, {"id": 2, "tool": "echo", "params": {"n": "${1}"}})
    record = rt.submit(plan(*steps), "ann")
    rt.approve(record.id, "ben", record.hash)
    with pytest.raises(LeaseLostError, match="held by intruder: the lease on plan"):
        rt.execute(record.id)
    assert {k: r.status for k, r in rt.store.steps(record.id).items()} == {1: "started"}
    assert [e.kind for e in rt.trace(record.id)][-1] == "step.started" and rt.store.verify_audit().ok
    rt.close()
