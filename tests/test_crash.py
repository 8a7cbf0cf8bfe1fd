"""Kill the engine's process with SIGKILL in the middle of a step, then resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue
from plangate.runtime import Runtime
from tests import crashtools
from tests.helpers import plan

TOOLS = Path(__file__).with_name("crashtools.py")
STEPS = plan(
    {"id": 1, "tool": "apply_once", "params": {"n": 1}},
    {"id": 2, "tool": "apply_once", "params": {"n": 2}, "condition": "${1} == 1"},
    {"id": 3, "tool": "apply_once", "params": {"n": 3}, "condition": "${2} == 2"},
    {"id": 4, "tool": "send", "params": {"n": 4}, "condition": "${3} == 3"},
    {"id": 5, "tool": "apply_once", "params": {"n": 5}, "condition": "${4} == 4"},
)


@pytest.fixture
def crash_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CRASH_DIR", str(tmp_path))
    monkeypatch.setenv("CRASH_LEDGER", str(tmp_path / "ledger.db"))
    return tmp_path


def approved_plan(folder: Path) -> tuple[Runtime, str]:
    rt = Runtime(Catalogue.from_module(TOOLS), db=f"sqlite:///{folder}/plangate.db", tools=str(TOOLS))
    record = rt.submit(STEPS, "ann")
    rt.approve(record.id, "ben", record.hash)
    return rt, record.id


def kill_during_step(folder: Path, plan_id: str, step: int) -> None:
    """Run `plangate execute` in a child process and SIGKILL it while step `step` is inside its call."""
    (folder / f"block-{step}").touch()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    log = folder / "child.log"
    with (
        log.open("wb") as out,
        subprocess.Popen(
            ["plangate", "execute", plan_id, "--db", f"sqlite:///{folder}/plangate.db"], env=env, stdout=out, stderr=out
        ) as child,
    ):
        deadline = time.monotonic() + 60
        while not (folder / f"reached-{step}").exists():
            assert child.poll() is None, f"the run ended before step {step}: {log.read_text()}"
            assert time.monotonic() < deadline, f"step {step} was never reached"
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    assert child.returncode == -signal.SIGKILL
    (folder / f"block-{step}").unlink()


def ledger() -> tuple[Counter[int], Counter[int], Counter[int]]:
    conn = crashtools.ledger()
    calls = Counter(step for (step,) in conn.execute("SELECT step FROM calls"))
    effects = Counter(step for (step,) in conn.execute("SELECT step FROM effects"))
    sends = Counter(step for (step,) in conn.execute("SELECT step FROM sends"))
    conn.close()
    return calls, effects, sends


def test_killed_in_an_idempotent_step_resumes_with_the_same_key(crash_env: Path) -> None:
    rt, plan_id = approved_plan(crash_env)
    kill_during_step(crash_env, plan_id, 3)
    assert rt.get(plan_id).status == "running", "the killed run left the plan running"
    assert rt.store.steps(plan_id)[3].status == "started", "`started` was durable before the call"

    result = rt.resume(plan_id)
    assert result.ok and result.ran == (3, 4, 5)
    calls, effects, sends = ledger()
    assert calls == {1: 1, 2: 1, 3: 2, 4: 1, 5: 1}, "completed steps never re-run; step 3 re-ran once"
    assert effects == {1: 1, 2: 1, 3: 1, 5: 1}, "the idempotent effect of step 3 was applied once"
    assert sends == {4: 1}
    keys = {r.step_id: r.idempotency_key for r in rt.store.steps(plan_id).values()}
    assert keys[3] == f"{plan_id}:3" and rt.store.steps(plan_id)[3].attempt == 2
    assert [e.kind for e in rt.trace(plan_id)].count("step.retrying") == 1
    assert rt.store.verify_audit().ok


def test_killed_in_a_non_idempotent_step_halts_for_a_person(crash_env: Path) -> None:
    rt, plan_id = approved_plan(crash_env)
    kill_during_step(crash_env, plan_id, 4)

    result = rt.resume(plan_id)
    assert result.status == "halted" and result.failed_step == 4
    assert "outcome unknown" in (result.error or "") and "not idempotent" in (result.error or "")
    assert "a person must settle it" in (result.next_step or "")
    again = rt.resume(plan_id)
    assert again.status == "halted" and again.failed_step == 4, "resuming again does not run it either"
    calls, _, sends = ledger()
    assert calls == {1: 1, 2: 1, 3: 1, 4: 1}, "no silent re-run of the send, and step 5 never started"
    assert sends == {4: 1}
    assert rt.get(plan_id).status == "halted"
    assert rt.store.verify_audit().ok


# -- a run that died between a step's failure and its halt ------------------------------------------
def _failed_then_died(store: Any, plan_id: str) -> None:
    """What a run leaves that recorded step 1's failure while step 2's call was still out, and died
    before it recorded its halt: the plan running under a lease that has run out."""
    from tests.helpers import died_during

    died_during(store, plan_id, 1, 2)
    at, error = "2026-01-01T00:00:00.000000Z", "RuntimeError: the card was declined"
    with store.transaction():
        store.finish_step(plan_id, 1, attempt=1, status="failed", output=None, error=error, at=at, lost="lost")
        store.append_event(
            plan_id=plan_id,
            version=1,
            step_id=1,
            kind="step.failed",
            actor="engine",
            at=at,
            data={"error": error, "ms": 1.0},
        )


def test_a_run_taken_over_halts_on_the_failure_its_predecessor_recorded_and_never_calls_the_step_again(
    tmp_path: Path,
) -> None:
    """The run that died had recorded step 1's failure, and would have halted once step 2's call came
    back. The run that takes it over called step 1 again, on its own, as if a person had resumed it
    (a charge that failed, tried again unasked). It now halts on that failure, as the first would
    have; a person's resume still runs the step again."""
    from plangate import tool
    from plangate.replay import replay

    calls: list[str] = []

    @tool(effect="write")
    def charge(amount: int) -> str:
        calls.append("charge")
        return "charged"

    @tool
    def look(n: int) -> int:
        calls.append("look")
        return n

    catalogue = Catalogue([charge, look])
    rt = Runtime(catalogue, db=f"sqlite:///{tmp_path}/t.db")
    try:
        steps = ({"id": 1, "tool": "charge", "params": {"amount": 5}}, {"id": 2, "tool": "look", "params": {"n": 1}})
        record = rt.submit(plan(*steps, category="ops") | {"order": "dataflow"}, "alice")
        rt.approve(record.id, "reviewer", record.hash)
        _failed_then_died(rt.store, record.id)
        result = rt.execute(record.id)
        assert result.status == "halted" and result.failed_step == 1
        assert result.error == "RuntimeError: the card was declined"
        assert calls == [], "nothing called again: step 1 failed, and step 2 waits behind the halt"
        assert rt.store.verify_audit().ok
        assert replay(rt.store, record.id, catalogue).ok
        resumed = rt.resume(record.id)  # a person's decision: the failed step runs again
        assert resumed.ok and sorted(calls) == ["charge", "look"]
        assert replay(rt.store, record.id, catalogue).ok
    finally:
        rt.close()
