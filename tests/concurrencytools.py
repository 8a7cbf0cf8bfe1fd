"""Tools for the worker concurrency tests: they meet, hold and count, so overlap is shown, not timed.

In-process tests set :data:`MEETING` (a barrier every run must reach together) or :data:`HELD`
(an event a step waits for). Worker processes gate on files in ``$GATE_DIR``: a step touches
``reached-PLAN`` and waits until ``open`` exists (``stuck`` never ends by itself).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from plangate import RunContext, tool

MEETING: dict[str, threading.Barrier] = {}
HELD = threading.Event()
CALLS: list[tuple[str, int]] = []
_CALLS_LOCK = threading.Lock()


@tool
def meet(n: int) -> int:
    """Wait until every run the test expects at once is here (a broken barrier fails the step)."""
    MEETING["barrier"].wait(timeout=120)
    return n


@tool
def hold(n: int) -> int:
    """Wait until the test lets go."""
    if not HELD.wait(timeout=120):
        raise RuntimeError("nobody let go")
    return n


@tool(effect="write", idempotent=True)
def count(n: int, ctx: RunContext) -> int:
    """Count the call: the test asserts each step ran at most once."""
    with _CALLS_LOCK:
        CALLS.append((ctx.plan_id, ctx.step_id))
    time.sleep(0.002)
    return n


def _reached(ctx: RunContext) -> Path:
    folder = Path(os.environ["GATE_DIR"])
    (folder / f"reached-{ctx.plan_id}").touch()
    return folder


@tool
def gate(n: int, ctx: RunContext) -> int:
    """Wait until ``$GATE_DIR/open`` exists."""
    folder = _reached(ctx)
    while not (folder / "open").exists():
        time.sleep(0.02)
    return n


@tool(effect="irreversible")
def stuck(n: int, ctx: RunContext) -> int:
    """Send something, then never come back (until the process ends)."""
    _reached(ctx)
    threading.Event().wait()
    return n
