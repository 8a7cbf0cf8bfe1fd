"""Workers under pressure: a runtime that cannot be built, a stop that lands during a claim, a plan
claimed again as its last run ends, a drain that gives back a run still starting (or just claimed), a lease taken over
while a step runs, a person's edit between a claim and its run, and the limit on runs at once."""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg
import pytest

from plangate import Catalogue, RunContext, timeouts, tool
from plangate import worker as worker_module
from plangate.errors import StoreError
from plangate.policy import Policy
from plangate.results import RunResult
from plangate.runtime import Runtime
from plangate.store import PlanRow, open_store
from plangate.worker import Worker
from tests import concurrencytools as tools
from tests.helpers import ROLLING, rolled_back_on_halt, until
from tests.test_worker_concurrency import submit


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/plangate.db"


@pytest.fixture
def calls() -> Iterator[list[tuple[str, int]]]:
    tools.CALLS.clear()
    yield tools.CALLS
    tools.CALLS.clear()


def serve_in_thread(w: Worker, results: list[RunResult], *, drain: bool = True, poll: float = 0.05) -> threading.Thread:
    thread = threading.Thread(
        target=w.serve, kwargs={"drain": drain, "poll": poll, "on_result": results.append}, daemon=True
    )
    thread.start()
    return thread


def test_a_runtime_that_cannot_be_built_gives_the_plan_back_and_keeps_the_slot(
    db: str, calls: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store refuses a new connection once: the claimed plan's lease is released at once, not
    left to expire, the worker's one slot is free again, and the plan runs on a later pass."""
    ids = submit(db, ["count"], 2)
    builds = iter([StoreError("cannot connect: too many clients")])

    def flaky(*args: Any, **kwargs: Any) -> Runtime:
        for refusal in builds:
            raise refusal
        return Runtime(*args, **kwargs)

    monkeypatch.setattr(worker_module, "Runtime", flaky)
    both_run_once_after_one_failure(db, ids, calls, "too many clients")


def both_run_once_after_one_failure(db: str, ids: list[str], calls: list[tuple[str, int]], failure: str) -> None:
    """A worker with one slot serves until both plans ran: each once, one failure recorded on the way
    (saying ``failure``), every lease released, the audit log intact."""
    w = Worker(Catalogue([tools.count]), db=db, concurrency=1, drain_timeout=0.5)
    results: list[RunResult] = []
    thread = serve_in_thread(w, results, drain=False, poll=0.05)
    try:
        until("both plans ran", lambda: len(results) == 2, limit=20)
    finally:
        w.stop()
        thread.join(20)
        w.close()
    assert not thread.is_alive()
    assert sorted(r.plan_id for r in results) == sorted(ids) and {r.status for r in results} == {"succeeded"}
    assert len(w.failed) == 1 and failure in w.failed[0] and not w.left
    assert sorted(collections.Counter(calls).values()) == [1, 1]
    with closing(open_store(db)) as store:
        assert {row[0] for row in store.query("SELECT lease_owner FROM plans")} == {None}
        assert store.verify_audit().ok


def test_a_runtime_that_cannot_be_built_is_not_claimed_again_at_once_by_run_one(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    (plan_id,) = submit(db, ["count"], 1)

    def broken(*_: Any, **__: Any) -> Runtime:
        raise StoreError("cannot connect")

    monkeypatch.setattr(worker_module, "Runtime", broken)
    w = Worker(Catalogue([tools.count]), db=db)
    try:
        assert w.run_one() is None  # not an endless loop of claims, and not an exception out of the worker
    finally:
        w.close()
    assert w.failed == [f"{plan_id}: cannot connect"]
    with closing(open_store(db)) as store:
        plan = store.get_plan(plan_id)
        assert plan is not None and plan.status == "approved" and plan.lease_owner is None


def test_plans_claimed_as_the_worker_is_stopped_are_given_back_not_started(
    db: str, calls: list[tuple[str, int]]
) -> None:
    """SIGTERM (stop) lands while a claim is on its way: what it claimed is released, never started."""
    ids = submit(db, ["count"], 3)
    w = Worker(Catalogue([tools.count]), db=db, concurrency=2)
    claims = w._claiming()  # the claim the signal lands in
    real = claims.claim_batch

    def claim_then_stop(*args: Any, **kwargs: Any) -> list[str]:
        claimed = real(*args, **kwargs)
        w.stop()  # what the SIGTERM handler does
        return claimed

    claims.claim_batch = claim_then_stop  # type: ignore[method-assign]
    try:
        assert w.serve(poll=0.05) == 0
    finally:
        w.close()
    assert calls == [] and not w.failed and not w.left
    with closing(open_store(db)) as store:
        for plan_id in ids:
            plan = store.get_plan(plan_id)
            assert plan is not None and plan.status == "approved"
            assert plan.lease_owner is None and plan.lease_until is None, "a claim left to expire"
            assert not [e for e in store.events(plan_id) if e.kind.startswith("run.")]


FIRST_CALL = threading.Event()
LET_GO = threading.Event()
SENT: list[tuple[str, int, int]] = []


def _send(ctx: RunContext) -> str:
    SENT.append((ctx.plan_id, ctx.step_id, ctx.attempt))
    if len(SENT) == 1:  # the first runner's call: it hangs until the test lets go
        FIRST_CALL.set()
        LET_GO.wait(30)
    return "sent"


@tool(effect="write")
def send(ctx: RunContext) -> str:
    """Send something (not idempotent)."""
    return _send(ctx)


@tool(effect="write", idempotent=True)
def put(ctx: RunContext) -> str:
    """Write something under the step's key (idempotent)."""
    return _send(ctx)


@pytest.mark.parametrize("name", ["send", "put"])
def test_a_runner_whose_lease_ran_out_mid_call_records_nothing_after_the_takeover(db: str, name: str) -> None:
    """A's lease runs out while its call hangs (its timer starved); B takes the plan over and settles
    the step as the resume rules say. A's late outcome is never recorded, and A gives back no lease."""
    FIRST_CALL.clear()
    LET_GO.clear()
    SENT.clear()
    catalogue = [send, put]
    rt = Runtime(Catalogue(catalogue), db=db)
    record = rt.submit(
        {"task": "t", "category": "c", "steps": [{"id": 1, "tool": name, "params": {}, "rationale": "r"}]}, "ann"
    )
    rt.approve(record.id, "ben", record.hash)
    a = Worker(Catalogue(catalogue), db=db, lease_seconds=600)  # its timer never fires in this test
    a_results: list[RunResult] = []
    thread = serve_in_thread(a, a_results)
    b = Worker(Catalogue(catalogue), db=db, lease_seconds=600)
    try:
        assert FIRST_CALL.wait(30)
        with rt.store.transaction():  # the lease ran out: the timer was starved
            rt.store.command("UPDATE plans SET lease_until = '2000-01-01T00:00:00Z' WHERE id = ?", (record.id,))
        taken = b.run_one()
        assert taken is not None
        LET_GO.set()
        thread.join(30)
        assert not thread.is_alive()
    finally:
        LET_GO.set()
        a.close()
        b.close()
    assert a_results == [] and not a.failed and not a.refused
    plan = rt.store.get_plan(record.id)
    assert plan is not None and plan.lease_owner is None
    kinds, sent = [e.kind for e in rt.trace(record.id)], list(SENT)
    if name == "send":  # not idempotent: never sent twice, the step halts for a person
        assert sent == [(record.id, 1, 1)]
        assert taken.status == "halted" and (taken.error or "").startswith("outcome unknown")
        assert plan.status == "halted" and "step.succeeded" not in kinds
    else:  # idempotent: B calls again under the same key; A's outcome (attempt 1) is not recorded
        assert sent == [(record.id, 1, 1), (record.id, 1, 2)]
        assert taken.status == "succeeded" and plan.status == "succeeded"
        assert kinds.count("step.succeeded") == 1
    assert rt.store.verify_audit().ok
    rt.close()


def test_an_edit_between_a_claim_and_its_run_runs_neither_body_unapproved(
    db: str, calls: list[tuple[str, int]]
) -> None:
    """A person edits the plan after a worker's batch claim and before its run starts: the old text
    does not run, nor the new one until it is approved; approved, it runs once, as approved."""
    (plan_id,) = submit(db, ["count"], 1)
    person = Runtime(Catalogue([tools.count]), db=db)
    w = Worker(Catalogue([tools.count]), db=db, concurrency=1)
    claims = w._claiming()
    real = claims.claim_batch

    def claim_then_edit(*args: Any, **kwargs: Any) -> list[str]:
        claimed = real(*args, **kwargs)
        if claimed:
            new = {
                "task": "t",
                "category": "test",
                "steps": [{"id": 1, "tool": "count", "params": {"n": 99}, "rationale": "r"}],
            }
            person.edit(plan_id, new, "alice")
        return claimed

    claims.claim_batch = claim_then_edit  # type: ignore[method-assign]
    try:
        assert w.run_one() is None
        assert calls == []
        plan = person.store.get_plan(plan_id)
        assert plan is not None and plan.status == "pending_approval" and plan.lease_owner is None
        claims.claim_batch = real  # type: ignore[method-assign]
        assert w.run_one() is None  # still waiting for approval: nothing to claim
        person.approve(plan_id, "reviewer", person.get(plan_id).hash)
        w._aside.clear()  # its wait is over
        result = w.run_one()
    finally:
        w.close()
    assert result is not None and result.status == "succeeded" and result.version == 2 and result.outputs == {1: 99}
    assert calls == [(plan_id, 1)]
    assert person.store.verify_audit().ok
    person.close()


ACTIVE = {"now": 0, "most": 0}
ACTIVE_LOCK = threading.Lock()
PAIRS: dict[str, threading.Barrier] = {}


@tool
def pair(n: int) -> int:
    """Wait for one other run to be here too, counting how many are here at once."""
    with ACTIVE_LOCK:
        ACTIVE["now"] += 1
        ACTIVE["most"] = max(ACTIVE["most"], ACTIVE["now"])
    try:
        PAIRS["barrier"].wait(timeout=30)
    finally:
        with ACTIVE_LOCK:
            ACTIVE["now"] -= 1
    return n


def test_never_more_plans_at_once_than_the_concurrency(db: str) -> None:
    """Steps meet in pairs; a third run at once would be counted (and would meet a stranger)."""
    ACTIVE.update(now=0, most=0)
    PAIRS["barrier"] = threading.Barrier(2)
    rt = Runtime(Catalogue([pair]), db=db)
    for n in range(6):
        record = rt.submit(
            {
                "task": f"p{n}",
                "category": "c",
                "steps": [{"id": 1, "tool": "pair", "params": {"n": n}, "rationale": "r"}],
            },
            "ann",
        )
        rt.approve(record.id, "ben", record.hash)
    rt.close()
    results: list[RunResult] = []
    w = Worker(Catalogue([pair]), db=db, concurrency=2)
    try:
        assert w.serve(drain=True, poll=0.05, on_result=results.append) == 6
    finally:
        w.close()
    assert {r.status for r in results} == {"succeeded"} and ACTIVE["most"] == 2
    until("nothing left running", lambda: ACTIVE["now"] == 0)


def test_a_plan_claimed_again_as_its_last_run_ends_stays_counted_and_is_drained(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run fails (the store went away) and gives its lease back; the worker claims the plan again
    before the failed run's bookkeeping is done. The new run must stay counted: else the worker runs
    more plans than its concurrency, and a stop leaves the new run's lease held instead of releasing it."""
    tools.HELD.clear()
    (plan_id,) = submit(db, ["hold"], 1)
    reclaimed = threading.Event()
    starts = iter([StoreError("server closed the connection unexpectedly")])

    class Flaky(Runtime):
        def start(self, *args: Any, **kwargs: Any) -> Any:
            failure = next(starts, None)
            if failure is None:
                return super().start(*args, **kwargs)
            release = self.store.release

            def release_then_wait(*a: Any, **k: Any) -> None:
                release(*a, **k)
                self.store.release = release  # type: ignore[method-assign]
                assert reclaimed.wait(10), "the plan was not claimed again"

            self.store.release = release_then_wait  # type: ignore[method-assign]
            raise failure

    monkeypatch.setattr(worker_module, "Runtime", Flaky)
    w = Worker(Catalogue([tools.hold]), db=db, concurrency=2, drain_timeout=0.2)
    claims = w._claiming()
    real = claims.claim_batch
    seen: list[str] = []

    def claim(*args: Any, **kwargs: Any) -> list[str]:
        claimed = real(*args, **kwargs)
        seen.extend(claimed)
        if seen.count(plan_id) == 2 and plan_id in claimed:
            reclaimed.set()
        return claimed

    claims.claim_batch = claim  # type: ignore[method-assign]
    thread = threading.Thread(target=w.serve, kwargs={"poll": 0.05}, daemon=True)
    thread.start()
    store = open_store(db)
    try:
        until("the plan's second run started", lambda: any(e.kind == "step.started" for e in store.events(plan_id)))
        w.stop()
        thread.join(20)
        assert not thread.is_alive()
        assert w.left == [plan_id], "the drain did not know of the second run"
        plan = store.get_plan(plan_id)
        assert plan is not None and plan.status == "running" and plan.lease_owner is None
    finally:
        tools.HELD.set()
        w.close()
        store.close()


def test_a_run_still_starting_when_the_drain_gives_its_claim_back_does_not_start(
    db: str, calls: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drain ends while a run is still proving its right to run (waiting for the store, say) and
    releases its claim: that run must not take the plan afterwards, as if it had never been given back."""
    plan = drained_as_the_run_begins(db, monkeypatch, claimed_first=False)
    assert calls == []
    assert plan.status == "approved" and plan.lease_owner is None


def test_a_run_whose_claim_the_drain_gives_back_as_it_begins_does_not_run_and_frees_the_plan(
    db: str, calls: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's claim has just put a lease of its own in the place of the worker's when the drain gives
    the worker's back: the run does not go on, and its own lease is released too, not left to expire. Released
    by the drain itself, as serve() returns: a process that exits then, before its runner thread gave the lease
    back, left the plan to no worker until the lease ran out."""
    plan = drained_as_the_run_begins(db, monkeypatch, claimed_first=True)
    assert calls == []
    assert plan.status == "running" and plan.lease_owner is None


def drained_as_the_run_begins(db: str, monkeypatch: pytest.MonkeyPatch, *, claimed_first: bool) -> PlanRow:
    """A worker drained while its one run is held as it begins: before its claim (then no run event is
    recorded, checked here), or just after it. The plan's row once the runner thread ended."""
    (plan_id,) = submit(db, ["count"], 1)
    reached, go_on = threading.Event(), threading.Event()

    class Held(Runtime):
        def start(self, *args: Any, **kwargs: Any) -> Any:
            claim = super().start(*args, **kwargs) if claimed_first else None
            reached.set()
            assert go_on.wait(20)
            return claim if claimed_first else super().start(*args, **kwargs)

    monkeypatch.setattr(worker_module, "Runtime", Held)
    w = Worker(Catalogue([tools.count]), db=db, drain_timeout=0.05)
    serving = threading.Thread(target=w.serve, kwargs={"poll": 0.05}, daemon=True)
    serving.start()
    try:
        assert reached.wait(20)
        (runner,) = [t for t in threading.enumerate() if t.name == f"plangate-worker-{plan_id[:8]}"]
        w.stop()
        serving.join(20)
        assert w.left == [plan_id]
        with closing(open_store(db)) as store:
            row = store.get_plan(plan_id)
            assert row is not None and row.lease_owner is None, "serve() returned with the run's lease held"
        go_on.set()
        runner.join(20)
        assert not runner.is_alive()
    finally:
        go_on.set()
        w.close()
    with closing(open_store(db)) as store:
        plan = store.get_plan(plan_id)
        assert plan is not None
        if not claimed_first:
            assert not [e for e in store.events(plan_id) if e.kind.startswith("run.")]
        return plan


def no_runner_thread_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first runner thread a worker starts cannot be started (the process out of threads)."""
    refusals = iter([RuntimeError("can't start new thread")])
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if self.name.startswith("plangate-worker-"):
            for refusal in refusals:
                raise refusal
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)


def test_a_runner_thread_that_cannot_be_started_gives_the_plan_back_and_frees_the_slot(
    db: str, calls: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process is out of threads once: the plan is released at once, not left under a lease with
    a slot taken by a run that never began, and both plans run on later passes."""
    ids = submit(db, ["count"], 2)
    no_runner_thread_once(monkeypatch)
    both_run_once_after_one_failure(db, ids, calls, "no runner thread")


def _tries_of(plan_id: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each time a worker tries to start ``plan_id``, an entry (Runtime.start counted)."""
    tries: list[str] = []
    real = Runtime.start

    def start(self: Runtime, claimed: str, **kwargs: Any) -> Any:
        if claimed == plan_id:
            tries.append(claimed)
        return real(self, claimed, **kwargs)

    monkeypatch.setattr(Runtime, "start", start)
    return tries


@pytest.mark.parametrize(
    ("damage", "told"),
    [
        ("UPDATE plan_versions SET check_result = '{' WHERE plan_id = ?", "failed"),  # a record that cannot be read
        ("UPDATE plan_versions SET body = replace(body, 'rationale', 'rationalf') WHERE plan_id = ?", "refused"),
    ],
)
def test_a_plan_that_cannot_run_is_left_aside_not_retried_in_a_loop(
    db: str, calls: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch, damage: str, told: str
) -> None:
    """A plan changed outside plangate can never start: it was claimed again at once, failed again at
    once, thousands of times a second, each time logged. It is now tried again after 1 s, 2 s, 4 s...
    (here 0.1, 0.2, 0.4 s), said once, and the plans behind it run."""
    monkeypatch.setattr(worker_module, "ASIDE_SECONDS", (0.1, 0.4))
    broken, healthy = submit(db, ["count"], 2)
    with closing(open_store(db)) as store, store.transaction():
        store.command(damage, (broken,))
    tries = _tries_of(broken, monkeypatch)
    w = Worker(Catalogue([tools.count]), db=db, concurrency=2)
    results: list[RunResult] = []
    thread = serve_in_thread(w, results, drain=False, poll=0.02)
    try:
        until("the healthy plan ran", lambda: [r.plan_id for r in results] == [healthy], limit=20)
        until("the broken plan was tried three times", lambda: len(tries) >= 3, limit=20)
    finally:
        w.stop()
        thread.join(20)
        w.close()
    # 0.1 + 0.2 + 0.4 s (then every 0.4 s) between tries: a handful while the test waited, never thousands
    assert 3 <= len(tries) <= 12
    said = w.failed if told == "failed" else w.refused
    assert len(said) == 1 and said[0].startswith(f"{broken}: ")  # said once, however often it was tried
    assert (w.refused if told == "failed" else w.failed) == []
    assert [plan for plan, _ in calls] == [healthy]  # only the healthy plan's step ran
    with closing(open_store(db)) as store:
        plan = store.get_plan(broken)
        assert plan is not None and plan.status == "approved" and plan.lease_owner is None  # left for a person


def test_the_wait_before_a_plan_is_tried_again_doubles_up_to_its_limit(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_module, "ASIDE_SECONDS", (100.0, 350.0))
    w = Worker(Catalogue([tools.count]), db=db)
    try:
        waits = []
        for _ in range(4):
            before = time.monotonic()
            w._set_aside("p", "it cannot run", w.failed)
            waits.append(round(w._aside["p"].until - before, -1))
        assert waits == [100.0, 200.0, 350.0, 350.0]
        assert w.failed == ["p: it cannot run"]  # said once
        w._set_aside("p", "now for another reason", w.failed)
        assert w.failed == ["p: it cannot run", "p: now for another reason"]
        assert w._left_aside() == ["p"]
    finally:
        w.close()


def test_a_worker_rides_out_its_store_going_away(
    pg_db: str, calls: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every connection of the worker is cut (as a database restart does): its claims fail for a while.
    The worker used to end there, with the exception; it now waits, connects again, and runs the
    plans submitted meanwhile, on new connections (the pool's, cut too, are dropped with the claim's)."""
    monkeypatch.setattr(timeouts, "STORE_RETRY_SECONDS", (0.05, 0.2))
    monkeypatch.setattr(worker_module, "ASIDE_SECONDS", (0.05, 0.2))
    (first,) = submit(pg_db, ["count"], 1)
    w = Worker(Catalogue([tools.count]), db=pg_db, concurrency=2)
    results: list[RunResult] = []
    thread = serve_in_thread(w, results, drain=False, poll=0.05)
    try:
        until("the first plan ran", lambda: [r.plan_id for r in results] == [first], limit=20)
        with closing(psycopg.connect(pg_db, autocommit=True)) as admin:
            cut = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        assert cut  # the worker's connections, claims and pool
        (second,) = submit(pg_db, ["count"], 1)
        until("the second plan ran", lambda: [r.plan_id for r in results] == [first, second], limit=20)
        assert thread.is_alive() and w.store_problem is None
        assert w.failed == []  # no plan ran on a connection that was cut
    finally:
        w.stop()
        thread.join(20)
        w.close()
    assert {r.status for r in results} == {"succeeded"}
    assert sorted(collections.Counter(calls).values()) == [1, 1]  # each step once
    with closing(open_store(pg_db)) as store:
        assert {row[0] for row in store.query("SELECT lease_owner FROM plans")} == {None}
        assert store.verify_audit().ok


def test_a_plan_that_keeps_failing_for_days_stays_aside_at_the_limit(db: str) -> None:
    """Each failure in a row doubled the wait, computed as a float times 2 ** failures: past about a
    thousand (17 hours of a plan failing every minute) it overflowed, the runner thread died with an
    OverflowError, and the plan was no longer set aside: claimed again at once, in a loop."""
    w = Worker(Catalogue([tools.count]), db=db)
    try:
        for _ in range(1100):
            w._set_aside("p", "it cannot run", w.failed)
        assert round(w._aside["p"].until - time.monotonic()) == worker_module.ASIDE_SECONDS[1]
        assert w._aside["p"].times == 1100 and w.failed == ["p: it cannot run"]
    finally:
        w.close()


def test_a_worker_outlasts_a_store_out_of_reach_for_hours(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait between claims doubled as a float times 2 ** outages: past about a thousand failed claims
    (8 hours at 30 s) it overflowed, and the OverflowError ended the worker the outage was to spare."""
    monkeypatch.setattr(timeouts, "STORE_RETRY_SECONDS", (0.0, 0.0))
    w = Worker(Catalogue([tools.count]), db=db)
    failures = 0

    def unreachable() -> list[tuple[str, str]]:
        nonlocal failures
        failures += 1
        if failures == 1100:
            w.stop()
        raise psycopg.OperationalError("connection refused")

    monkeypatch.setattr(w, "_claim_free", unreachable)
    try:
        assert w.serve(poll=0.01) == 0
    finally:
        w.close()
    assert failures == 1100 and w.store_problem == "connection refused"


def test_a_give_back_the_store_refuses_does_not_end_the_worker(
    db: str, calls: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No runner thread can be started for the first plan of a batch, and releasing its lease fails too:
    the release's exception ended serve() (the worker gone, the batch's other plan claimed and never
    started). The lease is now left to expire, and both plans run."""
    monkeypatch.setattr(worker_module, "ASIDE_SECONDS", (0.05, 0.05))
    ids = submit(db, ["count"], 2)
    no_runner_thread_once(monkeypatch)
    w = Worker(Catalogue([tools.count]), db=db, concurrency=2, lease_seconds=1.0, drain_timeout=0.5)
    claims = w._claiming()
    real_release = claims.release
    releases = iter([StoreError("the store is out of reach")])

    def release(*args: Any) -> None:
        for failure in releases:
            raise failure
        real_release(*args)

    claims.release = release  # type: ignore[method-assign]
    results: list[RunResult] = []
    thread = serve_in_thread(w, results, drain=False, poll=0.05)
    try:
        until("both plans ran", lambda: len(results) == 2 or not thread.is_alive(), limit=20)
    finally:
        w.stop()
        thread.join(20)
        w.close()
    assert sorted(r.plan_id for r in results) == sorted(ids) and {r.status for r in results} == {"succeeded"}
    assert sorted(plan for plan, _ in calls) == sorted(ids)


def test_the_reasons_a_worker_keeps_are_the_newest_only(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(worker_module, "TOLD_KEPT", 3)
    w = Worker(Catalogue([tools.count]), db=db)
    try:
        for n in range(5):
            w._set_aside("p", f"reason {n}", w.failed)  # a reason that varies: each one is new
    finally:
        w.close()
    assert w.failed == ["p: reason 2", "p: reason 3", "p: reason 4"]


def test_a_run_the_drain_gave_up_closes_its_connection_when_it_ends(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run still going at the drain's deadline is left (its lease released); when it ends at last,
    its store connection was kept open, neither pooled nor closed, for the life of the process."""
    tools.HELD.clear()
    submit(db, ["hold"], 1)
    closed: list[object] = []
    real = Worker._dropped_store

    def dropped(store: Any) -> None:
        if store is not None:
            closed.append(store)
        real(store)

    monkeypatch.setattr(Worker, "_dropped_store", staticmethod(dropped))
    w = Worker(Catalogue([tools.hold]), db=db, concurrency=1, drain_timeout=0.2)
    runs: list[Runtime] = []
    real_runtime = w._runtime
    w._runtime = lambda: runs.append(real_runtime()) or runs[-1]  # type: ignore[method-assign]
    thread = serve_in_thread(w, [], drain=False, poll=0.05)
    try:
        until("the step holds", lambda: bool(runs) and bool(runs[0].store.steps(runs[0].store.list_plans()[0].id)))
        w.stop()
        thread.join(20)
        assert len(w.left) == 1  # given up by the drain
        tools.HELD.set()  # the run ends at last
        until("the run's connection closed", lambda: runs[0].store in closed)
    finally:
        tools.HELD.set()
        w.close()


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("concurrency", 2.5),
        ("concurrency", -1),
        ("lease_seconds", 0.0),
        ("lease_seconds", -30.0),
        ("lease_seconds", float("nan")),
        ("lease_seconds", float("inf")),
        ("lease_seconds", 0.01),
        ("drain_timeout", -1.0),
        ("drain_timeout", float("nan")),
        ("drain_timeout", float("inf")),
    ],
)
def test_a_worker_refuses_settings_it_could_not_keep_when_made(db: str, setting: str, value: float) -> None:
    """Refused when made, naming the setting, as the command line refuses them.

    Before, a worker of the Python API took them: a concurrency of 2.5, or a lease that is not a number or is
    infinite, failed every claim, which the worker took for a store out of reach and waited out for ever,
    saying "cannot claim: datatype mismatch"; a lease of 0 s or less was renewed in a loop that never waited
    and written already run out, for any worker to take over; an infinite drain raised from the drain itself,
    so the leases of the plans still running were never released. A lease of a hundredth of a second, renewed
    every 3 ms, ran out between renewals: of 40 plans shared by two workers, 2 were taken over while their
    runs were alive and halted as outcome unknown (none with a lease of a second).
    """
    with pytest.raises(ValueError, match=setting):
        Worker(Catalogue([tools.count]), db=db, **{setting: value})


# -- a rollback the policy began, carried on by a worker ------------------------------------------
UNDONE: list[str] = []
UNDO_GATE = threading.Event()  # set: undo returns at once; clear: it waits (a slow refund, a hung API)


@tool(effect="write", compensate="undo")
def charge(n: int) -> dict[str, str]:
    """A charge, undone by undo."""
    return {"charge_id": f"c{n}"}


@tool(effect="write", idempotent=True)
def undo(charge_id: str) -> str:
    """Refund a charge; waits while the test holds the gate."""
    UNDONE.append(charge_id)
    UNDO_GATE.wait(timeout=120)
    return f"refunded {charge_id}"


@tool(effect="write")
def fails(n: int) -> int:
    """Always fails."""
    raise RuntimeError("no")


def cut_off_rollback(db: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Catalogue, Any, str]:
    """A plan the policy began to roll back, whose runner stopped after the undo's call, its lease run out."""
    rolling = Policy.from_yaml(ROLLING)
    catalogue = Catalogue([charge, undo, fails, tools.count])
    rt = Runtime(catalogue, rolling, db=db)
    put_step = rt.store.put_step

    def killed(row: Any) -> None:
        if row.step_id < 0 and row.status == "succeeded":
            raise SystemExit("killed")
        put_step(row)

    UNDO_GATE.set()
    with closing(rt), monkeypatch.context() as patched:
        patched.setattr(rt.store, "put_step", killed)
        steps = [{"id": 1, "tool": "charge", "params": {"n": 1}}, {"id": 2, "tool": "fails", "params": {"n": 1}}]
        record = rt.submit({"task": "t", "category": "c", "steps": [{"rationale": "r", **s} for s in steps]}, "bob")
        rt.approve(record.id, "dave", record.hash)
        with pytest.raises(SystemExit):
            rt.execute(record.id)
    with closing(open_store(db)) as store, store.transaction():
        store.command("UPDATE plans SET lease_until = '2000-01-01T00:00:00.000000Z' WHERE id = ?", (record.id,))
    return catalogue, rolling, record.id


@contextlib.contextmanager
def drained_mid_undo(catalogue: Catalogue, policy: Any, db: str) -> Iterator[Worker]:
    """A worker serving until the policy's rollback is in its undo's call; then (after the body) a SIGTERM's
    drain, which must end by its deadline; then the undo returns, after the drain gave the rollback up."""
    UNDONE.clear()
    UNDO_GATE.clear()
    w = Worker(catalogue, db=db, policy=policy, concurrency=2, drain_timeout=0.2)
    thread = serve_in_thread(w, [], drain=False)
    try:
        until("the policy's rollback calls the undo", lambda: bool(UNDONE))
        yield w
        w.stop()
        thread.join(30)
        assert not thread.is_alive(), "the drain waited for the rollback past its deadline"
        UNDO_GATE.set()  # nothing more is recorded
        until("the runner ended", lambda: not any(t.name.startswith("plangate-w") for t in threading.enumerate()))
    finally:
        UNDO_GATE.set()
        thread.join(30)
        w.close()


def left_mid_undo(db: str, plan_id: str) -> None:
    """The drain gave the rollback up in its undo's call: its lease released, nothing recorded after the
    undo's start (its row still started: the next worker carries it on, under the same key), the log intact."""
    with closing(open_store(db)) as store:
        row = store.get_plan(plan_id)
        assert row is not None and row.status == "compensating" and row.lease_owner is None
        assert [e.kind for e in store.events(plan_id)][-1] == "compensation.step_started"
        assert store.steps(plan_id)[-1].status == "started"
        assert store.verify_audit().ok


def test_a_rollback_carried_on_neither_holds_the_claims_nor_outlasts_the_drain(
    any_db: str, monkeypatch: pytest.MonkeyPatch, calls: list[tuple[str, int]]
) -> None:
    """The worker carried on a rollback in its claiming loop: while an undo's call took its time (up to its
    limit, 300 s by default, for each undo), it claimed nothing, with capacity free, and a SIGTERM's drain
    did not begin: its deadline passed and the running plans' leases stayed held until the rollback ended."""
    catalogue, rolling, rolled = cut_off_rollback(any_db, monkeypatch)
    with drained_mid_undo(catalogue, rolling, any_db) as w:
        (waiting,) = submit(any_db, ["count"], 1)
        until("the plan approved meanwhile runs", lambda: [plan for plan, _ in calls] == [waiting], limit=30)
    assert w.left == [rolled]
    left_mid_undo(any_db, rolled)


def test_a_rollback_the_policy_begins_as_a_run_halts_is_given_up_at_the_drain(any_db: str) -> None:
    """The run halts and the policy rolls back at once, on the run's runner thread, under a lease of its own.

    Before, the drain gave back the run's lease, which the rollback had taken the place of: the plan was
    said to be left with its lease released, while the rollback went on under its live lease after the
    worker returned, and recorded its undo's outcome after the drain (or was killed mid-call as the
    command's process left, its lease held until it ran out).
    """
    rt, plan_id = rolled_back_on_halt(any_db, [charge, undo, fails], "charge", "fails")
    rt.close()
    with drained_mid_undo(Catalogue([charge, undo, fails]), Policy.from_yaml(ROLLING), any_db) as w:
        pass
    assert w.left == [plan_id]
    left_mid_undo(any_db, plan_id)


def test_a_rollback_the_drain_gave_up_is_carried_on_by_the_next_worker(any_db: str) -> None:
    """Workers looked only for the policy's rollbacks still under the policy's lease, run out: one whose lease
    the drain had given back (no lease at all) was never carried on, and waited, half undone, for a person."""
    rt, plan_id = rolled_back_on_halt(any_db, [charge, undo, fails], "charge", "fails")
    rt.close()
    catalogue, rolling = Catalogue([charge, undo, fails]), Policy.from_yaml(ROLLING)
    with drained_mid_undo(catalogue, rolling, any_db):
        pass
    left_mid_undo(any_db, plan_id)
    carried_on(catalogue, rolling, any_db, plan_id)
    assert UNDONE == ["c1", "c1"]  # the undo cut off by the drain, called again under the same key


def carried_on(catalogue: Catalogue, rolling: Policy, db: str, plan_id: str) -> None:
    """The next worker carries the policy's rollback on to its end."""
    UNDO_GATE.set()
    with closing(Worker(catalogue, db=db, policy=rolling)) as w:
        w.serve(drain=True, poll=0.05)
    with closing(open_store(db)) as store:
        row = store.get_plan(plan_id)
        assert row is not None and row.status == "compensated" and row.lease_owner is None
        assert store.verify_audit().ok


def test_rollbacks_set_aside_do_not_hide_one_to_carry_on(any_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The look for rollbacks to carry on takes the 8 oldest. Eight that cannot be carried on (rows made to say
    ``compensating`` outside plangate: the log proves no rollback) were refused and set aside, and taken again
    at every look, so a rollback the policy began after them, given up at a drain, was never found."""
    refused = submit(any_db, ["count"], 8)
    with closing(open_store(any_db)) as store, store.transaction():
        for plan_id in refused:
            store.command("UPDATE plans SET status = 'compensating' WHERE id = ?", (plan_id,))
    rt, plan_id = rolled_back_on_halt(any_db, [charge, undo, fails], "charge", "fails")
    rt.close()
    catalogue, rolling = Catalogue([charge, undo, fails]), Policy.from_yaml(ROLLING)
    with drained_mid_undo(catalogue, rolling, any_db):
        pass
    UNDO_GATE.set()
    monkeypatch.setattr(worker_module, "ROLLBACK_POLL", 0.05)
    w = Worker(catalogue, db=any_db, policy=rolling, concurrency=8)
    serving = threading.Thread(target=w.serve, kwargs={"poll": 0.05}, daemon=True)
    serving.start()
    try:
        with closing(open_store(any_db)) as store:
            until("the rollback carried on", lambda: store.get_plan(plan_id).status == "compensated", limit=20)  # type: ignore[union-attr]
    finally:
        w.stop()
        serving.join(20)
        w.close()
    assert sorted(w.refused) == sorted(set(w.refused)) and len(w.refused) == 8, w.refused  # each said once


def test_a_rollback_the_policy_begins_as_the_drain_ends_is_left_for_the_next_worker(
    any_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run halts just as the drain ends, and the policy's rollback begins after it, under the lease the drain
    had already given back (not yet held then). It ran its undos past the drain, under a lease nobody released:
    a process that exits then left the plan under it until it ran out, an undo perhaps cut off in its call. It
    now gives its lease back as soon as it has begun, before any undo, and the next worker carries it on at once."""
    rt, plan_id = rolled_back_on_halt(any_db, [charge, undo, fails], "charge", "fails")
    rt.close()
    catalogue, rolling = Catalogue([charge, undo, fails]), Policy.from_yaml(ROLLING)
    UNDONE.clear()
    UNDO_GATE.set()
    w = Worker(catalogue, db=any_db, policy=rolling, drain_timeout=0.05)
    served, roll_back = threading.Event(), Runtime._roll_back

    def after_the_drain(self: Runtime, plan_id: str, **kwargs: Any) -> Any:
        w.stop()
        assert served.wait(30)
        return roll_back(self, plan_id, **kwargs)

    with monkeypatch.context() as patched:
        patched.setattr(Runtime, "_roll_back", after_the_drain)
        try:
            w.serve(poll=0.05)
            served.set()
            until("the runner ended", lambda: not any(t.name.startswith("plangate-w") for t in threading.enumerate()))
        finally:
            served.set()
            w.close()
    assert w.left == [plan_id]
    assert UNDONE == [], "an undo ran after the drain"
    with closing(open_store(any_db)) as store:
        row = store.get_plan(plan_id)
        assert row is not None and row.status == "compensating" and row.lease_owner is None
    carried_on(catalogue, rolling, any_db, plan_id)
    assert UNDONE == ["c1"]


SECOND_SIGNAL = """
import os, signal, sys, time
from plangate import Catalogue
from plangate.cli import _run
from plangate.worker import Worker
from tests import concurrencytools as tools

w = Worker(Catalogue([tools.count]), db=sys.argv[1])
inner = w._stopping._cond  # the lock stop() holds while it sets the flag
notify_all, sent = inner.notify_all, []

def second_signal() -> None:
    if not sent:  # SIGINT lands while SIGTERM's handler is inside stop(), holding that lock
        sent.append(os.kill(os.getpid(), signal.SIGINT))
        time.sleep(0)  # the interpreter runs the handler here
    notify_all()

inner.notify_all = second_signal
w.serve = lambda **_: os.kill(os.getpid(), signal.SIGTERM) or 0
_run._serve_plans(w, drain=False)
"""


def test_a_second_signal_during_the_first_one_s_stop_does_not_wedge_the_worker(db: str) -> None:
    """SIGTERM then SIGINT (an orchestrator's stop and a person's Ctrl-C): the second handler ran inside the
    first, called stop() again, and waited for the lock the first held: the worker hung for good, draining
    nothing, until killed. A second signal is now told apart and left at that."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {"PYTHONPATH": f"{root / 'src'}:{root}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", SECOND_SIGNAL, db], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("stopping: no new claims") == 1
