"""A short crash torture: the worker SIGKILLed at random moments, many times; nothing lost or repeated."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


def load_bench() -> object:
    spec = importlib.util.spec_from_file_location("torture_bench", ROOT / "bench" / "torture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["torture_bench"] = module
    spec.loader.exec_module(module)
    return module


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
