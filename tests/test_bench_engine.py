"""bench/engine.py --previous: two trees on the same chain in alternating processes, both measured, both printed."""

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
