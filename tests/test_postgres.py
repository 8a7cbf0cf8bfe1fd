"""The PostgreSQL store and workers, against a real PostgreSQL server on loopback."""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import psycopg
import pytest

from plangate import Catalogue, Policy
from plangate.runtime import Runtime
from plangate.store import open_store
from plangate.testing import fresh_database, postgres_cluster
from tests.conftest import ROOT, load_plan

_COUNTER = iter(range(10**6))


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with postgres_cluster() as url:
        yield url


@pytest.fixture
def db(server: str) -> str:
    return fresh_database(server, f"plangate_{os.getpid()}_{next(_COUNTER)}")


def test_the_governed_path_on_postgresql(db: str, catalogue: Catalogue, policy: Policy) -> None:
    rt = Runtime(catalogue, policy, db=db)
    record = rt.submit(load_plan("refund"), "alice")
    rt.approve(record.id, "dave", record.hash)
    rt.approve(record.id, "carol", record.hash)
    result = rt.execute(record.id)
    assert result.ok and result.outputs[4] == "message-1"
    assert rt.execute(record.id).ran == ()
    assert [e.kind for e in rt.trace(record.id)][-1] == "run.succeeded"
    assert rt.store.verify_audit().ok
    rt.close()
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("UPDATE events SET actor = 'mallory' WHERE seq = 5")
    with closing(open_store(db)) as store:
        report = store.verify_audit()
    assert not report.ok and report.bad_seq == 5 and "it was edited" in (report.problem or "")


def test_concurrent_writers_chain_the_audit_log(db: str, catalogue: Catalogue) -> None:
    def submit_many() -> None:
        rt = Runtime(catalogue, db=db)
        for _ in range(10):
            rt.submit(load_plan("refund"), "alice")
        rt.close()

    threads = [threading.Thread(target=submit_many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with closing(open_store(db)) as store:
        report = store.verify_audit()
    assert report.ok and report.events == 40 * 3


def test_two_workers_with_kills_lose_and_repeat_nothing(
    db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = importlib.util.spec_from_file_location("torture_pg", ROOT / "bench" / "torture.py")
    assert spec is not None and spec.loader is not None
    bench: Any = importlib.util.module_from_spec(spec)
    sys.modules["torture_pg"] = bench
    spec.loader.exec_module(bench)
    monkeypatch.setenv("TORTURE_LEDGER", str(tmp_path / "ledger.db"))
    rt = Runtime(Catalogue.from_module(bench.TOOLS), db=db)
    rng = random.Random(5)
    for number in range(50):
        record = rt.submit(bench.make_plan(rng, number), "torture")
        rt.approve(record.id, "reviewer", record.hash)
    rt.close()
    env = {**os.environ, "TORTURE_LEDGER": str(tmp_path / "ledger.db"), "PLANGATE_DB": db}
    command = [sys.executable, "-m", "plangate", "worker", "--tools", str(bench.TOOLS), "--lease", "1", "--drain"]

    def start(name: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [*command, "--name", name], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    workers = {"a": start("a"), "b": start("b")}
    kills = 0
    deadline = time.monotonic() + 60
    while any(w.poll() is None for w in workers.values()) and time.monotonic() < deadline:
        time.sleep(rng.uniform(0.2, 0.5))
        victim = rng.choice(sorted(workers))
        if workers[victim].poll() is None and kills < 5:
            workers[victim].send_signal(signal.SIGKILL)
            workers[victim].wait()
            kills += 1
            workers[victim] = start(victim)
    for w in workers.values():
        w.wait(60)
    time.sleep(1.2)  # let the last dead worker's lease expire, then drain what is left
    subprocess.run([*command, "--name", "c"], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    counts = bench.check(db, tmp_path)
    assert kills >= 3
    assert counts["duplicated effects of idempotent tools"] == 0
    assert counts["silent re-runs of non-idempotent tools"] == 0
    assert counts.get("lost or duplicated completed steps", 0) == 0
    assert counts.get("sends the store does not know about", 0) == 0
    assert counts.get("plans that did not end", 0) == 0, counts
    assert counts["audit log intact"] == 1
    with closing(open_store(db)) as store:
        runs = [e for e in store.events() if e.kind in ("run.started", "run.resumed")]
    actors = {e.actor for e in runs}
    assert len(actors) >= 2, f"more than one worker ran plans: {actors}"
