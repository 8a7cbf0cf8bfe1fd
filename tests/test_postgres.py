"""The PostgreSQL store and workers, against a real PostgreSQL server on loopback."""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from plangate import Catalogue, Policy, tool
from plangate.errors import LeaseLostError, StoreError
from plangate.runtime import Runtime
from plangate.store import _log, open_store, postgres
from plangate.worker import Worker
from tests.conftest import load_plan
from tests.helpers import a_late_outcome_is_not_recorded, plan, until, waiting_for_the_log


@pytest.fixture
def db(pg_db: str) -> str:
    """A fresh database on the session's cluster (tests/conftest.py)."""
    return pg_db


def test_the_governed_path_on_postgresql(db: str, catalogue: Catalogue, policy: Policy) -> None:
    rt = Runtime(catalogue, policy, db=db)
    record = rt.submit(load_plan("refund"), "alice")
    rt.approve(record.id, "dave", record.hash)
    rt.approve(record.id, "carol", record.hash)
    result = rt.execute(record.id)
    assert result.ok and result.outputs[4] == "message-1"
    assert rt.execute(record.id).ran == ()
    assert [e.kind for e in rt.trace(record.id)][-1] == "run.succeeded"
    assert rt.store.verify_audit().ok
    rt.close()
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("UPDATE events SET actor = 'mallory' WHERE seq = 5")
    with closing(open_store(db)) as store:
        report = store.verify_audit()
    assert not report.ok and report.bad_seq == 5 and "it was edited" in (report.problem or "")


def test_concurrent_writers_chain_the_audit_log(db: str, catalogue: Catalogue) -> None:
    def submit_many() -> None:
        rt = Runtime(catalogue, db=db)
        for _ in range(10):
            rt.submit(load_plan("refund"), "alice")
        rt.close()

    threads = [threading.Thread(target=submit_many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with closing(open_store(db)) as store:
        report = store.verify_audit()
    assert report.ok and report.events == 40 * 3


# -- a transaction's writes go out together ------------------------------------------------


@tool
def double(n: int) -> int:
    """Twice n."""
    return 2 * n


def _chain(steps: int) -> dict[str, Any]:
    return plan(
        *(
            {"id": i, "tool": "double", "params": {"n": 1 if i == 1 else f"${{{i - 1}}}"}, "rationale": "r"}
            for i in range(1, steps + 1)
        )
    )


@contextmanager
def _statements() -> Iterator[list[str]]:
    sent: list[str] = []
    original = psycopg.Cursor.execute

    def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(" ".join(str(query).split()))
        return original(self, query, *args, **kwargs)

    psycopg.Cursor.execute = execute  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        psycopg.Cursor.execute = original  # type: ignore[method-assign]


def test_a_steps_transaction_is_four_round_trips(db: str) -> None:
    """Between two steps of a chain: the log's lock carries the step rows, one statement writes the
    events, the plan's seal and the head, and the commit; each write still counts its rows."""
    rt = Runtime(Catalogue([double]), db=db)
    record = rt.submit(_chain(4), "ann")
    rt.approve(record.id, "ben", record.hash)
    with _statements() as sent:
        result = rt.execute(record.id)
    assert result.ok and result.outputs[4] == 16
    assert rt.store.verify_audit().ok
    rt.close()
    begins = [i for i, text in enumerate(sent) if text == "BEGIN"]
    middle = sent[begins[-3] : begins[-2]]  # step 3 finishes and step 4 starts
    assert len(middle) == 4, middle
    assert middle[1].startswith("WITH w0 AS (UPDATE steps") and "INSERT INTO steps" in middle[1]
    assert middle[1].endswith(
        "FOR UPDATE) SELECT r.*, (SELECT COUNT(*) FROM w0), (SELECT COUNT(*) FROM w1) FROM"
        " (SELECT 1) AS one LEFT JOIN r ON TRUE"
    )
    assert middle[2].startswith("WITH w0 AS (INSERT INTO events") and "UPDATE audit_head" in middle[2]
    assert middle[3] == "COMMIT"


def test_a_plan_from_its_claim_to_its_end_costs_few_statements(db: str) -> None:
    """A worker's plan of three chained steps: the claim is one statement (a transaction of its own,
    no BEGIN and COMMIT around it); the plan's row and its version are read together; the run reads
    neither its step rows (its claim held them against the log) nor the plan's row at its end (it
    moves on from the row it claimed, while its owner still holds it): 35 statements, 42 before."""
    rt = Runtime(Catalogue([double]), db=db)
    record = rt.submit(_chain(3), "ann")
    rt.approve(record.id, "ben", record.hash)
    worker = Worker(Catalogue([double]), db=db, concurrency=1)
    worker._claiming()  # its claiming connection open (and its schema checked) before counting
    with _statements() as sent:
        worker.serve(drain=True)
    worker.close()
    assert rt.get(record.id).status == "succeeded" and rt.store.verify_audit().ok
    rt.close()
    claim = next(i for i, text in enumerate(sent) if text.startswith("UPDATE plans SET lease_owner"))
    assert sent[claim - 1 : claim] != ["BEGIN"] and sent[claim + 1] != "COMMIT"
    assert not any(text.startswith("SELECT id, status, version") for text in sent)  # the plan's row alone
    assert not any(text.startswith("SELECT plan_id, version, hash, body") for text in sent)  # a version alone
    assert sum(text.startswith("SELECT plan_id, step_id") for text in sent) == 1  # the claim's proof only
    end = max(i for i, text in enumerate(sent) if text == "COMMIT")
    run = [text for text in sent[claim : end + 1] if text != "SELECT version FROM plangate_schema"]  # a runner's
    assert len(run) <= 35, "\n".join(run)  # connection opened


def test_a_store_at_this_schema_version_opens_with_one_statement(db: str) -> None:
    """No lock taken by every connection that opens (a worker opens one per runner): the version is read
    first; a store newer than this plangate is still refused."""
    open_store(db).close()  # migrated
    with _statements() as sent:
        open_store(db).close()
    assert sent == ["SELECT version FROM plangate_schema"]
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("UPDATE plangate_schema SET version = version + 1")
    with pytest.raises(StoreError, match="newer than this plangate understands"):
        open_store(db)


def test_an_outcome_that_comes_back_after_its_step_was_settled_is_not_recorded(db: str) -> None:
    """The finished step's write waits for the commit: the row it should change has moved on, so the
    transaction fails there, and nothing of it is written."""
    a_late_outcome_is_not_recorded(db)


def test_writes_to_one_row_in_one_transaction_land_in_order(db: str) -> None:
    """Two writes to one step's row never share a statement (PostgreSQL would apply only one)."""
    rt = Runtime(Catalogue([double]), db=db)
    record = rt.submit(_chain(1), "ann")
    rt.approve(record.id, "ben", record.hash)
    rt.execute(record.id)
    store = rt.store
    row = store.steps(record.id)[1]
    with store.transaction():
        store.put_step(replace(row, status="started", attempt=row.attempt + 1, output=None))
        store.finish_step(
            record.id,
            1,
            attempt=row.attempt + 1,
            status="succeeded",
            output=99,
            error=None,
            at=row.started_at,
            lost="not reached",
        )
    assert (store.steps(record.id)[1].status, store.steps(record.id)[1].output) == ("succeeded", 99)
    with pytest.raises(LeaseLostError, match="the row moved"), store.transaction():
        store.finish_step(
            record.id,
            1,
            attempt=row.attempt + 1,
            status="failed",
            output=None,
            error="x",
            at=row.started_at,
            lost="the row moved",
        )
    assert store.steps(record.id)[1].output == 99
    rt.close()


# -- one process's appending transactions queue in the process --------------------------------


def _append(store: Any, kind: str) -> None:
    store.append_event(plan_id=None, version=None, step_id=None, kind=kind, actor="t", at="2026-12-01", data={})


def _second_appender(db: str) -> tuple[threading.Thread, threading.Event]:
    """Another connection of this process that appends once, in a thread; the event is set when it has."""
    done = threading.Event()

    def append() -> None:
        with closing(open_store(db)) as store, store.transaction():
            _append(store, "test.second")
        done.set()

    thread = threading.Thread(target=append)
    thread.start()
    return thread, done


def test_a_process_sends_one_transaction_at_a_time_to_wait_for_the_log(db: str) -> None:
    """While one connection of this process holds the log's lock, another that wants it waits in
    the process (nothing of it waits in the database), and goes on as soon as the first commits."""
    with closing(open_store(db)) as first:
        with first.transaction():
            _append(first, "test.first")
            thread, done = _second_appender(db)
            time.sleep(0.3)  # it has had time to reach the log's lock, and waits for it
            assert not done.is_set() and waiting_for_the_log(db) == 0
        assert done.wait(10) and not postgres._QUEUES[db].locked()
        thread.join()
        assert first.verify_audit().ok


def test_a_transaction_kept_waiting_in_the_process_queues_in_the_database(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process's queue only orders: a transaction that waited QUEUE_WAIT for it waits for the
    log's lock in the database instead, where any deadlock would be found, not in the process."""
    monkeypatch.setattr(postgres, "QUEUE_WAIT", 0.2)
    with closing(open_store(db)) as first:
        with first.transaction():
            _append(first, "test.first")
            thread, done = _second_appender(db)
            until("the second waits in the database", lambda: waiting_for_the_log(db) == 1)
            assert not done.is_set()
        assert done.wait(10)
        thread.join()
        assert not postgres._QUEUES[db].locked() and first.verify_audit().ok


def test_a_transaction_that_fails_leaves_the_process_queue_free(db: str) -> None:
    with closing(open_store(db)) as store:
        with pytest.raises(RuntimeError), store.transaction():
            _append(store, "test.failed")
            assert postgres._QUEUES[db].locked()
            raise RuntimeError("the caller gave up")
        assert not postgres._QUEUES[db].locked()
        with store.transaction():
            _append(store, "test.after")
        assert not postgres._QUEUES[db].locked() and store.verify_audit().ok


class _Cancelled(BaseException):
    """What Temporal's SDK raises in a sync activity's thread to cancel it (plangate.finish takes them)."""


def _raise_in(thread: threading.Thread) -> None:
    """Raise _Cancelled in ``thread`` as Temporal does: at the next bytecode it runs, wherever that is."""
    assert thread.ident is not None
    assert ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_Cancelled)) == 1


def _in_the_process_queue(thread: threading.Thread) -> bool:
    """Whether ``thread`` is waiting for the process's queue: in _head_for_append, not yet at the database."""
    names = []
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None and frame.f_code.co_name != "_head_for_append":
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return frame is not None and "_read_one" not in names


def test_a_transaction_cancelled_while_it_waits_in_the_process_queue_leaves_it_free(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception raised in a waiting thread from outside (Temporal's cancel of the plan's finish,
    a local activity) comes when the thread next runs Python: just after it took the queue. The
    transaction then rolls back, and the queue must be free again, not held for the process's life
    (each later append would wait QUEUE_WAIT behind nobody)."""
    monkeypatch.setattr(postgres, "QUEUE_WAIT", 60.0)
    ended: list[str] = []

    def cancelled_appender() -> None:
        try:
            with closing(open_store(db)) as store, store.transaction():
                _append(store, "test.cancelled")
        except _Cancelled:
            ended.append("cancelled")

    with closing(open_store(db)) as first:
        with first.transaction():
            _append(first, "test.first")
            thread = threading.Thread(target=cancelled_appender)
            thread.start()
            until("the thread waits in the process queue", lambda: _in_the_process_queue(thread))
            _raise_in(thread)
        thread.join(10)
        assert ended == ["cancelled"] and not postgres._QUEUES[db].locked()
        with first.transaction():
            _append(first, "test.after")
        assert first.verify_audit().ok and [e.kind for e in first.events()] == ["test.first", "test.after"]


def test_the_check_after_a_chains_newest_event_reads_by_plan_prev_not_the_whole_log(db: str) -> None:
    """The right to run looks for an event that continues a chain after its newest (plan_prev = H,
    seq > S): through the index on plan_prev alone, whatever the planner thinks of sorting (not ANDed
    with the events after S from the primary key: a third of the statement's time with 1,500 events). Ordered by
    seq it could walk every event after S instead (it did, with the statistics of a growing log:
    8 ms a run start in the soak's later thousands, against 2)."""
    with closing(open_store(db)) as store, store.transaction():
        for number in range(50):
            _append(store, f"test.kind{number % 5}")
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("SET enable_sort = off")  # a plan that sorts looks dear: only an index may avoid it
        query = _log._FOLLOWS.replace("?", "%s")
        plan = conn.execute("EXPLAIN " + query, (1, 1, 1, "0" * 64, 1)).fetchall()
    lines = [row[0] for row in plan]
    continues = lines.index(next(line for line in lines if "events_plan_prev" in line))
    assert sum("events_plan_prev" in line for line in lines) == 1, "\n".join(lines)
    assert "events_pkey" not in "".join(lines[continues - 3 : continues + 3]), "\n".join(lines)  # not ANDed


def _record(store: Any, writer: int, number: int) -> None:
    """A transaction of two events of one chain each: the kind's (events of no plan) and the writer's plan's."""
    with store.transaction():
        for plan_id in (None, f"plan-of-{writer}"):
            store.record_event(
                plan_id=plan_id, version=None, step_id=None, kind="test.shared", actor=f"w{writer}",
                at="2026-12-01", data={"n": number},
            )  # fmt: skip


def test_appenders_on_one_chain_at_once_keep_it_whole(db: str) -> None:
    """Four connections at once, each appending to one shared chain and to a plan's of its own."""
    stores = [open_store(db) for _ in range(4)]

    def record(store: Any, writer: int) -> None:
        for number in range(25):
            _record(store, writer, number)

    threads = [threading.Thread(target=record, args=(store, i)) for i, store in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for store in stores:
        store.close()
    with closing(open_store(db)) as store:
        assert store.verify_audit().ok and len(store.verified_events("test.shared")) == 100
