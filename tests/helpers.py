"""Test doubles that ship with the tests: a fixed clock, a plan builder, and checks shared by the stores' tests."""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from plangate import Catalogue, RunContext, _calls, tool
from plangate.errors import LeaseLostError
from plangate.runtime import Runtime
from plangate.store import open_store


class FixedClock:
    """Time that advances one millisecond per reading, and ids that count up: runs repeat exactly."""

    def __init__(self, start: datetime = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)) -> None:
        self._ticks = itertools.count()
        self._ids = itertools.count(1)
        self.start = start

    def now(self) -> datetime:
        return self.start + timedelta(milliseconds=next(self._ticks))

    def new_id(self) -> str:
        return str(uuid.UUID(int=next(self._ids)))


def plan(*steps: dict[str, Any], category: str = "ops", task: str = "test") -> dict[str, Any]:
    return {"task": task, "category": category, "steps": [{"rationale": "needed", **s} for s in steps]}


def dies_during(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The process goes down during a call of the tool ``name`` (Ctrl-C, a kill): the call is made, then
    KeyboardInterrupt rises where the run waits for it, and its answer is recorded nowhere. Other tools' calls
    are made as ever. (A signal sent to the run's thread from the call did the same, until one left unraised by a
    handler some earlier test had installed in the process made the run wait out the call's whole limit.)"""
    made = _calls.bounded

    def bounded(step: Any, tool: Any, kwargs: dict[str, Any], *rest: Any) -> Any:
        if tool.name != name:
            return made(step, tool, kwargs, *rest)
        tool.fn(**kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(_calls, "bounded", bounded)


def died_during(store: Any, plan_id: str, step_id: int, *also: int, version: int = 1) -> None:
    """What a runner that died during step ``step_id``'s call (and those of ``also``) leaves, recorded as the
    engine records it: the plan running under a lease that has run out, the steps started, and no outcome."""
    from plangate import lifecycle
    from plangate.plan import Plan
    from plangate.store import StepRow

    at = "2026-01-01T00:00:00.000000Z"
    body = Plan.parse(store.get_version(plan_id, version).body)
    with store.transaction():
        store.lock_log()
        plan = store.get_plan(plan_id)
        gone = "gone#0@elsewhere:1"
        lifecycle.claim(store, plan, owner=gone, at=at, until=at, actor="engine", kind="run.started", data={"steps": 1})
        for step in (body.step(one) for one in (step_id, *also)):
            key = f"{plan_id}:{step.id}"
            store.put_step(
                StepRow(
                    plan_id=plan_id,
                    step_id=step.id,
                    version=version,
                    status="started",
                    attempt=1,
                    idempotency_key=key,
                    params=step.params,
                    started_at=at,
                )
            )
            data = {"tool": step.tool, "params": step.params, "attempt": 1, "idempotency_key": key}
            store.append_event(
                plan_id=plan_id, version=version, step_id=step.id, kind="step.started", actor="engine", at=at, data=data
            )


def wait_until_up(url: str, process: Any, log: Any, *, seconds: float) -> None:
    """Poll ``url`` until a server started as ``process`` answers; fail with its log if it dies or takes too long."""
    import time
    import urllib.request

    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            assert process.poll() is None, f"the server died: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, (
                f"the server did not start in {seconds:.0f} s: {log.read_text()[-2000:]}"
            )
            time.sleep(0.2)


def a_late_outcome_is_not_recorded(db: str) -> None:
    """A call that ran long while a person (or a later attempt) decided its step: its late answer
    fails the run's transaction, and nothing of it is written (on any store, ``db``)."""

    @tool(effect="irreversible")
    def pay(amount: int, ctx: RunContext) -> str:
        """Meanwhile, elsewhere, the step is marked as of unknown outcome (what a timed-out attempt leaves)."""
        other = open_store(db)
        with other.transaction():
            row = other.steps(ctx.plan_id)[ctx.step_id]
            other.put_step(replace(row, status="outcome_unknown", error="decided elsewhere"))
        other.close()
        return "paid"

    rt = Runtime(Catalogue([pay]), db=db, clock=FixedClock())
    record = rt.submit(plan({"id": 1, "tool": "pay", "params": {"amount": 5}}), "ann")
    rt.approve(record.id, "ben", record.hash)
    told: list[str] = []
    with pytest.raises(LeaseLostError, match="step 1's record changed while its call"):
        rt.execute(record.id, actor="ops", progress=lambda p: told.append(p.kind))
    assert told == ["started"]  # never "succeeded": progress is told what was recorded, once it was
    row = rt.store.steps(record.id)[1]
    assert (row.status, row.output) == ("outcome_unknown", None)
    assert "step.succeeded" not in [e.kind for e in rt.trace(record.id)]
    rt.close()


def until(what: str, condition: Callable[[], bool], limit: float = 60) -> None:
    """Poll ``condition`` until it holds; fail, saying ``what`` never happened, after ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.02)


def waiting_for_the_log(db: str) -> int:
    """Connections of this database (not another of the shared cluster) waiting for the audit log's lock."""
    import psycopg

    from plangate.store.postgres import _LOG_LOCK

    with psycopg.connect(db, autocommit=True) as conn:
        row = conn.execute(
            "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s AND NOT granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            (_LOG_LOCK,),
        ).fetchone()
    return int(row[0]) if row else 0


ROLLING = "version: 1\nname: rolling\ncompensation: {on_halt: auto}\n"
"""A policy that rolls back halted plans on its own."""


def rolled_back_on_halt(db: str, tools: list[Any], done: str, fails: str) -> tuple[Any, str]:
    """A runtime under :data:`ROLLING` over ``tools``, and a plan of two steps it approved: ``done`` (a tool undone
    by another) then ``fails`` (a tool that fails), so that its run halts and the policy rolls it back."""
    from plangate import Catalogue
    from plangate.policy import Policy
    from plangate.runtime import Runtime

    rt = Runtime(Catalogue(tools), Policy.from_yaml(ROLLING), db=db)
    steps = [{"id": 1, "tool": done, "params": {"n": 1}}, {"id": 2, "tool": fails, "params": {"n": 1}}]
    record = rt.submit({"task": "t", "category": "c", "steps": [{"rationale": "r", **s} for s in steps]}, "ann")
    rt.approve(record.id, "ben", record.hash)
    return rt, record.id
