"""Workers running many plans at once: real overlap, leases kept through long steps, batch claims,
a SIGTERM that drains, and each step at most once with the audit log intact on PostgreSQL."""

from __future__ import annotations

import collections
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import closing
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from click.testing import CliRunner

from plangate import Catalogue
from plangate._clock import SystemClock, iso
from plangate.cli import main
from plangate.results import RunResult
from plangate.runtime import Runtime
from plangate.store import open_store
from plangate.store._schema import MIGRATIONS
from plangate.testing import fresh_database
from plangate.tools import Tool
from plangate.worker import Worker
from tests import concurrencytools as tools
from tests.helpers import until

TOOLS = Path(__file__).parent / "concurrencytools.py"
ROOT = Path(__file__).resolve().parents[1]


def submit(db: str, tool_names: list[str], plans: int) -> list[str]:
    """``plans`` approved plans, each a step per tool name (independent steps), oldest first."""
    rt = Runtime(Catalogue([tools.meet, tools.hold, tools.count, tools.gate, tools.stuck]), db=db)
    ids = []
    for p in range(plans):
        steps = [
            {"id": i, "tool": name, "params": {"n": p}, "rationale": "test"} for i, name in enumerate(tool_names, 1)
        ]
        record = rt.submit({"task": f"plan {p}", "category": "test", "steps": steps}, "alice")
        rt.approve(record.id, "reviewer", record.hash)
        ids.append(record.id)
    rt.close()
    return ids


def worker(db: str, *catalogue: Tool, **options: float) -> Worker:
    return Worker(Catalogue(list(catalogue)), db=db, **options)  # type: ignore[arg-type]


@pytest.fixture
def held() -> Iterator[threading.Event]:
    tools.HELD.clear()
    yield tools.HELD
    tools.HELD.set()  # nothing stays blocked after the test


def test_n_plans_run_at_once(any_db: str) -> None:
    # Every step waits at a barrier that opens only when six runs are in it together.
    tools.MEETING["barrier"] = threading.Barrier(6)
    ids = submit(any_db, ["meet"], 6)
    results: list[RunResult] = []
    w = worker(any_db, tools.meet, concurrency=6)
    try:
        ran = w.serve(drain=True, poll=0.05, on_result=results.append)
    finally:
        w.close()
    assert ran == 6 and sorted(r.plan_id for r in results) == sorted(ids)
    assert all(r.status == "succeeded" for r in results), [r.error for r in results]
    assert not w.refused and not w.failed


def test_a_step_longer_than_the_lease_keeps_it(any_db: str, held: threading.Event) -> None:
    (plan_id,) = submit(any_db, ["hold"], 1)
    a = worker(any_db, tools.hold, lease_seconds=1.5, concurrency=2)
    results: list[RunResult] = []
    runner = threading.Thread(target=lambda: a.serve(drain=True, poll=0.05, on_result=results.append))
    runner.start()
    store = open_store(any_db)
    clock = SystemClock()
    try:
        until("the step started", lambda: any(e.kind == "step.started" for e in store.events(plan_id)))
        first = store.get_plan(plan_id)
        assert first is not None and first.status == "running" and first.lease_until is not None
        # Past the lease the run was claimed with, and renewed meanwhile by the timer, not by a step.
        until("the first lease ran out", lambda: iso(clock.now()) > str(first.lease_until))
        until(
            "the lease was renewed", lambda: str(getattr(store.get_plan(plan_id), "lease_until", "")) > iso(clock.now())
        )
        b = worker(any_db, tools.hold, lease_seconds=1.5, concurrency=2)
        try:
            assert b.run_one() is None, "a second worker took a plan whose step is still running"
        finally:
            b.close()
        now = iso(clock.now())
        assert store.claim_batch("thief", now, iso(clock.now() + timedelta(seconds=5)), 5) == []
        held.set()
        runner.join(60)
        assert not runner.is_alive()
        assert [r.status for r in results] == ["succeeded"]
        kinds = [e.kind for e in store.events(plan_id)]
        assert kinds.count("run.started") == 1 and "run.resumed" not in kinds
        assert kinds.count("step.started") == 1
        assert store.get_plan(plan_id).lease_owner is None  # type: ignore[union-attr]
    finally:
        held.set()
        a.close()
        store.close()


def test_a_batch_claim_takes_at_most_the_free_capacity(any_db: str) -> None:
    ids = submit(any_db, ["meet"], 5)
    clock = SystemClock()
    now, later = clock.now(), clock.now() + timedelta(seconds=60)
    with closing(open_store(any_db)) as store:
        assert store.claim_batch("a", iso(now), iso(later), 0) == []
        assert store.claim_batch("a", iso(now), iso(later), 3) == ids[:3]
        assert store.claim_batch("b", iso(now), iso(later), 3) == ids[3:]  # only what is left, no live lease taken
        assert store.claim_batch("c", iso(now), iso(later), 3) == []
        owners = collections.Counter(store.get_plan(i).lease_owner for i in ids)  # type: ignore[union-attr]
        assert owners == {"a": 3, "b": 2}
        # Leases that ran out are claimable again, in one statement, skipping what is asked to be skipped.
        after = later + timedelta(seconds=1)
        assert store.claim_batch("d", iso(after), iso(after + timedelta(seconds=60)), 9, skip=[ids[0]]) == ids[1:]


def test_a_claim_reads_the_oldest_runnable_plans_in_order_however_many_wait(any_db: str) -> None:
    """Through plans_runnable, in its order: a claim reads the first few plans that may run, not
    every waiting plan sorted (3.7 ms a claim with a thousand waiting on PostgreSQL, 0.1 ms this way)."""
    with closing(open_store(any_db)) as store:
        query = "EXPLAIN " + store._claim_query(2)  # type: ignore[attr-defined]
        params = ("w", "later", "now", "a", "b", 3)
        if any_db.startswith("postgresql"):
            with psycopg.connect(any_db, autocommit=True) as conn:
                conn.execute("SET enable_sort = off")  # sorting looks dear: only an ordered index avoids it
                lines = [row[0] for row in conn.execute(query.replace("?", "%s"), params).fetchall()]
        else:
            lines = [str(row) for row in store.query(query.replace("EXPLAIN", "EXPLAIN QUERY PLAN"), params)]
    text = "\n".join(lines)
    assert "plans_runnable" in text and "Sort" not in text and "TEMP B-TREE" not in text, text


def test_a_store_of_the_schema_before_gains_the_claims_index(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    for statement in (s for migration in MIGRATIONS[:9] for s in migration):
        conn.execute(statement)
    conn.execute("PRAGMA user_version = 9")
    conn.commit()
    conn.close()
    ids = submit(f"sqlite:///{path}", ["meet"], 2)
    with closing(open_store(f"sqlite:///{path}")) as store:
        assert store.query("SELECT name FROM sqlite_master WHERE name = 'plans_runnable'") == [("plans_runnable",)]
        assert store.query("PRAGMA user_version") == [(len(MIGRATIONS),)]
        clock = SystemClock()
        assert store.claim_batch("w", iso(clock.now()), iso(clock.now() + timedelta(seconds=9)), 5) == ids


def test_two_workers_run_each_step_once_on_postgres(pg_server: str) -> None:
    db = fresh_database(pg_server, f"conc_{os.getpid()}")
    tools.CALLS.clear()
    ids = submit(db, ["count", "count", "count"], 30)
    workers = [worker(db, tools.count, concurrency=8) for _ in range(2)]
    results: list[RunResult] = []
    threads = [
        threading.Thread(target=w.serve, kwargs={"drain": True, "poll": 0.05, "on_result": results.append})
        for w in workers
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for w in workers:
        w.close()
    assert sorted(r.plan_id for r in results) == sorted(ids)
    assert all(r.status == "succeeded" for r in results)
    calls = collections.Counter(tools.CALLS)
    assert len(calls) == 90 and set(calls.values()) == {1}, "a step ran twice, or not at all"
    with closing(open_store(db)) as store:
        assert store.verify_audit().ok
        assert {row[0] for row in store.query("SELECT lease_owner FROM plans")} == {None}


def start_worker(db: str, gates: Path, *options: str) -> subprocess.Popen[str]:
    env = {**os.environ, "GATE_DIR": str(gates), "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    command = [sys.executable, "-m", "plangate", "worker", "--tools", str(TOOLS), "--db", db, *options]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_draining(process: subprocess.Popen[str]) -> None:
    """SIGTERM, then the worker's word that it stopped claiming."""
    process.send_signal(signal.SIGTERM)
    assert process.stderr is not None
    for line in process.stderr:
        if "stopping: no new claims" in line:
            return
    raise AssertionError("the worker never said it was draining")


def test_sigterm_drains_the_running_plans_and_claims_no_more(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/plangate.db"
    ids = submit(db, ["gate", "gate"], 5)
    process = start_worker(db, tmp_path, "--concurrency", "2", "--drain-timeout", "120", "--lease", "5")
    try:
        until("two plans running", lambda: len(list(tmp_path.glob("reached-*"))) == 2)
        wait_draining(process)
        (tmp_path / "open").touch()  # the running steps may finish now
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, err
    running = {p.name.removeprefix("reached-") for p in tmp_path.glob("reached-*")}
    assert len(running) == 2 and out.count(": succeeded") == 2
    with closing(open_store(db)) as store:
        for plan_id in ids:
            plan = store.get_plan(plan_id)
            assert plan is not None and plan.lease_owner is None and plan.lease_until is None
            assert plan.status == ("succeeded" if plan_id in running else "approved")
            runs = [e for e in store.events(plan_id) if e.kind.startswith("run.")]
            assert bool(runs) == (plan_id in running)  # the others were never claimed for a run


def test_a_step_that_overruns_the_drain_is_left_to_the_next_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{tmp_path}/plangate.db"
    (plan_id,) = submit(db, ["stuck"], 1)
    process = start_worker(db, tmp_path, "--drain-timeout", "0.2")
    try:
        until("the step started", (tmp_path / f"reached-{plan_id}").exists)
        wait_draining(process)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0 and f"{plan_id} still running at the drain deadline: lease released" in err
    with closing(open_store(db)) as store:
        plan = store.get_plan(plan_id)
        assert plan is not None and plan.status == "running" and plan.lease_owner is None
    (tmp_path / f"reached-{plan_id}").unlink()
    monkeypatch.setenv("GATE_DIR", str(tmp_path))
    results: list[RunResult] = []
    w = worker(db, tools.stuck)
    try:
        w.serve(drain=True, poll=0.05, on_result=results.append)
    finally:
        w.close()
    # The usual recovery: a non-idempotent step cut off mid-call halts as outcome unknown, never re-run.
    assert [r.status for r in results] == ["halted"] and (results[0].error or "").startswith("outcome unknown")
    assert not (tmp_path / f"reached-{plan_id}").exists()


def test_the_worker_command_refuses_a_concurrency_below_one(tmp_path: Path) -> None:
    out = CliRunner().invoke(
        main, ["worker", "--tools", str(TOOLS), "--db", f"sqlite:///{tmp_path}/p.db", "--concurrency", "0"]
    )
    assert out.exit_code == 2 and "--concurrency" in out.output
    helped = CliRunner().invoke(main, ["worker", "--help"])
    assert "--concurrency" in helped.output and "--drain-timeout" in helped.output and "SIGTERM" in helped.output


def test_two_hundred_plans_leave_no_thread_or_connection_behind(any_db: str) -> None:
    """The runner threads end, the lease timers are joined, the pool keeps a runtime per runner at most,
    and close() closes every connection: threads and open files come back to what they were."""
    ids = submit(any_db, ["count", "count"], 200)
    warm = worker(any_db, tools.count, concurrency=8)  # the shared pools' threads made, as after any run
    warm.serve(drain=True, poll=0.05)
    warm.close()
    ids += submit(any_db, ["count", "count"], 200)
    threads, files = threading.active_count(), len(os.listdir("/proc/self/fd"))
    w = worker(any_db, tools.count, concurrency=8)
    assert w.serve(drain=True, poll=0.05) == 200
    w.close()
    until("the runner threads ended", lambda: threading.active_count() <= threads)
    assert len(os.listdir("/proc/self/fd")) <= files
    with closing(open_store(any_db)) as store:
        assert {store.get_plan(plan_id).status for plan_id in ids} == {"succeeded"}  # type: ignore[union-attr]
