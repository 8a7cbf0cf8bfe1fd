"""The Temporal backend: a step's heartbeats through a busy worker."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from tests.test_temporal_attacks import _direct, _setup
from tests.test_temporal_outage import _attempt


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
