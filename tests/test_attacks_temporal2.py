"""The Temporal backend: a step activity that Temporal runs again, and the workflows of a plan's later runs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue
from plangate import temporal as temporal_module
from plangate.errors import PlangateError
from plangate.runtime import Runtime
from plangate.testing import temporal_server
from tests.helpers import plan
from tests.test_temporal_attacks import RUN, _direct, activities, late_attempt

TOOLS = """
import time
from pathlib import Path

from plangate import tool

DIR = Path({dir!r})


def _called(name: str) -> int:
    with (DIR / "calls.txt").open("a") as calls:
        calls.write(name + "\\n")
    return (DIR / "calls.txt").read_text().split().count(name)


@tool(effect="write", timeout=30)
def send(to: str) -> str:
    _called("send")
    raise RuntimeError("the mail server said no")


@tool(effect="write", idempotent=True, retries=1, timeout=30)
def charge(to: str) -> str:
    if _called("charge") == 1:
        raise RuntimeError("the bank hung up")
    return "charged"


@tool(effect="write", timeout=0.3)
def slow(to: str) -> str:
    _called("slow")
    time.sleep(1)
    return to


@tool(effect="write", timeout=30)
def mail(to: str) -> str:
    _called("mail")
    return to


@tool(effect="read", timeout=30)
def peek(to: str) -> str:
    _called("peek")
    return to


@tool(effect="read", timeout=30)
def look(to: str) -> str:
    _called("look")
    return to
"""


@pytest.fixture(scope="module")
def temporal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with temporal_server(tmp_path_factory.mktemp("temporal") / "server.log") as address:
        yield address


def _setup(tmp_path: Path, *steps: dict[str, Any], db: str | None = None) -> tuple[str, str, Runtime, str]:
    tools = tmp_path / "tools2.py"
    tools.write_text(TOOLS.format(dir=str(tmp_path)))
    db = db or f"sqlite:///{tmp_path}/t.db"
    rt = Runtime(Catalogue.from_module(tools), db=db)
    record = rt.submit(plan(*steps), "ann")
    rt.approve(record.id, "ben", record.hash)
    return str(tools), db, rt, record.id


def _calls(tmp_path: Path) -> list[str]:
    found = tmp_path / "calls.txt"
    return found.read_text().split() if found.exists() else []


def test_a_step_activity_run_again_after_its_step_failed_never_calls_the_tool_again(tmp_path: Path) -> None:
    """The first attempt of a step's activity called a tool that is not idempotent, which raised, and
    recorded the step failed; its completion never reached Temporal (the worker was lost on the way
    back), so Temporal ran the activity again. The retry took the failed step for one never run and
    called the tool a second time, with no person asking for it."""
    tools, db, rt, plan_id = _setup(tmp_path, {"id": 1, "tool": "send", "params": {"to": "ann"}})
    args = {**_direct(db, tools, "t-failed"), "step_id": 1}
    step, finish = activities(db, tools)
    assert step(args) == "failed"
    assert step(args) == "failed", "Temporal's retry: the same answer again"
    assert _calls(tmp_path) == ["send"], "not idempotent: never called twice"
    assert finish(args) == "halted"
    assert rt.store.steps(plan_id)[1].attempt == 1
    # A person's resume (a new claim) runs the failed step again, one step at a time as on any engine.
    from plangate.engine import Engine

    claim = rt.start(plan_id, actor="temporal")
    engine = Engine(store=rt.store, catalogue=rt.catalogue, clock=rt.clock, owner=claim.owner)  # type: ignore[arg-type]
    assert engine.stepper(plan_id, 1, claim.body).one(1) == "failed"
    assert _calls(tmp_path) == ["send", "send"] and rt.store.steps(plan_id)[1].attempt == 2
    assert rt.store.verify_audit().ok


def test_a_late_attempt_never_takes_back_a_step_another_attempt_completed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idempotent step's first attempt failed its call and waited out its backoff, its heartbeats lost
    meanwhile: Temporal ran the activity again, which completed the step, and the next step ran on its
    output. The first attempt then woke and made its retry: its ``started`` record, made from what it had
    read before, overwrote the completed step's, and its call ran the step again."""
    from plangate import engine as engine_module

    tools, db, rt, plan_id = _setup(
        tmp_path,
        {"id": 1, "tool": "charge", "params": {"to": "ann"}},
        {"id": 2, "tool": "look", "params": {"to": "${1}"}},
    )
    args = _direct(db, tools, "t-retry")
    step, finish = activities(db, tools)
    real = engine_module.time.sleep
    paused, wake = threading.Event(), threading.Event()

    def backoff(seconds: float) -> None:
        if threading.current_thread().name != "late":
            real(seconds)
            return
        paused.set()  # the late attempt, its call failed, waits out its backoff (and loses its heartbeats)
        wake.wait(30)

    monkeypatch.setattr(engine_module.time, "sleep", backoff)
    answers: list[object] = []

    def late() -> None:
        try:
            answers.append(step({**args, "step_id": 1}))
        except BaseException as exc:  # what the late attempt ends with
            answers.append(exc)

    attempt = threading.Thread(target=late, name="late", daemon=True)
    attempt.start()
    try:
        assert paused.wait(10)
        assert step({**args, "step_id": 1}) == "succeeded"  # Temporal's retry
        assert step({**args, "step_id": 2}) == "succeeded"
        completed = rt.store.steps(plan_id)[1]
        events = len(rt.trace(plan_id))
    finally:
        wake.set()
        attempt.join(timeout=30)
    assert not attempt.is_alive()
    assert len(answers) == 1 and isinstance(answers[0], PlangateError), answers
    assert _calls(tmp_path) == ["charge", "charge", "look"], "a completed step is never run again"
    assert rt.store.steps(plan_id)[1] == completed and completed.status == "succeeded"
    assert len(rt.trace(plan_id)) == events, "the late attempt wrote nothing"
    assert finish(args) == "succeeded"
    assert rt.store.verify_audit().ok


def test_a_plan_corrected_after_a_halt_on_temporal_runs_again_there(temporal: str, tmp_path: Path) -> None:
    """A plan halted on Temporal, corrected by a person (a new version) and approved again, was claimed by
    the next Temporal worker, whose workflow (id = plan id, never reused) Temporal refused: the plan was left
    running under the worker's hour-long lease with nothing said, and every Temporal worker after it did the
    same, so it never ran. A workflow id is now taken again once the plan's earlier workflow has ended."""
    import asyncio

    tools, db, rt, plan_id = _setup(tmp_path, {"id": 1, "tool": "send", "params": {"to": "ann"}})
    settings = temporal_module.Settings(heartbeat_seconds=5, max_activities=2)
    serve = temporal_module.serve
    assert asyncio.run(serve(temporal, db, tools, drain=True, poll=0.05, name="t-first", settings=settings)) == 1
    assert rt.get(plan_id).status == "halted" and _calls(tmp_path) == ["send"]
    corrected = rt.edit(plan_id, plan({"id": 1, "tool": "look", "params": {"to": "bob"}}), "ann")
    rt.approve(plan_id, "ben", corrected.hash)
    assert asyncio.run(serve(temporal, db, tools, drain=True, poll=0.05, name="t-second", settings=settings)) == 1
    assert rt.get(plan_id).status == "succeeded" and rt.get(plan_id).version == 2
    assert _calls(tmp_path) == ["send", "look"]
    assert rt.store.steps(plan_id)[1].status == "succeeded"
    assert rt.store.verify_audit().ok


@pytest.mark.parametrize("field", ["heartbeat_seconds", "margin_seconds"])
@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), 1e15])
def test_temporal_settings_refuse_timeouts_no_workflow_can_carry(field: str, seconds: float) -> None:
    """A timeout that is not a number, or infinite, or beyond what a duration holds, passed the check (and
    ``--heartbeat-timeout nan``/``inf``): the workflow then failed each of its tasks making the activity's
    timeout, for ever, its plan held running and the worker waiting on it, no other plan run."""
    with pytest.raises(ValueError, match="seconds"):
        temporal_module.Settings(**{field: seconds}).check()  # type: ignore[arg-type]


def test_an_attempt_left_over_from_an_earlier_claim_changes_nothing_once_the_same_worker_claims_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step's first attempt lost its heartbeats while its call (not idempotent) overran; Temporal's retry
    found it started and halted the plan, a person settled the step as not done and corrected the plan,
    which was approved and claimed again by the same Temporal worker. Its lease named the worker, not the
    claim, so the first attempt, waking, passed the new run's fence: it recorded its outcome unknown over
    the person's settlement, and the corrected plan halted on it."""
    tools, db, rt, plan_id = _setup(tmp_path, {"id": 1, "tool": "slow", "params": {"to": "ann"}})
    catalogue = Catalogue.from_spec(tools)
    first = temporal_module._claim(db, catalogue, "t-same", [])
    assert first is not None
    temporal_module._hand_over(db, first, RUN)
    args = {**temporal_module.workflow_args(first, catalogue), "heartbeat_seconds": None, "step_id": 1}
    step, finish = activities(db, tools)
    with late_attempt(monkeypatch, step, args) as raised:
        assert step(args) == "outcome_unknown", "Temporal's retry: never called twice"
        assert finish(args) == "halted"
        rt.settle(plan_id, 1, done=False, actor="ben", note="it never went out")
        corrected = rt.edit(plan_id, plan({"id": 1, "tool": "slow", "params": {"to": "bob"}}), "ann")
        rt.approve(plan_id, "cat", corrected.hash)
        again = temporal_module._claim(db, catalogue, "t-same", [])  # the same worker, its next claim
        assert again is not None and again.plan.version == 2
        settled = rt.store.steps(plan_id)[1]
        events = len(rt.trace(plan_id))
    assert raised and isinstance(raised[0], PlangateError), raised
    assert rt.store.steps(plan_id)[1] == settled and settled.status == "failed"
    assert len(rt.trace(plan_id)) == events, "the attempt of the earlier claim wrote nothing"
    assert rt.store.verify_audit().ok


def test_the_workflow_orders_steps_by_the_effects_the_policy_gives_their_tools(temporal: str, tmp_path: Path) -> None:
    """The policy says a tool that calls itself a read writes (what an MCP server says of its tools is a
    hint): the engine then holds the next step until it ends, but the workflow's order took the tool's own
    word and started both at once. The next step's activity found its step blocked, and the workflow
    halted a plan that runs to its end on the embedded engine."""
    import asyncio

    from plangate import Policy

    policy = Policy.from_data(
        {"version": 1, "name": "governed", "approval": {"human": ["ops"]}, "tools": {"look": {"effect": "write"}}}
    )
    tools = tmp_path / "tools2.py"
    tools.write_text(TOOLS.format(dir=str(tmp_path)))
    db = f"sqlite:///{tmp_path}/t.db"
    rt = Runtime(Catalogue.from_module(tools), policy, db=db)
    record = rt.submit(
        plan({"id": 1, "tool": "look", "params": {"to": "ann"}}, {"id": 2, "tool": "peek", "params": {"to": "bob"}}),
        "ann",
    )
    rt.approve(record.id, "ben", record.hash)
    settings = temporal_module.Settings(heartbeat_seconds=5, max_activities=2)
    ran = asyncio.run(
        temporal_module.serve(temporal, db, str(tools), drain=True, poll=0.05, name="t-governed", settings=settings)
    )
    assert ran == 1
    assert rt.get(record.id).status == "succeeded", rt.store.steps(record.id)
    assert _calls(tmp_path) == ["look", "peek"]
    assert rt.store.verify_audit().ok


def test_two_attempts_of_a_step_starting_at_once_on_postgresql_call_its_tool_once(
    pg_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two attempts of one step (the first stalled past its heartbeat timeout as it began, so Temporal ran
    the activity again) under the same claim, on PostgreSQL, where a transaction reads what was committed
    when each statement began: both read the step as never started, both recorded it started (the fence
    holds for both: one claim), and both called a tool that is not idempotent."""
    from plangate import engine as engine_module

    tools, db, rt, plan_id = _setup(tmp_path, {"id": 1, "tool": "mail", "params": {"to": "ann"}}, db=pg_db)
    args = {**_direct(db, tools, "t-pg"), "step_id": 1}
    step, _ = activities(db, tools)
    real = engine_module._Run._reload
    read, wake = threading.Event(), threading.Event()

    def stalled(self: Any) -> None:
        real(self)
        if threading.current_thread().name == "late" and not read.is_set():
            read.set()  # the first attempt read the step's record, and stalls before it records the start
            wake.wait(30)

    monkeypatch.setattr(engine_module._Run, "_reload", stalled)
    answers: dict[str, object] = {}

    def attempt(name: str) -> None:
        try:
            answers[name] = step(args)
        except BaseException as exc:  # what an attempt ends with
            answers[name] = exc

    late = threading.Thread(target=attempt, args=("late",), name="late", daemon=True)
    late.start()
    retry = threading.Thread(target=attempt, args=("retry",), name="retry", daemon=True)
    try:
        assert read.wait(10)
        retry.start()  # Temporal's retry
        retry.join(timeout=5)
    finally:
        wake.set()
        late.join(timeout=30)
        retry.join(timeout=30)
    assert not late.is_alive() and not retry.is_alive()
    try:
        assert _calls(tmp_path) == ["mail"], ("not idempotent: never called twice", answers)
        row = rt.store.steps(plan_id)[1]  # the retry met the first attempt's start: a person says, or it ended
        assert row.status in ("succeeded", "outcome_unknown") and row.attempt == 1, row
        assert [e.kind for e in rt.trace(plan_id)].count("step.started") == 1
        assert rt.store.verify_audit().ok
    finally:
        rt.close()
