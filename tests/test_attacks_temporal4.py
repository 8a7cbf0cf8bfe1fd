"""The Temporal backend: a step's heartbeats through a busy worker, and step budgets no Temporal duration holds."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from plangate import Catalogue
from plangate import temporal as temporal_module
from plangate.runtime import Runtime
from tests.helpers import plan
from tests.test_temporal_attacks import _direct, _setup, _terminate, temporal  # noqa: F401 -- the server fixture
from tests.test_temporal_outage import _attempt

# A tool whose declared limit (allowed: any number of seconds above 0) is beyond what a Temporal duration holds.
# Its call takes a moment: the activity waits for it, up to that limit.
LONG = """
import time

from plangate import tool


@tool(effect="write", idempotent=True, timeout=1e15, retries=2)
def put(n: int) -> int:
    time.sleep(0.5)
    return n
"""


def test_a_heartbeat_the_workers_loop_was_slow_to_take_does_not_stop_the_steps_heartbeats(tmp_path: Path) -> None:
    """A thread's heartbeat waits at most 10 s for the worker's event loop to take it (the SDK's own wait), then
    raises ``TimeoutError``, though it still goes out once the loop gets to it. The step's heartbeat thread took
    that for the worker shutting down and stopped for good: the step ran on, silent, and once the heartbeat
    timeout passed Temporal ran it again beside itself, on one busy moment of a live worker, however long a
    heartbeat timeout the worker was given for such moments. The thread now goes on beating."""
    tools, db, _, _ = _setup(tmp_path, "charge")
    args = {**_direct(db, tools, "t-busy"), "step_id": 1, "heartbeat_seconds": 2}
    slow, again = threading.Event(), threading.Event()

    def busy_loop(*_: Any) -> None:
        if threading.current_thread().name != "plangate-heartbeat":
            return
        if not slow.is_set():
            slow.set()
            raise TimeoutError  # as the SDK's wait for the worker's loop raises it
        again.set()
        (tmp_path / "go").touch()  # the call ends once a heartbeat came after the slow one

    failsafe = threading.Timer(30, (tmp_path / "go").touch)  # a thread that stopped beating ends the call too
    failsafe.start()
    try:
        result, _ = _attempt(db, tools, args, [], busy_loop)
    finally:
        failsafe.cancel()
    assert slow.is_set() and again.is_set(), "the step's heartbeats went on after the slow one"
    assert result == "succeeded"


def test_a_step_whose_budget_no_temporal_duration_holds_does_not_hang_the_worker(temporal: str, tmp_path: Path) -> None:  # noqa: F811
    """A tool may declare any limit above 0 seconds, which the embedded engine runs under. On Temporal its step's
    start-to-close timeout (the budget plus the margin) was beyond what a duration holds: every task of the
    plan's workflow failed making it, for ever, the plan held running and the worker, waiting on that workflow,
    running no other plan. A budget is now held to a year for Temporal (the engine's own limit still applies)."""
    tools = tmp_path / "long.py"
    tools.write_text(LONG)
    db = f"sqlite:///{tmp_path}/t.db"
    rt = Runtime(Catalogue.from_module(tools), db=db)
    record = rt.submit(plan({"id": 1, "tool": "put", "params": {"n": 1}}), "ann")
    rt.approve(record.id, "ben", record.hash)
    settings = temporal_module.Settings(heartbeat_seconds=2, max_activities=2)
    ran: list[int] = []
    serving = threading.Thread(
        target=lambda: ran.append(
            asyncio.run(temporal_module.serve(temporal, db, str(tools), drain=True, poll=0.05, settings=settings))
        ),
        daemon=True,
    )
    serving.start()
    try:
        serving.join(timeout=60)
        assert ran == [1], "the worker ran the plan and drained"
    finally:
        asyncio.run(_terminate(temporal, record.id))
    assert rt.get(record.id).status == "succeeded"
    assert rt.store.verify_audit().ok
