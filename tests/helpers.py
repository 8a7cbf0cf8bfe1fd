"""Test doubles that ship with the tests: a fixed clock, and a plan builder."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any


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


def died_during(store: Any, plan_id: str, step_id: int, *, version: int = 1) -> None:
    """What a runner that died during step ``step_id``'s call leaves, recorded as the engine records it:
    the plan running under a lease that has run out, the step started, and no outcome."""
    from plangate import lifecycle
    from plangate.plan import Plan
    from plangate.store import StepRow

    at = "2026-01-01T00:00:00.000000Z"
    step = Plan.parse(store.get_version(plan_id, version).body).step(step_id)
    key = f"{plan_id}:{step_id}"
    with store.transaction():
        store.lock_log()
        plan = store.get_plan(plan_id)
        gone = "gone#0@elsewhere:1"
        lifecycle.claim(store, plan, owner=gone, at=at, until=at, actor="engine", kind="run.started", data={"steps": 1})
        store.put_step(
            StepRow(
                plan_id=plan_id,
                step_id=step_id,
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
            plan_id=plan_id, version=version, step_id=step_id, kind="step.started", actor="engine", at=at, data=data
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
