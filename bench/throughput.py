"""Benchmark: plans per second through `plangate worker` processes on PostgreSQL.

Concurrency 1, 8 and 32, with one and with two worker processes, for plans of 5 steps that
each wait 10 ms (I/O, not CPU): independent steps (they run side by side within a plan) and
chained steps (each takes the one before it). Every figure is a ratio to the single worker
at concurrency 1 measured in the same run. The time counted runs from the first plan's
start to the last plan's end in the audit log, so a process's start-up is not counted.
``--profile`` then runs one worker at concurrency 32 in this process under cProfile and
counts the statements it sends to PostgreSQL per plan.

Run: ``python bench/throughput.py [--quick] [--profile]`` (``bench/engine.py`` runs it too).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from datetime import datetime
from typing import Any

from plangate import Catalogue, tool
from plangate.runtime import Runtime
from plangate.store import open_store

STEPS = 5
CONCURRENCY = (1, 8, 32)
WORKERS = (1, 2)


@tool
def wait10(i: int) -> int:
    """A step that waits 10 ms on something outside (I/O)."""
    time.sleep(0.01)
    return i


def plan(number: int, chained: bool) -> dict[str, Any]:
    steps = [
        {"id": i, "tool": "wait10", "params": {"i": f"${{{i - 1}}}" if chained and i > 1 else number}, "rationale": "b"}
        for i in range(1, STEPS + 1)
    ]
    return {"task": f"plan {number}", "category": "bench", "steps": steps}


def submit(db: str, plans: int, chained: bool) -> None:
    rt = Runtime(Catalogue([wait10]), db=db)
    for number in range(plans):
        record = rt.submit(plan(number, chained), "bench")
        rt.approve(record.id, "reviewer", record.hash)
    rt.close()


def plans_per_second(db: str) -> float:
    """Finished plans over the time from the first run's start to the last run's end (the audit log's clock)."""
    with closing(open_store(db)) as store:
        rows = store.query("SELECT MIN(at), MAX(at) FROM events WHERE kind IN ('run.started', 'plan.succeeded')")
        ended = store.query("SELECT COUNT(*) FROM plans WHERE status = 'succeeded'")[0][0]
    first, last = rows[0]
    seconds = (datetime.fromisoformat(str(last)) - datetime.fromisoformat(str(first))).total_seconds()
    return float(ended) / seconds


def run_workers(db: str, workers: int, concurrency: int) -> None:
    command = [sys.executable, "-m", "plangate", "worker", "--tools", __file__, "--db", db, "--drain", "--lease", "30"]
    running = [
        subprocess.Popen(
            [*command, "--concurrency", str(concurrency), "--name", f"w{i}"],
            env=dict(os.environ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(workers)
    ]
    for process in running:
        if process.wait() != 0:
            raise RuntimeError(f"a worker exited with {process.returncode}")


def table(url: str, quick: bool) -> dict[tuple[str, int, int], float]:
    from plangate.testing import fresh_database

    figures: dict[tuple[str, int, int], float] = {}
    for shape in ("independent", "chained"):
        for workers in WORKERS:
            for concurrency in CONCURRENCY:
                plans = (20 if quick else 60) if concurrency == 1 and workers == 1 else (120 if quick else 400)
                db = fresh_database(url, f"tp_{shape}_{workers}_{concurrency}_{os.getpid()}")
                submit(db, plans, shape == "chained")
                run_workers(db, workers, concurrency)
                figures[shape, workers, concurrency] = plans_per_second(db)
    print(f"\nplans per second on PostgreSQL: plans of {STEPS} steps that each wait 10 ms")
    print(f"  {'steps':12} {'workers':>7} {'concurrency':>11} {'plans/s':>8}  ratio to 1 worker at concurrency 1")
    for (shape, workers, concurrency), value in figures.items():
        base = figures[shape, 1, 1]
        print(f"  {shape:12} {workers:7} {concurrency:11} {value:8.1f}  {value / base:5.1f}x")
    target = figures["independent", 2, 32] / figures["independent", 1, 1]
    print(f"target: 2 workers at concurrency 32 >= 10x: {target:.1f}x -> {'meets' if target >= 10 else 'MISSES'} it")
    return figures


@contextmanager
def counted_statements() -> Iterator[dict[str, list[float]]]:
    """Count and time the statements every psycopg connection in this process sends (each a round trip)."""
    import psycopg

    seen: dict[str, list[float]] = {}
    original = psycopg.Cursor.execute

    def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(self, query, *args, **kwargs)
        finally:
            figures = seen.setdefault(" ".join(str(query).split())[:60], [0, 0.0])
            figures[0] += 1
            figures[1] += time.perf_counter() - start

    psycopg.Cursor.execute = execute  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        psycopg.Cursor.execute = original  # type: ignore[method-assign]


def postgres_cpu(url: str) -> float:
    """CPU seconds the cluster's processes (the postmaster serving ``url`` and its children) have used."""
    port = url.rsplit(":", 1)[1].split("/", maxsplit=1)[0]
    tick, found, total = os.sysconf("SC_CLK_TCK"), {}, 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            command = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()  # noqa: SIM115
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()  # noqa: SIM115
        except OSError:
            continue
        found[pid] = (command, fields)
    master = next(
        (pid for pid, (command, _) in found.items() if "postgres" in command and f"-p {port}" in command), None
    )
    for pid, (_, fields) in found.items():
        if master is not None and master in (pid, fields[1]):
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def profile(url: str, quick: bool) -> None:
    """One worker at concurrency 32 in this process: CPU of the worker and of PostgreSQL, statements
    counted and timed; then again under cProfile."""
    from plangate.testing import fresh_database
    from plangate.worker import Worker

    plans = 100 if quick else 300
    print(f"\nprofile: 1 worker in-process, concurrency 32, {plans} plans of {STEPS} independent 10 ms steps")
    db = fresh_database(url, f"tp_measured_{os.getpid()}")
    submit(db, plans, chained=False)
    worker = Worker(Catalogue([wait10]), db=db, concurrency=32)
    with counted_statements() as statements:
        start_cpu, start_pg, start = time.process_time(), postgres_cpu(url), time.perf_counter()
        worker.serve(drain=True)
        cpu, pg, wall = time.process_time() - start_cpu, postgres_cpu(url) - start_pg, time.perf_counter() - start
    worker.close()
    count, each = sum(n for n, _ in statements.values()), 1000 / plans
    print(f"  {plans / wall:.1f} plans/s, {wall * each:.1f} ms of wall time a plan; CPU a plan:")
    print(f"  the worker {cpu * each:.1f} ms, PostgreSQL {pg * each:.1f} ms ({(cpu + pg) / wall:.2f} cores)")
    print(f"  {count / plans:.1f} statements sent to PostgreSQL per plan ({count / plans / STEPS:.1f} a step)")
    print("  the statements that took longest, wall time summed over the runs (a lock waited for counts):")
    for text, (n, seconds) in sorted(statements.items(), key=lambda kv: -kv[1][1])[:6]:
        print(f"    {seconds * 1000 / plans:6.2f} ms a plan  {n / plans:4.1f} a plan  {text}")
    # cProfile in a fresh process, so that every thread the runs use is started under it.
    db = fresh_database(url, f"tp_profiled_{os.getpid()}")
    submit(db, plans, chained=False)
    subprocess.run([sys.executable, __file__, "--cprofile", db], check=True)


def cprofile(db: str) -> None:
    """One worker at concurrency 32 under cProfile, in every thread; plangate's functions by own time."""
    from plangate.worker import Worker

    worker = Worker(Catalogue([wait10]), db=db, concurrency=32)
    with profiled() as profilers:
        worker.serve(drain=True)
    worker.close()
    out = io.StringIO()
    stats = pstats.Stats(stream=out)
    for profiler in profilers:
        profiler.create_stats()
        stats.add(profiler)
    stats.sort_stats("tottime").print_stats(60)
    waiting = ("acquire", "wait", "sleep", "poll", "_queue", "select")  # blocked, not computing
    lines = [line for line in out.getvalue().splitlines() if ".py:" in line or "{" in line]
    computing = [line for line in lines if not any(word in line for word in waiting)]
    print("  the functions with the most own time, all threads, waits left out (cProfile slows them several times):")
    print("\n".join("    " + line for line in computing[:15]))


@contextmanager
def profiled() -> Iterator[list[cProfile.Profile]]:
    """cProfile in this thread and in every thread started meanwhile (the runs', the tools')."""
    import threading

    profilers = [cProfile.Profile()]

    def start(*_: object) -> None:
        sys.setprofile(None)
        profiler = cProfile.Profile()
        profilers.append(profiler)
        profiler.enable()

    threading.setprofile(start)
    profilers[0].enable()
    try:
        yield profilers
    finally:
        profilers[0].disable()
        threading.setprofile(None)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer plans: a short run")
    parser.add_argument("--profile", action="store_true", help="then profile one worker in this process")
    parser.add_argument("--cprofile", metavar="DB", help=argparse.SUPPRESS)  # profile's child process
    args = parser.parse_args()
    if args.cprofile:
        cprofile(args.cprofile)
        return 0
    from plangate.testing import postgres_cluster

    with postgres_cluster() as url:
        table(url, args.quick)
        if args.profile:
            profile(url, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
