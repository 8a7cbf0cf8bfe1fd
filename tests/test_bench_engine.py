"""bench/engine.py and bench/check.py --previous: two trees in alternating processes, both measured, both printed."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_bench() -> Any:
    spec = importlib.util.spec_from_file_location("engine_bench", ROOT / "bench" / "engine.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules["engine_bench"] = bench
    spec.loader.exec_module(bench)
    return bench


def test_the_comparison_with_a_previous_tree_prints_wall_and_cpu_time_for_both(
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench = load_bench()
    bench.against_previous(str(ROOT / "src"), rounds=2, repeat=1, n=3)
    out = capsys.readouterr().out
    assert "3-step chain, synchronous=normal, 2 alternating rounds of 1 runs" in out
    for clock in ("wall time", "CPU time"):
        assert re.search(rf"{clock} +previous tree median +\d+\.\d+ best", out)
        assert re.search(rf"{clock} +this tree +median +\d+\.\d+ best", out)
        assert f"the previous one's {clock} per step" in out
    # Where each tree's step time goes: the commit with its WAL pages, the other statements, the rest.
    assert "where a step's wall time goes" in out
    for label in ("previous tree", "this tree"):
        assert re.search(rf"{label} +\d+\.\d+ +\( *\d+\.\d\) +\d+\.\d+ +-?\d+\.\d+ +\d+\.\d+", out)
    # And the floor the statements alone set, next to the previous tree's whole step.
    assert re.search(r"statements alone, with no Python at all, take \d+\.\d\dx the previous tree's whole step", out)


def test_the_split_of_a_step_s_time_adds_up_and_counts_the_wal_pages_a_commit_writes(tmp_path: Path) -> None:
    bench = load_bench()
    commit, other, rest, pages = bench.split_chain(tmp_path, 20, 2)
    assert commit > 0 and other > 0
    assert pages >= 3  # a step's commit writes its step row, its events and the plan's seal: pages of each
    assert rest > 0  # the engine's own Python is never free


def test_the_checker_s_comparison_with_a_previous_tree_prints_both_and_their_ratio(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """bench/check.py --previous: a fresh plan's check + policy by each tree, in alternating processes."""
    spec = importlib.util.spec_from_file_location("check_bench", ROOT / "bench" / "check.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    old, new = bench.against_previous(str(ROOT / "src"), alternate=1, rounds=2, batch=5)
    out = capsys.readouterr().out
    assert old > 0 and new > 0
    assert "1 alternating processes of each tree" in out
    assert re.search(r"previous tree \(.*\) +\d+\.\d\d us", out) and re.search(r"this tree +\d+\.\d\d us", out)
    assert re.search(r"-> this tree takes \d+\.\d\dx the previous one's time", out)
