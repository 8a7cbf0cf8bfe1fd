"""Benchmark: the durable engine's per-step overhead, next to a plain loop and to peers.

Every figure is measured in this run, on this machine:

- a plain loop doing one SQLite INSERT + COMMIT per step (WAL, synchronous=NORMAL): the
  floor for any engine that records each step durably;
- plangate on SQLite, synchronous=normal (survives a process crash) and =full (survives
  power loss), sequential chains of 10 and 100 no-op steps, with commits counted;
- LangGraph with its SQLite checkpointer and durability="sync", and DBOS with its SQLite
  system database, on the same chains (the `bench` extra installs them);
- 10 independent steps that each sleep 100 ms: plangate runs them at the same time;
- on PostgreSQL, plans per second through worker processes at concurrency 1, 8 and 32
  (bench/throughput.py), as ratios to one worker at concurrency 1.

- with ``--previous SRC`` (a checkout's ``src`` folder of an earlier plangate): the 100-step
  chain with synchronous=normal run by that tree and by this one in alternating processes,
  median and best of the rounds, and their ratio; then where each tree's step time goes (the
  commit and the WAL pages it writes, the other statements, and the rest: Python).

Run: ``make bench`` or ``python bench/engine.py [--repeat N] [--quick] [--previous SRC [--rounds N]]``.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # throughput.py and trees.py, beside this file

import throughput
import trees
from plangate import Catalogue, tool
from plangate.runtime import Runtime

CHAINS = (10, 100)


@tool
def noop(i: int) -> int:
    return i


@tool
def nap(i: int) -> int:
    time.sleep(0.1)
    return i


def chain(n: int) -> dict[str, Any]:
    steps = [
        {"id": i, "tool": "noop", "params": {"i": f"${{{i - 1}}}" if i > 1 else 0}, "rationale": "bench"}
        for i in range(1, n + 1)
    ]
    return {"task": f"chain of {n}", "category": "bench", "steps": steps}


def median_ms_per_step(
    run: Callable[[], None], steps: int, repeat: int, clock: Callable[[], float] = time.perf_counter
) -> float:
    samples = []
    for _ in range(repeat):
        start = clock()
        run()
        samples.append((clock() - start) * 1000 / steps)
    return statistics.median(samples)


def plain_loop(folder: Path, n: int, repeat: int) -> float:
    conn = sqlite3.connect(folder / "plain.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("CREATE TABLE IF NOT EXISTS steps (run INTEGER, step INTEGER, output TEXT)")
    runs = iter(range(10**9))

    def run() -> None:
        number = next(runs)
        for i in range(n):
            conn.execute("BEGIN")
            conn.execute("INSERT INTO steps VALUES (?, ?, ?)", (number, i, str(i)))
            conn.execute("COMMIT")

    return median_ms_per_step(run, n, repeat)


def plangate_chain(
    folder: Path,
    n: int,
    repeat: int,
    synchronous: str,
    db: str | None = None,
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, float]:
    """ms/step (by ``clock``: wall time unless told) and commits/step."""
    rt = Runtime(Catalogue([noop]), db=db or f"sqlite:///{folder}/plangate-{synchronous}.db?synchronous={synchronous}")
    commits = [0, 0]  # commits, statements
    ids = []
    for _ in range(repeat):
        record = rt.submit(chain(n), "bench")
        ids.append(rt.approve(record.id, "reviewer", record.hash).id)
    pending = iter(ids)

    def count(statement: str) -> None:
        commits[0] += statement.strip().upper() == "COMMIT"
        commits[1] += 1

    def run() -> None:
        assert rt.execute(next(pending)).ok

    sqlite = db is None
    if sqlite:
        rt.store._conn.set_trace_callback(count)  # type: ignore[attr-defined]
    per_step = median_ms_per_step(run, n, repeat, clock)
    if sqlite:
        rt.store._conn.set_trace_callback(None)  # type: ignore[attr-defined]
    rt.close()
    STATEMENTS[synchronous, n] = commits[1] / (repeat * n)
    return per_step, commits[0] / (repeat * n)


STATEMENTS: dict[tuple[str, int], float] = {}
"""SQL statements per step (commits included), per (synchronous, steps), as counted by the last run."""


class _TimedConnection:
    """A store's SQLite connection with every statement timed (COMMIT apart), for :func:`split_chain`."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn, self.commit, self.other = conn, 0.0, 0.0

    def execute(self, query: str, *params: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.conn.execute(query, *params)
        finally:
            spent = time.perf_counter() - start
            if query == "COMMIT":
                self.commit += spent
            else:
                self.other += spent

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def split_chain(folder: Path, n: int, repeat: int) -> tuple[float, float, float, float]:
    """Where a step's wall time goes on SQLite, synchronous=normal (ms/step): the commits, the other
    statements, the rest (Python: the engine, the audit log's hashing, the tool's validation), and the
    WAL pages a commit writes (SQLite's own checkpoints held off for the run, so the WAL keeps them all)."""
    rt = Runtime(Catalogue([noop]), db=f"sqlite:///{folder}/split.db?synchronous=normal")
    ids = []
    for _ in range(repeat + 1):
        record = rt.submit(chain(n), "bench")
        ids.append(rt.approve(record.id, "reviewer", record.hash).id)
    assert rt.execute(ids.pop()).ok  # warm
    conn = rt.store._conn  # type: ignore[attr-defined]
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    timed = _TimedConnection(conn)
    # The timing's own cost per statement, taken off the rest below.
    plain = min(timeit.repeat(lambda: conn.execute("SELECT 1"), number=2000, repeat=5)) / 2000
    wrapped = min(timeit.repeat(lambda: timed.execute("SELECT 1"), number=2000, repeat=5)) / 2000
    timed.commit = timed.other = 0.0
    counts = [0, 0]  # commits, statements

    def count(statement: str) -> None:
        counts[0] += statement == "COMMIT"
        counts[1] += 1

    conn.set_trace_callback(count)
    rt.store._conn = timed  # type: ignore[attr-defined]
    start = time.perf_counter()
    for plan_id in ids:
        assert rt.execute(plan_id).ok
    total = time.perf_counter() - start
    rt.store._conn = conn  # type: ignore[attr-defined]
    conn.set_trace_callback(None)
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    frames = (Path(f"{folder}/split.db-wal").stat().st_size - 32) / (page + 24)
    rt.close()
    steps = repeat * n / 1000
    rest = total - timed.commit - timed.other - counts[1] * max(wrapped - plain, 0.0)
    return timed.commit / steps, timed.other / steps, rest / steps, frames / max(counts[0], 1)


_ONE_CHAIN = (
    "import pathlib, sys, tempfile, time; sys.path.insert(0, {bench!r}); import engine; "
    "chain = lambda clock: engine.plangate_chain(pathlib.Path(tempfile.mkdtemp()), {n}, {repeat}, 'normal', "
    "clock=clock)[0]; print(chain(time.perf_counter), chain(time.process_time))"
)
_SPLIT = (
    "import pathlib, sys, tempfile; sys.path.insert(0, {bench!r}); import engine; "
    "print(*engine.split_chain(pathlib.Path(tempfile.mkdtemp()), {n}, {repeat}))"
)


def against_previous(previous: str, rounds: int, repeat: int, n: int = 100) -> None:
    """This tree and an earlier one on the same chain, in alternating processes (so both see the same machine)."""
    script = _ONE_CHAIN.format(bench=str(Path(__file__).resolve().parent), n=n, repeat=repeat)
    chains = trees.alternating(previous, rounds, [sys.executable, "-c", script])
    wall = {label: [float(words[-2]) for words in runs] for label, runs in chains.items()}
    cpu = {label: [float(words[-1]) for words in runs] for label, runs in chains.items()}
    print(f"\n{n}-step chain, synchronous=normal, {rounds} alternating rounds of {repeat} runs (ms/step)")
    print(f"  previous tree: {previous}")
    for name, samples in (("wall time", wall), ("CPU time", cpu)):
        old, new = statistics.median(samples["previous"]), statistics.median(samples["this"])
        best_old, best_new = min(samples["previous"]), min(samples["this"])
        print(f"  {name:9}  previous tree median {old:7.3f} best {best_old:7.3f}")
        print(f"  {name:9}  this tree     median {new:7.3f} best {best_new:7.3f}")
        print(
            f"  -> this tree takes {new / old:.2f}x the previous one's {name} per step"
            f" (best: {best_new / best_old:.2f}x)"
        )
    print("  (CPU time: of the whole process, all its threads; steadier than wall time on a shared machine)")
    script = _SPLIT.format(bench=str(Path(__file__).resolve().parent), n=n, repeat=repeat)
    printed = trees.alternating(previous, max(rounds // 3, 1), [sys.executable, "-c", script])
    split = {label: [tuple(float(value) for value in words[-4:]) for words in runs] for label, runs in printed.items()}
    print("  where a step's wall time goes: each statement timed, SQLite's checkpoints held off (ms/step, medians):")
    print("                   commit  (WAL pages)  other statements  the rest (Python)   total")
    totals: dict[str, tuple[float, float]] = {}  # per tree: (the statements, the whole step)
    for label, runs in split.items():
        commit, other, rest, pages = (statistics.median(column) for column in zip(*runs, strict=True))
        totals[label] = (commit + other, commit + other + rest)
        print(
            f"  {label + ' tree':15} {commit:7.3f}  ({pages:4.1f})     {other:10.3f}       {rest:10.3f}"
            f"        {commit + other + rest:6.3f}"
        )
    statements, whole = totals["this"][0], totals["previous"][1]
    print(
        f"  this tree's statements alone, with no Python at all, take {statements / whole:.2f}x the previous tree's"
        f" whole step: at half of it, {max(whole / 2 - statements, 0.0):.3f} ms/step would be left for the Python"
    )


def postgres(repeat: int, quick: bool = False) -> None:
    """Per-step overhead on PostgreSQL, and plans per second through workers (bench/throughput.py)."""

    from plangate.testing import fresh_database, postgres_cluster

    try:
        context = postgres_cluster()
        url = context.__enter__()
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        print(f"\nPostgreSQL: skipped ({exc})")
        return
    try:
        print("\nPostgreSQL 15 on loopback (fsync off: the throwaway cluster measures plangate, not the disk)")
        for n in CHAINS:
            per_step, _ = plangate_chain(Path("."), n, repeat, "normal", db=fresh_database(url, f"chain{n}"))
            print(f"  {n:3} steps: plangate {per_step:7.3f} ms/step")
        throughput.table(url, quick)
    finally:
        context.__exit__(None, None, None)


def temporal(repeat: int) -> None:
    """plangate on Temporal next to raw Temporal activities, per step, in the same run."""
    import asyncio

    from plangate.testing import temporal_server

    try:
        context = temporal_server()
        address = context.__enter__()
    except RuntimeError as exc:
        print(f"\nTemporal: skipped ({exc})")
        return
    try:
        raw, ours = asyncio.run(_temporal_chains(address, repeat))
    finally:
        context.__exit__(None, None, None)
    print("\nTemporal dev server on loopback, sequential chain of 20 no-op steps")
    print(f"  raw Temporal activities              {raw:7.3f} ms/step  (baseline)")
    print(
        f"  plangate on Temporal                 {ours:7.3f} ms/step  ({(ours / raw - 1) * 100:+.0f}% "
        "over Temporal's own cost; each step also writes plangate's durable records)"
    )


async def _temporal_chains(address: str, repeat: int) -> tuple[float, float]:
    import concurrent.futures
    import uuid

    from temporalio.client import Client
    from temporalio.worker import Worker

    from plangate.temporal import TASK_QUEUE, PlanWorkflow, hosted, start, workflow_args

    sys.path.insert(0, str(Path(__file__).parent))
    from temporal_chain import RawChain, noop_activity

    n = 20
    folder = Path(tempfile.mkdtemp(prefix="plangate-temporal-"))
    db = f"sqlite:///{folder}/t.db"
    rt = Runtime(Catalogue([noop]), db=db)
    client = await Client.connect(address)
    raw_samples, our_samples = [], []
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        async with Worker(
            client,
            task_queue=TASK_QUEUE,
            workflows=[PlanWorkflow, RawChain],
            activities=[*hosted(db, __file__), noop_activity],
            activity_executor=pool,
        ):
            for _ in range(repeat + 1):
                began = time.perf_counter()
                await client.execute_workflow(RawChain.run, n, id=f"raw-{uuid.uuid4()}", task_queue=TASK_QUEUE)
                raw_samples.append((time.perf_counter() - began) * 1000 / n)
                record = rt.submit(chain(n), "bench")
                rt.approve(record.id, "reviewer", record.hash)
                claim = rt.start(record.id, actor="bench")
                began = time.perf_counter()
                await (await start(client, db, claim, workflow_args(claim, rt.catalogue))).result()
                our_samples.append((time.perf_counter() - began) * 1000 / n)
    return statistics.median(raw_samples[1:]), statistics.median(our_samples[1:])


def langgraph_chain(folder: Path, n: int, repeat: int) -> float | str:
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, StateGraph
        from typing_extensions import TypedDict
    except ImportError:
        return "not installed (pip install -e '.[bench]')"

    class State(TypedDict):
        n: int

    def step(state: State) -> State:
        return {"n": state["n"] + 1}

    graph = StateGraph(State)
    previous = START
    for i in range(n):
        graph.add_node(f"s{i}", step)
        graph.add_edge(previous, f"s{i}")
        previous = f"s{i}"
    graph.add_edge(previous, END)
    conn = sqlite3.connect(folder / f"langgraph-{n}.db", check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    app = graph.compile(checkpointer=SqliteSaver(conn))
    threads = iter(range(10**9))

    def run() -> None:
        config: Any = {"configurable": {"thread_id": str(next(threads))}, "recursion_limit": n + 10}
        app.invoke({"n": 0}, config, durability="sync")

    return median_ms_per_step(run, n, repeat)


def dbos_chains(folder: Path, repeat: int) -> dict[int, float | str]:
    try:
        from dbos import DBOS
    except ImportError:
        return dict.fromkeys(CHAINS, "not installed (pip install -e '.[bench]')")
    import logging

    logging.getLogger("dbos").setLevel(logging.WARNING)
    DBOS(
        config={
            "name": "plangate-bench",
            "system_database_url": f"sqlite:///{folder}/dbos.sqlite",
            "log_level": "WARNING",
        }
    )

    @DBOS.step()
    def step(i: int) -> int:
        return i

    @DBOS.workflow()
    def workflow(n: int) -> int:
        for i in range(n):
            step(i)
        return n

    DBOS.launch()
    try:
        return {n: median_ms_per_step(lambda n=n: workflow(n), n, repeat) for n in CHAINS}  # type: ignore[misc]
    finally:
        DBOS.destroy()


def parallel_naps(folder: Path) -> float:
    rt = Runtime(Catalogue([nap]), db=f"sqlite:///{folder}/naps.db", max_concurrency=10)
    steps = [{"id": i, "tool": "nap", "params": {"i": i}, "rationale": "bench"} for i in range(1, 11)]
    record = rt.submit({"task": "naps", "category": "bench", "steps": steps}, "bench")
    rt.approve(record.id, "reviewer", record.hash)
    start = time.perf_counter()
    assert rt.execute(record.id).ok
    return (time.perf_counter() - start) * 1000


def fmt(value: float | str, base: float) -> str:
    if isinstance(value, str):
        return f"{value}"
    return f"{value:7.3f} ms/step  ({value / base:5.1f}x the plain loop)"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="runs of each chain (the median is reported)")
    parser.add_argument("--quick", action="store_true", help="a short run: 2 runs of each chain, fewer plans")
    parser.add_argument("--previous", metavar="SRC", help="an earlier plangate's src folder: the chain against it")
    parser.add_argument("--rounds", type=int, default=9, help="alternating rounds with --previous")
    parser.add_argument("--only-previous", action="store_true", help="with --previous: only that comparison")
    args = parser.parse_args()
    if args.quick:
        args.repeat = 2
    if args.previous:
        against_previous(args.previous, args.rounds, args.repeat)
        if args.only_previous:
            return 0
    folder = Path(tempfile.mkdtemp(prefix="plangate-bench-"))
    dbos = dbos_chains(folder, args.repeat)
    print("per-step overhead of a sequential chain of no-op steps; median of", args.repeat, "runs")
    results: dict[int, float] = {}
    for n in CHAINS:
        base = plain_loop(folder, n, args.repeat)
        normal, normal_commits = plangate_chain(folder, n, args.repeat, "normal")
        full, full_commits = plangate_chain(folder, n, args.repeat, "full")
        lang = langgraph_chain(folder, n, args.repeat)
        results[n] = normal
        print(f"\n{n} steps")
        print(f"  plain loop, 1 INSERT+COMMIT per step     {base:7.3f} ms/step  (baseline; no engine at all)")
        print(
            f"  plangate, synchronous=normal             {fmt(normal, base)}  {normal_commits:.2f} commits/step,"
            f" {STATEMENTS['normal', n]:.1f} statements/step  [survives a process crash]"
        )
        print(
            f"  plangate, synchronous=full               {fmt(full, base)}  {full_commits:.2f} commits/step"
            "  [survives power loss: 1 fsync per commit]"
        )
        print(f"  LangGraph + SqliteSaver, durability=sync {fmt(lang, base)}  [checkpoint per step; WAL, NORMAL]")
        print(f"  DBOS, SQLite system database             {fmt(dbos[n], base)}  [step outputs checkpointed]")
        for name, value in (("LangGraph", lang), ("DBOS", dbos[n])):
            if not isinstance(value, str):
                print(f"  -> plangate (normal) takes {normal / value:.2f}x the time of {name} per step")
    postgres(args.repeat, args.quick)
    temporal(args.repeat)
    naps = parallel_naps(folder)
    print(f"\n10 independent steps sleeping 100 ms each: {naps:.0f} ms wall time (target under 150 ms)")
    print(
        f"target: under 0.2 ms/step with synchronous=normal: 100-step chain {results[100]:.3f} ms/step -> "
        f"{'meets' if results[100] < 0.2 else 'MISSES'} it"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
