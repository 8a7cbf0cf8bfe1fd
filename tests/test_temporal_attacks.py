"""Attacks on the Temporal backend: leases that outlive or undercut a workflow, and late attempts of a step."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue
from plangate import temporal as temporal_module
from plangate.errors import PlangateError, StateError
from plangate.runtime import Runtime
from plangate.testing import temporal_server
from tests.helpers import plan

# A step's tool that writes each call down and waits for the test's go (a file, so any process sees it).
TOOLS = """
import time
from pathlib import Path

from plangate import tool

DIR = Path({dir!r})


def _wait(name: str) -> str:
    with (DIR / "calls.txt").open("a") as calls:
        calls.write(name + "\\n")
    while not (DIR / "go").exists():
        time.sleep(0.02)
    return name


@tool(effect="write", idempotent=True, timeout=60)
def charge(to: str) -> str:
    return _wait("charge")


@tool(effect="write", timeout=0.3)
def send(to: str) -> str:
    return _wait("send")
"""


@pytest.fixture(scope="module")
def temporal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with temporal_server(tmp_path_factory.mktemp("temporal") / "server.log") as address:
        yield address


def _setup(tmp_path: Path, tool: str) -> tuple[str, str, Runtime, str]:
    """A tools file, a store, and an approved one-step plan calling ``tool``."""
    tools = tmp_path / "waiting.py"
    tools.write_text(TOOLS.format(dir=str(tmp_path)))
    db = f"sqlite:///{tmp_path}/t.db"
    rt = Runtime(Catalogue.from_module(tools), db=db)
    record = rt.submit(plan({"id": 1, "tool": tool, "params": {"to": "ann"}}), "ann")
    rt.approve(record.id, "ben", record.hash)
    return str(tools), db, rt, record.id


def _calls(tmp_path: Path) -> list[str]:
    found = tmp_path / "calls.txt"
    return found.read_text().split() if found.exists() else []


def _until(what: Callable[[], bool], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.05)


def _started(rt: Runtime, plan_id: str) -> bool:
    row = rt.store.steps(plan_id).get(1)
    return row is not None and row.status == "started"


def _serve(address: str, db: str, tools: str, **options: Any) -> threading.Thread:
    """An in-process Temporal worker that drains, on a thread of its own."""
    settings = temporal_module.Settings(heartbeat_seconds=2, max_activities=2)
    thread = threading.Thread(
        target=lambda: asyncio.run(
            temporal_module.serve(address, db, tools, drain=True, poll=0.05, settings=settings, **options)
        ),
        daemon=True,
    )
    thread.start()
    return thread


async def _terminate(address: str, plan_id: str) -> None:
    """Nothing of a failed test keeps running in Temporal."""
    from temporalio.client import Client
    from temporalio.service import RPCError

    with contextlib.suppress(RPCError):
        await (await Client.connect(address)).get_workflow_handle(plan_id).terminate()


def test_a_workflow_running_past_its_lease_is_not_taken_over_while_its_step_runs(
    temporal: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workflow's lease (an hour) was never renewed: a run longer than that was taken over by the next
    ``plangate resume`` or plain worker while Temporal still ran its step. Now its activities renew it."""
    monkeypatch.setattr(temporal_module, "_LEASE_SECONDS", 3.0)  # an hour, in seconds
    tools, db, rt, plan_id = _setup(tmp_path, "charge")
    serving = _serve(temporal, db, tools, name="t-long")
    try:
        _until(lambda: _started(rt, plan_id))
        time.sleep(4.5)  # longer than the lease
        from plangate.temporal import _now

        assert rt.store.claim("plain-worker", _now(), _now(minutes=1)) is None, "a plain worker's claim"
        with pytest.raises(StateError, match="already running under t-long"):
            rt.start(plan_id, actor="engine")  # what `plangate resume` does first
    finally:
        (tmp_path / "go").touch()
        serving.join(timeout=60)
        asyncio.run(_terminate(temporal, plan_id))
    assert not serving.is_alive()
    assert rt.get(plan_id).status == "succeeded" and _calls(tmp_path) == ["charge"]
    assert rt.store.verify_audit().ok


def test_a_workflow_whose_starting_worker_died_is_not_taken_over_while_temporal_runs_it(
    temporal: str, tmp_path: Path
) -> None:
    """The lease named the process of the worker that started the workflow, so once it died (its steps
    going on in another worker) `plangate resume` on the same machine took the plan over at once."""
    tools, db, rt, plan_id = _setup(tmp_path, "charge")
    command = ["worker", "--tools", tools, "--temporal", temporal, "--drain", "--heartbeat-timeout", "2"]
    with (tmp_path / "w.log").open("w") as log:
        first = subprocess.Popen(
            [sys.executable, "-m", "plangate", *command],
            env={**os.environ, "PLANGATE_DB": db},
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    serving = None
    try:
        _until(lambda: _started(rt, plan_id) and _calls(tmp_path) == ["charge"])
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        with pytest.raises(StateError, match="already running under temporal-worker#"):
            rt.start(plan_id, actor="engine")
        (tmp_path / "go").touch()
        serving = _serve(temporal, db, tools)  # Temporal runs the step again here
        serving.join(timeout=60)
        assert not serving.is_alive()
    finally:
        first.kill()
        (tmp_path / "go").touch()
        asyncio.run(_terminate(temporal, plan_id))
    assert rt.get(plan_id).status == "succeeded"
    assert _calls(tmp_path) == ["charge", "charge"], "idempotent: run again under the same key by the next worker"
    assert rt.store.steps(plan_id)[1].attempt == 2
    assert rt.store.verify_audit().ok


RUN = "run-1"  # the workflow run a claim made here is handed to, as a worker hands it to the run it started
Activity = Callable[[dict[str, Any]], str]


def _direct(db: str, tools: str, name: str) -> dict[str, Any]:
    """A claim as the Temporal worker makes it, handed to workflow run ``RUN``, and its workflow's input, for
    activities called directly."""
    catalogue = Catalogue.from_spec(tools)
    claim = temporal_module._claim(db, catalogue, name, [])
    assert claim is not None
    temporal_module._hand_over(db, claim, RUN)
    return {**temporal_module.workflow_args(claim, catalogue), "heartbeat_seconds": None}


def activities(db: str, tools: str) -> tuple[Activity, Activity]:
    """The host's step and finish activities, each called as Temporal calls it in workflow run ``RUN`` of its plan."""
    from temporalio.testing import ActivityEnvironment

    def in_run(one: Activity) -> Activity:
        def call(args: dict[str, Any]) -> str:
            env = ActivityEnvironment()
            env.info = dataclasses.replace(env.info, workflow_id=args["plan_id"], workflow_run_id=RUN)
            return env.run(one, args)

        return call

    step, finish = temporal_module.hosted(db, tools)
    return in_run(step), in_run(finish)


@contextlib.contextmanager
def late_attempt(
    monkeypatch: pytest.MonkeyPatch, step: Activity, args: dict[str, Any]
) -> Iterator[list[BaseException]]:
    """An attempt of the step ``args`` names, on a thread of its own, paused once its call has come back (as
    one whose heartbeats stopped) until the block ends; the block runs once it is paused. Yields what the
    attempt raised as it ended (after the block)."""
    from plangate import engine as engine_module

    real = engine_module._Run._one_call
    called, wake = threading.Event(), threading.Event()

    def paused(self: Any, step_id: int, *known: Any) -> Any:
        outcome = real(self, step_id, *known)
        if threading.current_thread().name == "late":
            called.set()
            wake.wait(30)
        return outcome

    monkeypatch.setattr(engine_module._Run, "_one_call", paused)
    raised: list[BaseException] = []

    def late() -> None:
        try:
            step(args)
        except BaseException as exc:  # what the late attempt ends with
            raised.append(exc)

    attempt = threading.Thread(target=late, name="late", daemon=True)
    attempt.start()
    try:
        assert called.wait(10)
        yield raised
    finally:
        wake.set()
        attempt.join(timeout=10)


def test_a_late_attempt_of_a_step_never_overwrites_what_a_person_settled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An attempt of a step that is not idempotent, paused past the heartbeat timeout: Temporal's retry
    finds the step started and halts the plan, and a person settles the step. When the paused attempt
    wakes, its call having overrun, it used to record the outcome unknown over the person's settlement."""
    tools, db, rt, plan_id = _setup(tmp_path, "send")
    args = {**_direct(db, tools, "t-late"), "step_id": 1}
    step, finish = activities(db, tools)
    try:
        with late_attempt(monkeypatch, step, args) as raised:
            assert step(args) == "outcome_unknown", "Temporal's retry: never called twice"
            assert finish(args) == "halted"
            rt.settle(plan_id, 1, done=True, actor="ben", output="sent", note="it went out")
            settled = rt.store.steps(plan_id)[1]
            events = len(rt.trace(plan_id))
    finally:
        (tmp_path / "go").touch()
    assert raised and isinstance(raised[0], PlangateError), raised
    assert rt.store.steps(plan_id)[1] == settled and settled.status == "succeeded"
    assert len(rt.trace(plan_id)) == events, "the late attempt wrote nothing"
    assert _calls(tmp_path) == ["send"]
    assert rt.get(plan_id).status == "halted" and rt.store.verify_audit().ok


EVIL = """
from pathlib import Path

from plangate import tool


@tool(effect="write", idempotent=True, timeout=60)
def charge(to: str) -> str:
    with (Path({dir!r}) / "calls.txt").open("a") as calls:
        calls.write("evil\\n")
    return "evil"
"""


def test_a_workflow_input_naming_other_tools_runs_the_hosts_own(tmp_path: Path) -> None:
    """The workflow's input named the tools file (or MCP command) and the store its activities used:
    whoever could start a workflow could run an approved plan's steps with code of their choosing.
    A host (``serve``) now runs its own tools and store, whatever the input says."""
    tools, db, rt, _ = _setup(tmp_path, "charge")
    evil = tmp_path / "evil.py"
    evil.write_text(EVIL.format(dir=str(tmp_path)))
    args = {**_direct(db, tools, "t-forged"), "step_id": 1, "tools": str(evil)}
    step, _finish = activities(db, tools)
    (tmp_path / "go").touch()
    assert step(args) == "succeeded"
    assert _calls(tmp_path) == ["charge"]  # the host's tool, not the one the input named
    assert rt.store.verify_audit().ok


async def by_hand(
    address: str, db: str, tools: str, args: dict[str, Any], workflow_id: str, *, signal: bool = True, **worker: Any
) -> BaseException:
    """A workflow started with a Temporal client, not through plangate, on a worker hosting plangate's own
    workflow and activities (as ``serve`` hosts them); with ``signal``, told its claim was handed to it, as
    plangate's worker tells the run it started. What it failed with."""
    import concurrent.futures

    from temporalio.client import Client, WorkflowFailureError
    from temporalio.worker import Worker

    client = await Client.connect(address)
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        async with Worker(
            client,
            task_queue="plangate-by-hand",
            workflows=[temporal_module.PlanWorkflow],
            activities=temporal_module.hosted(db, tools),
            activity_executor=pool,
            **worker,
        ):
            with pytest.raises(WorkflowFailureError) as failed:
                await client.execute_workflow(
                    "plangate.Plan",
                    args,
                    id=workflow_id,
                    task_queue="plangate-by-hand",
                    start_signal="plangate.claimed" if signal else None,
                )
    return failed.value


def test_a_workflow_started_by_hand_under_another_id_runs_no_step(temporal: str, tmp_path: Path) -> None:
    """plangate starts a plan's workflow under the plan's id, one at a time; a workflow
    started by hand under another id, with a running plan's input copied, is refused at its first step."""
    tools, db, rt, plan_id = _setup(tmp_path, "charge")
    args = _direct(db, tools, "t-copied")  # the plan now runs under that claim, as if its workflow ran
    (tmp_path / "go").touch()
    failed = asyncio.run(by_hand(temporal, db, tools, args, f"forged-{plan_id}"))
    refusal = failed.__cause__.__cause__  # the workflow failed with its activity, which failed with this
    assert f"is not plan {plan_id}'s: it runs none of its steps" in str(refusal)
    assert _calls(tmp_path) == []
    assert rt.store.steps(plan_id) == {}


def test_a_retried_finish_says_again_how_the_plan_ended(tmp_path: Path) -> None:
    """``finish`` whose first attempt recorded the end but was reported failed (its worker lost on the
    way back) is retried by Temporal: it used to be refused (the plan no longer running) and fail the
    workflow, a plan run counted as not run."""
    tools, db, rt, plan_id = _setup(tmp_path, "charge")
    args = _direct(db, tools, "t-finish")
    step, finish = activities(db, tools)
    (tmp_path / "go").touch()
    assert step({**args, "step_id": 1}) == "succeeded"
    assert finish(args) == "succeeded"
    events = len(rt.trace(plan_id))
    assert finish(args) == "succeeded"  # the retry: nothing written, the end said again
    assert len(rt.trace(plan_id)) == events and rt.store.verify_audit().ok


def test_an_activity_refused_gives_the_plan_back_rather_than_hiding_it_for_the_lease(tmp_path: Path) -> None:
    """A step activity refused (here: the plan's text changed in the store after the claim) failed the
    workflow and left the plan under the workflow's lease, an hour long, with nothing said. The lease is
    now released, as a plain worker releases a plan it may not run."""
    from plangate.errors import GovernanceError

    tools, db, rt, plan_id = _setup(tmp_path, "charge")
    args = _direct(db, tools, "t-refused")
    with rt.store.transaction():
        rt.store.command("UPDATE plan_versions SET body = replace(body, 'ann', 'eve') WHERE plan_id = ?", (plan_id,))
    with pytest.raises(Exception, match="plan text was changed") as refused:
        activities(db, tools)[0]({**args, "step_id": 1})
    assert "ApplicationError" in type(refused.value).__name__
    plan = rt.store.get_plan(plan_id)
    assert plan is not None and plan.status == "running" and plan.lease_owner is None
    assert _calls(tmp_path) == []
    with pytest.raises(GovernanceError, match="plan text was changed"):  # any runner is refused, and says why
        rt.start(plan_id, actor="engine")


def test_a_claim_whose_start_fails_on_the_store_gives_the_plan_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store fails between the claim's lease and the run's start (a cut, a lock held too long): the
    worker waits the outage out and claims again, but the plan was left under its hour-long lease,
    and neither this worker nor any other ran it for that hour."""
    import sqlite3

    tools, db, rt, plan_id = _setup(tmp_path, "charge")
    real = Runtime.start
    failures = iter([sqlite3.OperationalError("database is locked")])

    def flaky(self: Runtime, *args: Any, **kwargs: Any) -> Any:
        for failure in failures:
            raise failure
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Runtime, "start", flaky)
    refused: list[str] = []
    with pytest.raises(sqlite3.OperationalError):
        temporal_module._claim(db, Catalogue.from_spec(tools), "t-cut", refused)
    plan = rt.store.get_plan(plan_id)
    assert plan is not None and plan.status == "approved" and plan.lease_owner is None
    claim = temporal_module._claim(db, Catalogue.from_spec(tools), "t-cut", refused)  # once the store answers
    assert claim is not None and claim.plan.id == plan_id and refused == []
