"""Soak: 10,000 plans through one ``plangate worker`` process; its resident memory must stay flat.

Plans of three chained steps are submitted 1,000 at a time (the idle worker paused
meanwhile); after each thousand has ended the worker's resident memory (``VmRSS`` in
``/proc/PID/status``) is sampled. The run passes when every plan succeeded and the last
sample is within 50 MiB of the one after the first 1,000 plans (the first thousand warms
caches and pools). Plans per second are measured from the
moment the worker goes on to the moment the thousand's last plan ended.

``--tracemalloc`` starts the worker under tracemalloc (25 frames): a snapshot is written
after the first thousand and at the end, and the lines whose allocations grew most
between the two are printed, which is where a leak lives.

Run: ``python bench/soak.py [--plans 10000] [--db postgresql] [--concurrency 8] [--tracemalloc]``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from plangate.store import open_store

sys.path.insert(0, str(Path(__file__).resolve().parent))
from torture import database  # the same stores as the torture: SQLite, a throwaway PostgreSQL, a URL

HERE = Path(__file__).resolve().parent
TOOLS = HERE / "soaktools.py"
BATCH = 1000
LIMIT_MIB = 50.0
# The worker under an optional tracemalloc; SIGUSR1 writes a snapshot to $SOAK_SNAPSHOTS/N.snap.
WORKER = """
import os, runpy, signal, sys, tracemalloc
if os.environ.get("SOAK_SNAPSHOTS"):
    tracemalloc.start(25)
    taken = iter(range(10**6))
    def snap(*_):
        tracemalloc.take_snapshot().dump(os.path.join(os.environ["SOAK_SNAPSHOTS"], f"{next(taken)}.snap"))
        print("snap", flush=True)
    signal.signal(signal.SIGUSR1, snap)
sys.argv = ["plangate", *sys.argv[1:]]
runpy.run_module("plangate", run_name="__main__")
"""


def make_plan(number: int) -> dict[str, object]:
    steps = [
        {"id": 1, "tool": "lookup", "params": {"n": number}, "rationale": "soak"},
        {"id": 2, "tool": "store_total", "params": {"total": "${1.total}"}, "rationale": "soak"},
        {"id": 3, "tool": "describe", "params": {"text": "${2}"}, "rationale": "soak"},
    ]
    return {"task": f"soak {number}", "category": "soak", "steps": steps}


def submit(db: str, first: int, count: int) -> None:
    from plangate import Catalogue
    from plangate.runtime import Runtime

    rt = Runtime(Catalogue.from_module(TOOLS), db=db)
    try:
        for number in range(first, first + count):
            record = rt.submit(make_plan(number), "soak")
            rt.approve(record.id, "reviewer", record.hash)
    finally:
        rt.close()


def unfinished(db: str) -> int:
    with closing(open_store(db)) as store:
        rows = store.query("SELECT count(*) FROM plans WHERE status IN ('approved', 'running')")
    return int(rows[0][0])


def rss_mib(pid: int) -> float:
    """The process's resident memory (VmRSS), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


@contextmanager
def worker(db: str, concurrency: int, snapshots: Path | None) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, **({"SOAK_SNAPSHOTS": str(snapshots)} if snapshots else {})}
    command = [sys.executable, "-c", WORKER, "worker", "--tools", str(TOOLS), "--db", db]
    command += ["--concurrency", str(concurrency), "--name", "soak"]
    with subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as process:
        try:
            yield process
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(60)


def soak(db: str, plans: int, concurrency: int, snapshots: Path | None) -> list[tuple[int, float, float]]:
    """Run the plans a thousand at a time; after each: (plans so far, RSS in MiB, plans per second)."""
    samples: list[tuple[int, float, float]] = []
    with worker(db, concurrency, snapshots) as process:
        for first in range(0, plans, BATCH):
            count = min(BATCH, plans - first)
            # The worker is idle (the last thousand ended): paused while the next is submitted,
            # so that plans per second count its work, not the submissions trickling in.
            process.send_signal(signal.SIGSTOP)
            submit(db, first, count)
            pending = unfinished(db)
            process.send_signal(signal.SIGCONT)
            start = time.monotonic()
            if pending != count:
                print(f"  (only {pending} of {count} were left to run when the paused worker went on)", flush=True)
            while unfinished(db):
                if process.poll() is not None:
                    raise RuntimeError(f"the worker ended with {process.returncode}")
                time.sleep(0.1)
            rate = count / (time.monotonic() - start)
            samples.append((first + count, rss_mib(process.pid), rate))
            print(f"  {first + count:>6} plans  RSS {samples[-1][1]:7.1f} MiB  {rate:6.1f} plans/s", flush=True)
            if snapshots is not None and len(samples) in (1, -(-plans // BATCH)):
                process.send_signal(signal.SIGUSR1)
                time.sleep(2.0)  # the handler runs on the worker's main thread at its next wake-up
    return samples


def growth(snapshots: Path, top: int = 15) -> None:
    import tracemalloc

    first, last = (tracemalloc.Snapshot.load(str(snapshots / f"{n}.snap")) for n in (0, 1))
    print(f"allocations that grew most between the first {BATCH} plans and the end:")
    for stat in last.compare_to(first, "traceback")[:top]:
        where = stat.traceback.format()[-1].strip()
        print(f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks  {where}")
        for frame in list(stat.traceback)[-8:]:  # the newest frames (oldest first): who asked for it
            print(f"        {frame.filename}:{frame.lineno}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--plans", type=int, default=10_000)
    parser.add_argument("--db", default="sqlite", help="sqlite (default), postgresql (a throwaway cluster) or a URL")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--tracemalloc", action="store_true", help="snapshots in the worker; print what grew")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="plangate-soak-"))
    snapshots = folder if args.tracemalloc else None
    print(f"soak: {args.plans} plans of 3 steps through one worker at concurrency {args.concurrency} ({args.db})")
    with database(args.db, folder) as db:
        start = time.monotonic()
        samples = soak(db, args.plans, args.concurrency, snapshots)
        elapsed = time.monotonic() - start
        with closing(open_store(db)) as store:
            statuses = dict(store.query("SELECT status, count(*) FROM plans GROUP BY status"))
    base, end = samples[0][1], samples[-1][1]
    rates = sorted(rate for _, _, rate in samples)
    print(f"RSS after the first {BATCH}: {base:.1f} MiB; at the end: {end:.1f} MiB ({end - base:+.1f} MiB)")
    print(f"plans/s: median {rates[len(rates) // 2]:.1f} (first {samples[0][2]:.1f}, last {samples[-1][2]:.1f});")
    print(f"  {elapsed:.0f} s in all, submitting included; last/first thousand {samples[-1][2] / samples[0][2]:.2f}x")
    if snapshots is not None:
        growth(snapshots)
    print(f"plans by status: {statuses}")
    ok = end - base <= LIMIT_MIB and statuses == {"succeeded": args.plans}
    print(f"{'PASS' if ok else 'FAIL'}: every plan succeeded; the end within {LIMIT_MIB:.0f} MiB of the first {BATCH}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
