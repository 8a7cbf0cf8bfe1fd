"""A store outage in the middle of a run: the worker keeps what its tools already answered.

The PostgreSQL connections are cut (as a server restart, ``pg_terminate_backend`` or a network cut
does) from inside a step's tool call, so the cut lands exactly while the step is in its call: the
tool has answered, and the run's next transaction finds its connection gone.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import psycopg
import pytest

from plangate import Catalogue, RunContext, ledger, lifecycle, timeouts, tool
from plangate._clock import SystemClock, iso
from plangate.errors import StoreError
from plangate.runtime import Runtime
from plangate.store import open_store
from plangate.store.postgres import PostgresStore
from plangate.worker import Worker
from tests.helpers import plan, until

CALLS: list[tuple[str, int]] = []
DB: dict[str, str] = {}  # the database the tools cut the connections of


@pytest.fixture(autouse=True)
def quick_retries(pg_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(timeouts, "STORE_RETRY_SECONDS", (0.05, 0.2))
    CALLS.clear()
    DB["url"] = pg_db
    yield
    DB.clear()


def cut_every_connection() -> None:
    """Every other connection to the database is ended by the server, the run's and its lease's included."""
    with closing(psycopg.connect(DB["url"], autocommit=True)) as admin:
        cut = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    assert cut


@tool(effect="irreversible")
def pay(amount: int, ctx: RunContext) -> str:
    """Pay; the store goes away while the payment is made (it succeeds)."""
    CALLS.append((ctx.plan_id, ctx.step_id))
    cut_every_connection()
    return f"paid {amount}"


@tool(effect="write", idempotent=True)
def put(n: int, ctx: RunContext) -> int:
    """An idempotent write; the store goes away during its first call."""
    CALLS.append((ctx.plan_id, ctx.step_id))
    if len(CALLS) == 1:
        cut_every_connection()
    return n


@tool(effect="irreversible")
def ship(n: int, ctx: RunContext) -> int:
    """A step that is not idempotent after the cut."""
    CALLS.append((ctx.plan_id, ctx.step_id))
    return n


@tool(effect="write", idempotent=True)
def note(n: int, ctx: RunContext) -> int:
    """A step after the cut: the run carries on."""
    CALLS.append((ctx.plan_id, ctx.step_id))
    return n


def tools() -> list[Any]:
    return [pay, put, note, ship, pay_first, pay_beside, pay_then_stop, pay_and_lose_the_lease, pay_then_cut_the_commit]


def submitted(db: str, *steps: dict[str, Any]) -> str:
    rt = Runtime(Catalogue(tools()), db=db)
    record = rt.submit(plan(*steps), "ann")
    rt.approve(record.id, "ben", record.hash)
    rt.close()
    return record.id


def ran_once_and_verifies(db: str, plan_id: str, steps: int, restarted: int | None = None) -> None:
    """Each step's tool was called once and its outcome recorded once; only ``restarted``, whose start was
    recorded as the store went away, before its call, started twice; the whole log verifies."""
    assert sorted(collections.Counter(CALLS).values()) == [1] * steps  # each step's tool called once
    with closing(open_store(db)) as store:
        kinds = collections.Counter((e.kind, e.step_id) for e in store.events(plan_id))
        assert all(kinds[("step.succeeded", s)] == 1 for s in range(1, steps + 1))  # recorded once
        assert all(kinds[("step.started", s)] == 1 + (s == restarted) for s in range(1, steps + 1))
        assert kinds[("step.retrying", restarted)] == (restarted is not None)
        report = ledger.verify(store)
        assert report.ok, str(report)
        row = store.get_plan(plan_id)
        assert row is not None and row.lease_owner is None
    rt = Runtime(Catalogue(tools()), db=db)
    replayed = rt.replay(plan_id)  # the engine's decisions made again over the log agree with it
    rt.close()
    assert replayed.ok, replayed


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


PAID = threading.Event()


@tool(effect="irreversible")
def pay_first(amount: int, ctx: RunContext) -> str:
    """Pay; the store goes away while the payment is made; the payment beside it then ends too."""
    CALLS.append((ctx.plan_id, ctx.step_id))
    cut_every_connection()
    PAID.set()
    return f"paid {amount}"


@tool(effect="irreversible")
def pay_beside(amount: int, ctx: RunContext) -> str:
    """A payment in flight beside the first, which ends once the store is gone."""
    CALLS.append((ctx.plan_id, ctx.step_id))
    assert PAID.wait(30)
    return f"paid {amount} too"


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

    made = Worker._new_runtime
    opened: list[Runtime] = []

    def refused_after_the_first(self: Worker) -> Runtime:
        if opened:  # the store stays out of reach once cut
            raise StoreError("cannot open the PostgreSQL store: connection refused")
        opened.append(made(self))
        return opened[0]

    monkeypatch.setattr(Worker, "_new_runtime", refused_after_the_first)
    with caplog.at_level(logging.ERROR, logger="plangate.worker"):
        result, w = run_one(pg_db, lease_seconds=1.0)
    assert result is None
    assert len(w.failed) == 1 and "lost its store" in w.failed[0]
    said = [r.getMessage() for r in caplog.records if "not back within the lease" in r.getMessage()]
    assert len(said) == 1 and "steps [1]) are not recorded" in said[0], said
    with closing(open_store(pg_db)) as store:
        assert store.steps(plan_id)[1].status == "started"  # for the next claim to decide, as before


def test_the_last_wait_for_the_store_is_cut_short_to_try_once_more_within_the_lease(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waits between tries double (0.4 s, 0.8 s, then 1.6 s): a worker whose next whole wait would overrun
    the lease gave up there, with a third of the lease (with a 30 s lease, 14.5 s) still to go, and the payment
    its tool had answered was left for a person to settle. The last wait now ends at the lease's end, and the
    store back by then gets the outcome recorded."""
    monkeypatch.setattr(timeouts, "STORE_RETRY_SECONDS", (0.4, 30.0))
    plan_id = submitted(
        pg_db, {"id": 1, "tool": "pay", "params": {"amount": 5}}, {"id": 2, "tool": "note", "params": {"n": 1}}
    )
    made = Worker._new_runtime
    tries: list[int] = []

    def back_at_the_third_try(self: Worker) -> Runtime:
        tries.append(1)
        if 1 < len(tries) <= 3:  # the pool's runtime first; then the store is away for two tries
            raise StoreError("cannot open the PostgreSQL store: connection refused")
        return made(self)

    monkeypatch.setattr(Worker, "_new_runtime", back_at_the_third_try)
    result, w = run_one(pg_db, lease_seconds=2.0)
    assert result is not None and result.status == "succeeded", (result, w.failed)
    assert result.outputs == {1: "paid 5", 2: 1}
    assert len(tries) == 4
    ran_once_and_verifies(pg_db, plan_id, 2)


STOPPING: list[Worker] = []  # the worker a SIGTERM stops while its run is cut off


@tool(effect="irreversible")
def pay_then_stop(amount: int, ctx: RunContext) -> str:
    """Pay; the store goes away while the payment is made, and the worker is told to stop (a SIGTERM)."""
    CALLS.append((ctx.plan_id, ctx.step_id))
    cut_every_connection()
    STOPPING[0].stop()
    return f"paid {amount}"


def test_a_stop_lets_a_run_cut_off_take_itself_back_within_the_drain(pg_db: str) -> None:
    """A stop drains: running plans go on for up to the drain timeout. A run cut off from its store gave up
    waiting for it at the stop, at once, and the payment its tool had answered was left for a person to
    settle. It now takes itself back and records it; only the drain's end (its lease given back) stops it."""
    plan_id = submitted(pg_db, {"id": 1, "tool": "pay_then_stop", "params": {"amount": 5}})
    w = Worker(Catalogue(tools()), db=pg_db)
    STOPPING[:] = [w]
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
    made = Worker._new_runtime
    opened: list[Runtime] = []

    def refused_after_the_first(self: Worker) -> Runtime:
        if opened:
            raise StoreError("cannot open the PostgreSQL store: connection refused")
        opened.append(made(self))
        return opened[0]

    monkeypatch.setattr(Worker, "_new_runtime", refused_after_the_first)
    w = Worker(Catalogue(tools()), db=pg_db, lease_seconds=30.0, drain_timeout=0.2)
    STOPPING[:] = [w]

    def gave_up() -> bool:
        return any(plan_id in m and "given up at the drain" in m for m in caplog.messages)

    with caplog.at_level(logging.ERROR, logger="plangate.worker"):
        try:
            w.serve(poll=0.05)
            until("the run gave up at the drain's end", gave_up)
        finally:
            w.close()
    assert w.left == [plan_id]
    assert not any("not back within the lease" in m for m in caplog.messages)


@tool(effect="irreversible")
def pay_and_lose_the_lease(amount: int, ctx: RunContext) -> str:
    """Pay; the store goes away, the lease runs out meanwhile, and another runner takes the plan over."""
    CALLS.append((ctx.plan_id, ctx.step_id))
    cut_every_connection()
    with closing(open_store(DB["url"])) as store:
        until(
            "the lease ran out",
            lambda: not lifecycle.lease_is_live(store.get_plan(ctx.plan_id), iso(SystemClock().now())),  # type: ignore[arg-type]
            limit=20,
        )
    taken_over: list[Any] = []

    def take_over() -> None:
        rt = Runtime(Catalogue(tools()), db=DB["url"])
        taken_over.append(rt.resume(ctx.plan_id))
        rt.close()

    thread = threading.Thread(target=take_over)
    thread.start()  # on a thread of its own: this one is the run's, inside the engine's loop
    thread.join(30)
    assert taken_over[0].status == "halted"  # the other runner's rules: a payment started, no outcome
    return f"paid {amount}"


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


ARMED: dict[str, int] = {}  # the thread whose next commit is cut in flight


@tool(effect="irreversible")
def pay_then_cut_the_commit(amount: int, ctx: RunContext) -> str:
    """Pay; the transaction that records the payment commits, and its connection breaks before the answer."""
    CALLS.append((ctx.plan_id, ctx.step_id))
    ARMED["thread"] = threading.get_ident()
    return f"paid {amount}"


def cut_armed_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The armed thread's next commit goes through, and its connection breaks before the answer comes."""
    real = PostgresStore._at_once

    def at_once(self: PostgresStore, query: str, params: tuple[Any, ...] = ()) -> Any:
        answer = real(self, query, params)
        if query == "COMMIT" and ARMED.get("thread") == threading.get_ident():
            del ARMED["thread"]
            pid = self._conn.info.backend_pid
            with closing(psycopg.connect(DB["url"], autocommit=True)) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            raise psycopg.OperationalError("the connection broke before the commit's answer came")
        return answer

    monkeypatch.setattr(PostgresStore, "_at_once", at_once)


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
    assert "had ended" in caplog.text
    ran_once_and_verifies(pg_db, plan_id, 1)
