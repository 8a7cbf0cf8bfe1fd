"""Crash torture: run many plans while killing the worker with SIGKILL at random moments.

Plans mix idempotent, non-idempotent, failing and slow tools. A worker process resumes
every unfinished plan; it is killed (SIGKILL) after a random delay, again and again,
until every plan has ended (succeeded, or halted on a failure or on an outcome only a
person can settle). Then the tools' own ledger is checked against the store:

- duplicated effects: an idempotent tool's effect applied twice for one step (must be 0);
- silent re-runs: a non-idempotent tool called twice for one step (must be 0: the engine
  halts with outcome unknown instead);
- lost steps: a step the store says succeeded whose effect is missing, or a step whose
  effect exists but the store never recorded (a non-idempotent send must be recorded or
  be waiting for a person);
- plans that did not end.

Run: ``python bench/torture.py [--plans N] [--kills N] [--seed S]``.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
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


def setup(folder: Path, plans: int, seed: int) -> str:
    from plangate import Catalogue
    from plangate.runtime import Runtime

    db = f"sqlite:///{folder}/plangate.db"
    rt = Runtime(Catalogue.from_module(TOOLS), db=db)
    rng = random.Random(seed)
    for number in range(plans):
        record = rt.submit(make_plan(rng, number), "torture")
        rt.approve(record.id, "reviewer", record.hash)
    rt.close()
    return db


def unfinished(db: str) -> int:
    from plangate.store import open_store

    store = open_store(db)
    count = sum(1 for row in store.list_plans(limit=10**6) if row.status in ("approved", "running"))
    store.close()
    return count


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
                done += 1
            worker.wait()
    subprocess.run([sys.executable, "-c", WORKER, str(TOOLS), db], env=env, check=True, stdout=subprocess.DEVNULL)
    return done


def check(db: str, folder: Path) -> dict[str, int]:
    import sqlite3

    from plangate.store import open_store

    store = open_store(db)
    ledger = sqlite3.connect(folder / "ledger.db")
    effects = Counter((p, s) for p, s in ledger.execute("SELECT plan, step FROM effects"))
    sends = Counter((p, s) for p, s in ledger.execute("SELECT plan, step FROM sends"))
    calls = Counter((p, s) for p, s, _ in ledger.execute("SELECT plan, step, tool FROM calls"))
    counts = Counter[str]()
    for row in store.list_plans(limit=10**6):
        counts["plans"] += 1
        counts[f"plans {row.status}"] += 1
        steps = store.steps(row.id)
        for step_id, step in steps.items():
            key = (row.id, step_id)
            counts["steps recorded"] += 1
            if step.status == "succeeded":
                counts["steps succeeded"] += 1
                tool = store.get_version(row.id, row.version)
                name = _tool_of(tool.body if tool else "{}", step_id)
                if (name == "idem" and effects[key] != 1) or (name == "once" and sends[key] != 1):
                    counts["lost or duplicated completed steps"] += 1
            if step.status == "outcome_unknown":
                counts["steps waiting for a person (outcome unknown)"] += 1
        for key in sends:
            if key[0] == row.id and (
                key[1] not in steps or steps[key[1]].status not in ("succeeded", "outcome_unknown")
            ):
                counts["sends the store does not know about"] += 1
        if row.status in ("approved", "running"):
            counts["plans that did not end"] += 1
    counts["duplicated effects of idempotent tools"] = sum(1 for n in effects.values() if n > 1)
    counts["silent re-runs of non-idempotent tools"] = sum(1 for n in sends.values() if n > 1)
    counts["idempotent re-runs with the same key (allowed)"] = sum(
        n - 1 for key, n in calls.items() if n > 1 and key not in sends
    )
    counts["audit log intact"] = int(store.verify_audit().ok)
    store.close()
    return dict(counts)


def _tool_of(body: str, step_id: int) -> str:
    import json

    return next((s["tool"] for s in json.loads(body).get("steps", []) if s["id"] == step_id), "")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--plans", type=int, default=600)
    parser.add_argument("--kills", type=int, default=500)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-delay", type=float, default=0.3, help="longest a worker works before the kill (s)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="plangate-torture-"))
    os.environ["TORTURE_LEDGER"] = str(folder / "ledger.db")
    db = setup(folder, args.plans, args.seed)
    start = time.monotonic()
    kills = torture(db, folder, kills=args.kills, seed=args.seed, max_delay=args.max_delay)
    counts = check(db, folder)
    print(f"{args.plans} plans, {kills} SIGKILLs at random moments, {time.monotonic() - start:.0f} s")
    for name, value in sorted(counts.items()):
        print(f"  {name:<52} {value}")
    bad = (
        "duplicated effects of idempotent tools",
        "silent re-runs of non-idempotent tools",
        "lost or duplicated completed steps",
        "sends the store does not know about",
        "plans that did not end",
    )
    return 1 if any(counts.get(name, 0) for name in bad) or not counts.get("audit log intact") else 0


if __name__ == "__main__":
    sys.exit(main())
