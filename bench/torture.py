"""Crash torture: run many plans while workers are SIGKILLed, or cut off from their store, at random moments.

Plans mix idempotent, non-idempotent, failing and slow tools. Workers resume every
unfinished plan; they are killed (SIGKILL) after random delays, again and again. Then the
tools' own ledger is checked against the store:

- duplicated effects: an idempotent tool's effect applied twice for one step (must be 0);
- silent re-runs: a non-idempotent tool called twice for one step (must be 0: the engine
  halts with outcome unknown instead);
- lost steps: a step the store says succeeded whose effect is missing, or a step whose
  effect exists but the store never recorded (a non-idempotent send must be recorded or
  be waiting for a person);
- plans that did not end: still ``approved`` or ``running`` once the kills stopped, the
  last lease expired and a last worker drained what was left;
- known outcomes lost: a non-idempotent step whose tool returned in a worker that was never
  killed, left ``outcome_unknown`` (must be 0: a cut connection alone loses no answer; the
  tool writes down that it returned, and the process it ran in, as its last act);
- the audit log's hash chain, verified from the first event to the last.

Two modes. On SQLite (the default) one worker process resumes every plan and is killed
until every plan has ended. With ``--db postgresql`` (a throwaway cluster) or ``--db
postgresql://...`` (an empty database), several ``plangate worker --concurrency N``
processes share the plans; each is killed at a random moment after it started serving
and started again at once, while new plans keep arriving, until ``--kills`` kills. With
``--cuts N`` (PostgreSQL only), the bench also ends every worker's connection to the
database (``pg_terminate_backend``, as a server restart or a network cut does) at random
moments, N times; ``--kills 0 --cuts N`` cuts without killing. The workers' runs take
themselves back under their own leases and record what their tools answered: "known
outcomes recorded after a cut" counts the steps so recorded.

Run: ``python bench/torture.py [--plans N] [--kills N] [--seed S]`` or
``python bench/torture.py --db postgresql [--workers 3] [--concurrency 4] [--kills 500] [--cuts 50]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOOLS = HERE / "torturetools.py"
WORKER = """
import sys
from plangate import Catalogue
from plangate.runtime import Runtime
rt = Runtime(Catalogue.from_module(sys.argv[1]), db=sys.argv[2])
print("ready", flush=True)
for row in rt.list_plans(limit=10**6):
    if row.status in ("approved", "running"):
        rt.resume(row.id)
"""
BAD = (
    "duplicated effects of idempotent tools",
    "silent re-runs of non-idempotent tools",
    "lost or duplicated completed steps",
    "sends the store does not know about",
    "plans that did not end",
    "known outcomes lost",
)
BENCH = "plangate-torture"
"""The application name of the bench's own connections to PostgreSQL, which the cuts spare."""
CUT = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database()"
    " AND pid <> pg_backend_pid() AND backend_type = 'client backend' AND application_name <> %s"
)


def make_plan(rng: random.Random, number: int) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    for i in range(1, rng.randint(4, 8) + 1):
        tool = rng.choices(["idem", "once", "slow", "flaky"], weights=[4, 2, 3, 1])[0]
        n = rng.randint(1, 1000) if tool != "flaky" else rng.choice([7, 14, 3, 5, 8, 9, 10, 11])
        params: dict[str, Any] = {"n": n}
        step: dict[str, Any] = {"id": i, "tool": tool, "params": params, "rationale": "torture"}
        if i > 1 and rng.random() < 0.6:  # mostly chains, some independent steps
            step["condition"] = f"${{{rng.randint(1, i - 1)}}} >= 0"
        steps.append(step)
    return {"task": f"torture {number}", "category": "torture", "steps": steps}


def submit(db: str, rng: random.Random, first: int, count: int) -> None:
    """Submit and approve ``count`` plans numbered from ``first``."""
    from plangate import Catalogue
    from plangate.runtime import Runtime

    rt = Runtime(Catalogue.from_module(TOOLS), db=own(db))
    try:
        for number in range(first, first + count):
            record = rt.submit(make_plan(rng, number), "torture")
            rt.approve(record.id, "reviewer", record.hash)
    finally:
        rt.close()


def own(db: str) -> str:
    """The URL of a connection of the bench's own: on PostgreSQL, named so that the cuts spare it."""
    return f"{db}?application_name={BENCH}" if db.startswith("postgres") and "?" not in db else db


def killed(folder: Path, pid: int) -> None:
    """Write down a worker process killed (the check reads which answers a SIGKILL may have lost)."""
    with (folder / "killed").open("a") as out:
        out.write(f"{pid}\n")


def setup(folder: Path, plans: int, seed: int) -> str:
    db = f"sqlite:///{folder}/plangate.db"
    submit(db, random.Random(seed), 0, plans)
    return db


def unfinished(db: str) -> int:
    from plangate.store import open_store

    with closing(open_store(own(db))) as store:
        rows = store.query("SELECT count(*) FROM plans WHERE status IN ('approved', 'running')")
    return int(rows[0][0])


def torture(db: str, folder: Path, *, kills: int, seed: int, max_delay: float) -> int:
    """Kill the worker ``kills`` times (or until every plan ended); then finish cleanly. Returns kills done."""
    rng = random.Random(seed + 1)
    env = {**os.environ, "TORTURE_LEDGER": str(folder / "ledger.db")}
    done = 0
    while done < kills and unfinished(db):
        with subprocess.Popen(
            [sys.executable, "-c", WORKER, str(TOOLS), db], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        ) as worker:
            assert worker.stdout is not None
            worker.stdout.readline()  # the worker is up: the kill lands while it works
            time.sleep(rng.uniform(0.0, max_delay))
            if worker.poll() is None:
                worker.send_signal(signal.SIGKILL)
                killed(folder, worker.pid)
                done += 1
            worker.wait()
    subprocess.run([sys.executable, "-c", WORKER, str(TOOLS), db], env=env, check=True, stdout=subprocess.DEVNULL)
    return done


# -- several workers at once --------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Fleet:
    """How the workers run: how many processes, plans at once in each, their lease."""

    db: str
    folder: Path
    workers: int = 3
    concurrency: int = 4
    lease: float = 2.0
    max_delay: float = 1.0
    """Longest a worker serves, once it said it was up, before the kill (s)."""
    cut_every: tuple[float, float] | None = None
    """The time between two cuts of the workers' connections, drawn from this range (s). Default: half the
    lease to a lease, so that the store is back for a while after each cut, as after a restart or a network
    cut, and a run it cut off can take itself back within its lease."""

    def cut_gap(self, rng: random.Random) -> float:
        return rng.uniform(*(self.cut_every or (self.lease / 2, self.lease)))

    def command(self, name: str, *, drain: bool = False) -> list[str]:
        command = [sys.executable, "-m", "plangate", "worker", "--tools", str(TOOLS), "--db", self.db]
        command += ["--concurrency", str(self.concurrency), "--lease", str(self.lease), "--name", name]
        return [*command, "--drain-timeout", "5", *(["--drain"] if drain else [])]

    def env(self) -> dict[str, str]:
        return {**os.environ, "TORTURE_LEDGER": str(self.folder / "ledger.db")}


@dataclass
class _Slot:
    """One worker process: its log (its first line says it serves) and the moment it is killed."""

    name: str
    log: Path
    process: subprocess.Popen[bytes]
    kill_at: float | None = None


@dataclass
class FleetStats:
    kills: int = 0
    cuts: int = 0
    """Cuts that ended at least one worker connection."""
    connections_cut: int = 0
    exits: int = 0
    """Workers that ended on their own before their kill (never expected: each serves until stopped)."""
    starts: int = 0
    plans: int = 0
    unfinished_when_kills_stopped: int = 0
    left_to_last_worker: int = 0
    errors: list[str] = field(default_factory=list)


def torture_workers(fleet: Fleet, *, plans: int, kills: int, seed: int, backlog: int = 0, cuts: int = 0) -> FleetStats:
    """Kill random workers of the fleet ``kills`` times, and cut every worker's store connections ``cuts``
    times (PostgreSQL), while new plans arrive; then let everything end.

    ``plans`` are submitted first; a feeder submits more whenever fewer than ``backlog``
    (default: twice the fleet's capacity) are left to run, so the workers never run dry.
    """
    rng, cut_rng = random.Random(seed + 1), random.Random(seed + 3)
    stats = FleetStats()
    backlog = backlog or 2 * fleet.workers * fleet.concurrency
    submit(fleet.db, random.Random(seed), 0, plans)
    stats.plans = plans
    next_cut = time.monotonic() + fleet.cut_gap(cut_rng)
    with _feeding(fleet.db, random.Random(seed + 2), stats, backlog), _cutter(fleet.db, cuts) as cut:
        slots = [_start(fleet, f"w{i}", stats) for i in range(fleet.workers)]
        while (stats.kills < kills or stats.cuts < cuts) and stats.exits < 10:  # workers that keep dying: a failure
            time.sleep(0.01)
            for i, slot in enumerate(slots):
                if _due(slot, rng, fleet.max_delay if stats.kills < kills else None):
                    slots[i] = _kill_and_restart(fleet, slot, stats)
            if stats.cuts < cuts and time.monotonic() >= next_cut and _serving(slots):
                _cut(cut, stats)
                next_cut = time.monotonic() + fleet.cut_gap(cut_rng)
    _settle(fleet, slots, stats)
    return stats


@contextmanager
def _cutter(db: str, cuts: int) -> Iterator[Any]:
    """The bench's connection that cuts the workers' (None when there are no cuts to make)."""
    if not cuts:
        yield None
        return
    import psycopg

    with psycopg.connect(own(db), autocommit=True) as conn:
        yield conn


def _serving(slots: list[_Slot]) -> bool:
    """Whether every worker said it serves (a cut lands while they work, not while they start)."""
    return all(slot.log.stat().st_size > 0 for slot in slots)


def _cut(conn: Any, stats: FleetStats) -> None:
    """End every connection of the workers to the database, as a server restart or a network cut does."""
    ended = int(conn.execute(CUT, (BENCH,)).fetchone()[0])
    stats.cuts += ended > 0
    stats.connections_cut += ended


@contextmanager
def _feeding(db: str, rng: random.Random, stats: FleetStats, backlog: int) -> Iterator[None]:
    stop = threading.Event()

    def feed() -> None:
        while not stop.wait(0.2):
            if unfinished(db) < backlog:
                submit(db, rng, stats.plans, backlog)
                stats.plans += backlog

    feeder = threading.Thread(target=feed, name="torture-feeder")
    feeder.start()
    try:
        yield
    finally:
        stop.set()
        feeder.join()


def _start(fleet: Fleet, name: str, stats: FleetStats) -> _Slot:
    stats.starts += 1
    log = fleet.folder / f"{name}-{stats.starts}.log"
    with log.open("wb") as out:  # the child keeps its own descriptor
        process = subprocess.Popen(fleet.command(name), env=fleet.env(), stdout=subprocess.DEVNULL, stderr=out)
    return _Slot(name, log, process)


def _due(slot: _Slot, rng: random.Random, max_delay: float | None) -> bool:
    """Whether the slot's worker is to be killed now (None: no more kills), or died on its own."""
    if slot.process.poll() is not None:
        return True
    if max_delay is None:
        return False
    if slot.kill_at is None:
        if slot.log.stat().st_size == 0:
            return False  # still starting: a kill now would not land while it works
        slot.kill_at = time.monotonic() + rng.uniform(0.0, max_delay)
    return time.monotonic() >= slot.kill_at


def _kill_and_restart(fleet: Fleet, slot: _Slot, stats: FleetStats) -> _Slot:
    if slot.process.poll() is None:
        slot.process.send_signal(signal.SIGKILL)
        killed(fleet.folder, slot.process.pid)
        stats.kills += 1
    else:
        stats.exits += 1
        stats.errors.append(f"{slot.name} exited with {slot.process.returncode}: {slot.log.read_text()[-2000:]}")
    slot.process.wait()
    slot.log.unlink()
    return _start(fleet, slot.name, stats)


def _settle(fleet: Fleet, slots: list[_Slot], stats: FleetStats) -> None:
    """After the last kill: the survivors drain (SIGTERM), the last lease expires, a last worker runs the rest."""
    stats.unfinished_when_kills_stopped = unfinished(fleet.db)
    deadline = time.monotonic() + 120
    while unfinished(fleet.db) and time.monotonic() < deadline and all(s.process.poll() is None for s in slots):
        time.sleep(0.2)
    for slot in slots:
        slot.process.send_signal(signal.SIGTERM)
    for slot in slots:
        slot.process.wait(60)
    time.sleep(fleet.lease + 0.2)  # every lease a worker held has expired now
    stats.left_to_last_worker = unfinished(fleet.db)
    subprocess.run(
        fleet.command("last", drain=True),
        env=fleet.env(),
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=300,
    )


# -- the check ----------------------------------------------------------------------------
def check(db: str, folder: Path) -> dict[str, int]:
    import sqlite3

    from plangate.store import open_store

    with closing(sqlite3.connect(folder / "ledger.db")) as ledger:
        effects = Counter((p, s) for p, s in ledger.execute("SELECT plan, step FROM effects"))
        sends = Counter((p, s) for p, s in ledger.execute("SELECT plan, step FROM sends"))
        calls = Counter((p, s) for p, s, _ in ledger.execute("SELECT plan, step, tool FROM calls"))
        returned = {(p, s): pid for p, s, pid in ledger.execute("SELECT plan, step, pid FROM returns")}
    sent_steps: dict[str, set[int]] = defaultdict(set)
    for plan_id, step_id in sends:
        sent_steps[plan_id].add(step_id)
    dead = {int(pid) for pid in (folder / "killed").read_text().split()} if (folder / "killed").exists() else set()
    counts = Counter[str]()
    with closing(open_store(db)) as store:
        for row in store.list_plans(limit=10**6):
            counts["plans"] += 1
            counts[f"plans {row.status}"] += 1
            if row.status in ("approved", "running"):
                counts["plans that did not end"] += 1
            version = store.get_version(row.id, row.version)
            tools = _tools_of(version.body if version else "{}")
            steps = store.steps(row.id)
            _check_steps(steps, row.id, tools, (effects, sends, sent_steps[row.id]), counts)
            answered = {s: pid for (p, s), pid in returned.items() if p == row.id}
            if answered:
                _check_known(steps, answered, dead, list(store.events(row.id)), counts)
        counts["audit log intact"] = int(store.verify_audit().ok)
    for name in ("known outcomes lost", "known outcomes recorded after a cut"):
        counts[name] += 0  # said even when none
    counts["duplicated effects of idempotent tools"] = sum(1 for n in effects.values() if n > 1)
    counts["silent re-runs of non-idempotent tools"] = sum(1 for n in sends.values() if n > 1)
    counts["idempotent re-runs with the same key (allowed)"] = sum(
        n - 1 for key, n in calls.items() if n > 1 and key not in sends
    )
    counts["tool calls"] = sum(calls.values())
    return dict(counts)


def _check_steps(
    steps: dict[int, Any],
    plan_id: str,
    tools: dict[int, str],
    ledger: tuple[Counter[tuple[str, int]], Counter[tuple[str, int]], set[int]],
    counts: Counter[str],
) -> None:
    effects, sends, sent = ledger
    for step_id, step in steps.items():
        key = (plan_id, step_id)
        counts["steps recorded"] += 1
        if step.status == "succeeded":
            counts["steps succeeded"] += 1
            name = tools.get(step_id, "")
            if (name == "idem" and effects[key] != 1) or (name == "once" and sends[key] != 1):
                counts["lost or duplicated completed steps"] += 1
        if step.status == "outcome_unknown":
            counts["steps waiting for a person (outcome unknown)"] += 1
    for step_id in sent:
        if step_id not in steps or steps[step_id].status not in ("succeeded", "outcome_unknown"):
            counts["sends the store does not know about"] += 1


def _check_known(
    steps: dict[int, Any], answered: dict[int, int], dead: set[int], events: list[Any], counts: Counter[str]
) -> None:
    """The non-idempotent steps whose tool returned (``answered``: step -> the process it ran in): none left of
    unknown outcome unless that process was killed; those whose run took itself back after a cut to record
    them (a run resumed between the step's start and its outcome) counted."""
    for step_id, pid in answered.items():
        status = steps[step_id].status if step_id in steps else None
        if status == "outcome_unknown":
            counts["known outcomes lost to a SIGKILL (allowed)" if pid in dead else "known outcomes lost"] += 1
        elif status == "succeeded" and _taken_back(events, step_id):
            counts["known outcomes recorded after a cut"] += 1


def _taken_back(events: list[Any], step_id: int) -> bool:
    """Whether a run resumed between the step's last start and its success: its outcome was carried over."""
    kinds = [e.kind for e in events if e.step_id == step_id or e.kind == "run.resumed"]
    last_start = max(i for i, kind in enumerate(kinds) if kind == "step.started")
    return "run.resumed" in kinds[last_start : kinds.index("step.succeeded", last_start)]


def _tools_of(body: str) -> dict[int, str]:
    return {int(s["id"]): str(s["tool"]) for s in json.loads(body).get("steps", [])}


def failed(counts: dict[str, int]) -> bool:
    return any(counts.get(name, 0) for name in BAD) or not counts.get("audit log intact")


# -- the command --------------------------------------------------------------------------
@contextmanager
def database(spec: str, folder: Path) -> Iterator[str]:
    """The store to torture: SQLite in ``folder``, a throwaway PostgreSQL cluster, or a URL."""
    if spec == "sqlite":
        yield f"sqlite:///{folder}/plangate.db"
    elif spec == "postgresql":
        from plangate.testing import postgres_cluster

        with postgres_cluster() as url:
            yield url
    else:
        yield spec


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--db", default="sqlite", help="sqlite (default), postgresql (a throwaway cluster) or a URL")
    parser.add_argument("--workers", type=int, help="worker processes (default: 1 on SQLite, 3 otherwise)")
    parser.add_argument("--concurrency", type=int, default=4, help="plans each worker runs at once (several workers)")
    parser.add_argument("--plans", type=int, default=600, help="plans (several workers: the first batch; more follow)")
    parser.add_argument("--kills", type=int, default=500)
    parser.add_argument("--cuts", type=int, default=0, help="cuts of every worker's store connections (PostgreSQL)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-delay", type=float, help="longest a worker works before the kill (s)")
    args = parser.parse_args()
    if args.cuts and args.db == "sqlite":
        parser.error("--cuts cuts PostgreSQL connections: use --db postgresql")
    folder = Path(tempfile.mkdtemp(prefix="plangate-torture-"))
    os.environ["TORTURE_LEDGER"] = str(folder / "ledger.db")
    workers = args.workers or (1 if args.db == "sqlite" else 3)
    with database(args.db, folder) as db:
        start = time.monotonic()
        stats: FleetStats | None = None
        if workers == 1 and db.startswith("sqlite"):
            submit(db, random.Random(args.seed), 0, args.plans)
            kills = torture(db, folder, kills=args.kills, seed=args.seed, max_delay=args.max_delay or 0.3)
            head = "one worker"
        else:
            fleet = Fleet(
                db=db, folder=folder, workers=workers, concurrency=args.concurrency, max_delay=args.max_delay or 1.0
            )
            stats = torture_workers(fleet, plans=args.plans, kills=args.kills, seed=args.seed, cuts=args.cuts)
            kills = stats.kills
            head = f"{workers} workers at concurrency {args.concurrency}, {stats.cuts} cuts of their connections"
        elapsed = time.monotonic() - start
        counts = check(db, folder)
    _report(head, counts, stats, kills, elapsed)
    return 1 if failed(counts) or (stats is not None and stats.exits) else 0


def _report(head: str, counts: dict[str, int], stats: FleetStats | None, kills: int, elapsed: float) -> None:
    plans = counts.get("plans", 0)
    print(f"{head}, {kills} SIGKILLs at random moments: {plans} plans, {elapsed:.0f} s")
    if stats is not None and stats.cuts:
        counts = {**counts, "worker connections cut": stats.connections_cut}
    for name, value in sorted(counts.items()):
        print(f"  {name:<52} {value}")
    if stats is not None:
        print(f"  {'worker starts':<52} {stats.starts}")
        print(f"  {'workers that ended on their own (must be 0)':<52} {stats.exits}")
        print(f"  {'plans unfinished when the kills and cuts stopped':<52} {stats.unfinished_when_kills_stopped}")
        print(f"  {'plans left to the last worker (after the drain)':<52} {stats.left_to_last_worker}")
        for error in stats.errors[:3]:
            print(f"  worker error: {error}")
    rate = plans / elapsed if elapsed else 0.0
    reruns = counts.get("idempotent re-runs with the same key (allowed)", 0)
    unknown = counts.get("steps waiting for a person (outcome unknown)", 0)
    print(f"  plans per second under fire {rate:.1f}; kills per plan {kills / max(plans, 1):.2f}")
    if kills:
        print(f"  per kill: {reruns / kills:.2f} idempotent re-runs, {unknown / kills:.2f} steps halted")
    if stats is not None and stats.cuts:
        carried = counts.get("known outcomes recorded after a cut", 0)
        ended = stats.connections_cut / stats.cuts
        print(f"  per cut: {ended:.1f} connections ended, {carried / stats.cuts:.2f} answers kept")
    bad = sum(counts.get(name, 0) for name in BAD)
    print("  PASS: nothing lost, nothing repeated, every plan ended" if not bad else f"  FAIL: {bad} problems")


if __name__ == "__main__":
    sys.exit(main())
