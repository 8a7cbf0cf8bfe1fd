"""Benchmark: what metrics cost the engine per step, off (nobody exposes them) and on.

Runs bench/engine.py's sequential chain of no-op steps on SQLite (synchronous=normal),
alternating off and on, and reports the median per step of each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from engine import plangate_chain
from plangate import metrics


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="steps in the chain")
    parser.add_argument("--repeat", type=int, default=7, help="runs of the chain per round (the median is kept)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each off then on")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="plangate-bench-metrics-"))
    off: list[float] = []
    on: list[float] = []
    for _ in range(args.rounds):
        metrics.stop()
        off.append(plangate_chain(folder, args.steps, args.repeat, "normal")[0])
        metrics.start()
        on.append(plangate_chain(folder, args.steps, args.repeat, "normal")[0])
    metrics.stop()
    slow, fast = statistics.median(on), statistics.median(off)
    print(f"{args.steps}-step chain, median of {args.rounds} rounds of {args.repeat} runs")
    print(f"  metrics off  {fast:.4f} ms/step")
    print(f"  metrics on   {slow:.4f} ms/step  ({(slow - fast) * 1000:+.1f} us/step, {slow / fast - 1:+.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
