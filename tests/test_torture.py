"""Short crash tortures: workers SIGKILLed, or their store connections cut, at random moments, many times;
nothing lost or repeated.

One worker on SQLite; three ``plangate worker`` processes at concurrency 3 on PostgreSQL, killed, or
cut off from the database again and again (every answer a tool gave is then recorded all the same).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from plangate.store import open_store
from plangate.testing import fresh_database, postgres_cluster
from tests.conftest import ROOT


def load_bench() -> object:
    spec = importlib.util.spec_from_file_location("torture_bench", ROOT / "bench" / "torture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["torture_bench"] = module
    spec.loader.exec_module(module)
    return module


def held_every_promise(counts: dict[str, int], stats: Any) -> None:
    """The torture's zeros: no effect twice, nothing lost, every plan ended, the log intact."""
    assert counts["duplicated effects of idempotent tools"] == 0
    assert counts["silent re-runs of non-idempotent tools"] == 0
    assert counts.get("lost or duplicated completed steps", 0) == 0
    assert counts.get("sends the store does not know about", 0) == 0
    assert counts.get("plans that did not end", 0) == 0, counts
    assert counts["audit log intact"] == 1
    assert counts["plans"] == stats.plans == counts.get("plans succeeded", 0) + counts.get("plans halted", 0)


def test_random_kills_lose_and_repeat_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = load_bench()
    monkeypatch.setenv("TORTURE_LEDGER", str(tmp_path / "ledger.db"))
    db = bench.setup(tmp_path, plans=40, seed=11)  # type: ignore[attr-defined]
    kills = bench.torture(db, tmp_path, kills=12, seed=11, max_delay=0.15)  # type: ignore[attr-defined]
    counts = bench.check(db, tmp_path)  # type: ignore[attr-defined]
    assert kills >= 6, "the worker was killed while working"
    assert counts["duplicated effects of idempotent tools"] == 0
    assert counts["silent re-runs of non-idempotent tools"] == 0
    assert counts.get("lost or duplicated completed steps", 0) == 0
    assert counts.get("sends the store does not know about", 0) == 0
    assert counts.get("plans that did not end", 0) == 0
    assert counts["audit log intact"] == 1
    assert counts["plans"] == 40 and counts.get("plans succeeded", 0) + counts.get("plans halted", 0) == 40


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with postgres_cluster() as url:
        yield url


def test_three_workers_killed_on_postgresql_lose_and_repeat_nothing(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench: Any = load_bench()
    monkeypatch.setenv("TORTURE_LEDGER", str(tmp_path / "ledger.db"))
    db = fresh_database(server, f"torture_{os.getpid()}")
    fleet = bench.Fleet(db=db, folder=tmp_path, workers=3, concurrency=3, lease=1.0, max_delay=0.5)
    stats = bench.torture_workers(fleet, plans=30, kills=20, seed=3, backlog=12)
    counts = bench.check(db, tmp_path)
    assert stats.kills >= 20 and stats.exits == 0, stats.errors
    held_every_promise(counts, stats)
    with closing(open_store(db)) as store:
        actors = {e.actor for e in store.events() if e.kind in ("run.started", "run.resumed")}
    assert len(actors) >= 2, f"more than one worker process ran plans: {actors}"


def test_three_workers_cut_off_from_postgresql_keep_every_answer(
    server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every worker connection ended by the server, 20 times, at random moments a second or two apart: no run
    is lost with its connection. The runs cut off take themselves back under their own leases and record the
    answers their tools gave: no payment that returned is left for a person to settle."""
    bench: Any = load_bench()
    monkeypatch.setenv("TORTURE_LEDGER", str(tmp_path / "ledger.db"))
    db = fresh_database(server, f"torture_cuts_{os.getpid()}")
    fleet = bench.Fleet(db=db, folder=tmp_path, workers=3, concurrency=3, lease=2.0)
    stats = bench.torture_workers(fleet, plans=30, kills=0, seed=5, backlog=12, cuts=20)
    counts = bench.check(db, tmp_path)
    assert stats.cuts >= 20 and stats.kills == 0 and stats.exits == 0, stats.errors
    assert counts.get("known outcomes lost", 0) == 0, counts
    assert counts.get("known outcomes recorded after a cut", 0) >= 1, counts
    held_every_promise(counts, stats)
