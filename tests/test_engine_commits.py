"""The engine's commits on a sequential chain: one per step, and each step's ``started`` durable before its call.

Seen from a second connection while each call runs, as a process that takes over after a
crash would see the store: the step is recorded ``started`` (with its key), and the step
before it is recorded done, with its output, in the same commit.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue, tool
from plangate.runtime import Runtime
from tests.helpers import FixedClock, plan

STEPS = 12
SEEN: list[tuple[int, Any, Any, int]] = []
DB: list[Path] = []


@tool(effect="write", idempotent=False)
def append(n: int) -> int:
    """Records what another connection sees of the store while this call runs."""
    with closing(sqlite3.connect(DB[0], isolation_level=None)) as other:
        rows = dict(other.execute("SELECT step_id, status FROM steps").fetchall())
        outputs = dict(other.execute("SELECT step_id, output FROM steps").fetchall())
        started = other.execute("SELECT COUNT(*) FROM events WHERE kind = 'step.started'").fetchone()[0]
    SEEN.append((n, rows, outputs, started))
    return n + 1


@pytest.fixture
def rt(tmp_path: Path) -> Runtime:
    SEEN.clear()
    DB[:] = [tmp_path / "chain.db"]
    return Runtime(Catalogue([append]), db=f"sqlite:///{DB[0]}", clock=FixedClock())


def chain() -> dict[str, Any]:
    return plan(
        *({"id": i, "tool": "append", "params": {"n": f"${{{i - 1}}}" if i > 1 else 0}} for i in range(1, STEPS + 1))
    )


def test_each_step_is_durably_started_before_its_call_with_the_step_before_it_done(rt: Runtime) -> None:
    record = rt.submit(chain(), "dana")
    rt.approve(record.id, "ravi", record.hash)
    assert rt.execute(record.id).ok
    assert [n for n, *_ in SEEN] == list(range(STEPS))
    for step_id, (_, rows, outputs, started) in enumerate(SEEN, start=1):
        assert rows[step_id] == "started"  # committed before the call: a successor would see it
        assert started == step_id
        if step_id > 1:  # the outcome of the step before it went into the same commit
            assert rows[step_id - 1] == "succeeded"
            assert outputs[step_id - 1] == str(step_id - 1)
        assert step_id + 1 not in rows  # nothing after it has started
    assert rt.store.verify_audit().ok


def test_a_sequential_chain_costs_one_commit_per_step(rt: Runtime) -> None:
    record = rt.submit(chain(), "dana")
    rt.approve(record.id, "ravi", record.hash)
    commits: list[str] = []
    conn = rt.store._conn  # type: ignore[attr-defined]
    conn.set_trace_callback(lambda sql: commits.append(sql) if sql.strip().upper() == "COMMIT" else None)
    try:
        assert rt.execute(record.id).ok
    finally:
        conn.set_trace_callback(None)
    # The claim, loading what was recorded, one per step (its outcome and the next start), and the end.
    assert len(commits) <= STEPS + 3, len(commits)
