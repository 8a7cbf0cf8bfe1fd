"""Plans as Temporal workflows, against the real Temporal dev server on loopback."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from plangate import Catalogue, Policy, timeouts
from plangate.runtime import Runtime
from plangate.testing import temporal_server
from tests.conftest import EXAMPLES, load_plan
from tests.otlp import Receiver, otlp_receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as found:
        yield found


@pytest.fixture(scope="module")
def temporal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with temporal_server(tmp_path_factory.mktemp("temporal") / "server.log") as address:
        yield address


def test_plans_run_as_workflows_with_the_same_story(
    temporal: str, tmp_path: Path, catalogue: Catalogue, policy: Policy
) -> None:
    db = f"sqlite:///{tmp_path}/t.db"
    rt = Runtime(catalogue, policy, db=db)
    good = rt.submit(load_plan("refund"), "alice")
    rt.approve(good.id, "dave", good.hash)
    rt.approve(good.id, "carol", good.hash)
    bad = rt.submit(load_plan("halt"), "alice")
    rt.approve(bad.id, "dave", bad.hash)
    fallback = rt.submit(
        {
            "task": "Find a customer by one id, else by another",
            "category": "refunds",
            "steps": [
                {"id": 1, "tool": "lookup_customer", "params": {"customer_id": "c-404"}, "on_failure": "continue",
                 "rationale": "The id the customer gave."},
                {"id": 2, "tool": "lookup_customer", "params": {"customer_id": "c-9"}, "condition": "${1} == null",
                 "rationale": "The id on file."},
                {"id": 3, "tool": "get_invoice", "params": {"invoice_id": "43"}, "condition": "${2} != null",
                 "after": [1], "rationale": "Their invoice."},
            ],
        },
        "alice",
    )  # fmt: skip
    for approver in ("dave", "carol"):
        if rt.get(fallback.id).status == "pending_approval":
            rt.approve(fallback.id, approver, fallback.hash)
    env = {**os.environ, "PLANGATE_DB": db}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "plangate",
            "worker",
            "--tools",
            str(EXAMPLES / "business.py"),
            "--temporal",
            temporal,
            "--drain",
            "--name",
            "t1",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "3 plans run" in done.stderr
    assert rt.get(good.id).status == "succeeded" and rt.get(bad.id).status == "halted"
    kinds = [e.kind for e in rt.trace(good.id)]
    run = kinds[kinds.index("run.started") :]
    assert run[-1] == "run.succeeded" and run.count("step.started") == run.count("step.succeeded") == 4
    started = [e.step_id for e in rt.trace(good.id) if e.kind == "step.started"]
    assert started[0] == 1 and started[-1] == 4, "steps run in dependency order (2 and 3 at the same time)"
    assert all(e.actor == "temporal" for e in rt.trace(good.id) if e.kind.startswith(("run.", "step.")))
    halted = rt.execute(bad.id)
    assert halted.failed_step == 2 and "refund of 500.0" in (halted.error or "")
    assert 3 not in rt.store.steps(bad.id), "a halt stops new steps"
    keys = {r.idempotency_key for r in rt.store.steps(good.id).values()}
    assert keys == {f"{good.id}:{n}" for n in (1, 2, 3, 4)}
    found = rt.execute(fallback.id)
    assert found.ok and found.failed_optional == (1,) and found.outputs[3]["id"] == "43"
    assert rt.store.steps(fallback.id)[1].status == "failed_optional"
    assert rt.store.verify_audit().ok
    from examples import business

    assert business.effect_counts() == {"refund": 1, "email": 1}


def test_a_retried_step_activity_follows_the_resume_rules(tmp_path: Path) -> None:
    """What Temporal's retry of a step whose worker died does: the engine's unknown-outcome rules."""
    from datetime import UTC, datetime

    from plangate import tool
    from plangate.engine import Engine
    from plangate.store import StepRow
    from tests.helpers import FixedClock, plan

    calls: list[str] = []

    @tool(effect="write", idempotent=True)
    def safe(x: int) -> int:
        calls.append("safe")
        return x

    @tool(effect="irreversible")
    def once(x: int) -> int:
        calls.append("once")
        return x

    rt = Runtime(Catalogue([safe, once]), db=f"sqlite:///{tmp_path}/r.db", clock=FixedClock())
    record = rt.submit(
        plan(
            {"id": 1, "tool": "safe", "params": {"x": 1}},
            {"id": 2, "tool": "once", "params": {"x": 2}, "condition": "${1} == 1"},
        ),
        "ann",
    )
    rt.approve(record.id, "ben", record.hash)
    claim = rt.start(record.id, actor="temporal")  # what the Temporal worker does before it starts the workflow
    engine = Engine(store=rt.store, catalogue=rt.catalogue, clock=rt.clock, owner=claim.owner)  # type: ignore[arg-type]
    now = datetime(2026, 1, 1, tzinfo=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    for step_id in (1, 2):  # both left "started" by a worker that died during the call
        with rt.store.transaction():
            rt.store.put_step(
                StepRow(
                    plan_id=record.id,
                    step_id=step_id,
                    version=1,
                    status="started",
                    attempt=1,
                    idempotency_key=f"{record.id}:{step_id}",
                    started_at=now,
                )
            )
    stepper = engine.stepper(record.id, 1, record.plan)  # type: ignore[arg-type]
    assert stepper.one(1) == "succeeded" and calls == ["safe"], "idempotent: run again under the same key"
    again = engine.stepper(record.id, 1, record.plan)  # type: ignore[arg-type]
    assert again.one(1) == "succeeded" and calls == ["safe"], "a completed step is never run again"
    assert engine.stepper(record.id, 1, record.plan).one(2) == "outcome_unknown"  # type: ignore[arg-type]
    assert calls == ["safe"], "not idempotent: never re-run, a person must settle it"
    result = engine.stepper(record.id, 1, record.plan).finish()  # type: ignore[arg-type]
    assert result.status == "halted" and result.failed_step == 2 and "outcome unknown" in (result.error or "")


def test_a_step_that_overruns_on_temporal_halts_for_a_person(temporal: str, tmp_path: Path) -> None:
    """The activity's engine holds the call to its limit: the workflow ends, the worker's process exits."""
    from tests.helpers import plan

    tools = tmp_path / "hanging.py"
    tools.write_text(
        "import threading\n"
        "from plangate import tool\n\n\n"
        '@tool(effect="write", timeout=0.5)\n'
        "def send(to: str) -> str:\n"
        "    threading.Event().wait()  # never returns\n"
        "    return to\n"
    )
    db = f"sqlite:///{tmp_path}/t.db"
    rt = Runtime(Catalogue.from_module(tools), db=db)
    record = rt.submit(plan({"id": 1, "tool": "send", "params": {"to": "ann"}}), "ann")
    rt.approve(record.id, "ben", record.hash)
    command = ["worker", "--tools", str(tools), "--temporal", temporal, "--drain", "--name", "t2"]
    done = subprocess.run(
        [sys.executable, "-m", "plangate", *command],
        env={**os.environ, "PLANGATE_DB": db},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert rt.get(record.id).status == "halted"
    row = rt.store.steps(record.id)[1]
    assert row.status == "outcome_unknown" and "the call timed out after 0.5 s" in (row.error or "")


def test_a_run_on_temporal_is_one_trace_whose_steps_join_the_workers_run_span(
    temporal: str, tmp_path: Path, catalogue: Catalogue, policy: Policy, receiver: Receiver
) -> None:
    """The run span is the worker's; each step's span, made in whichever activity ran it, is its child."""
    db = f"sqlite:///{tmp_path}/t.db"
    rt = Runtime(catalogue, policy, db=db)
    record = rt.submit(load_plan("refund"), "alice")
    rt.approve(record.id, "dave", record.hash)
    rt.approve(record.id, "carol", record.hash)
    command = ["worker", "--tools", str(EXAMPLES / "business.py"), "--temporal", temporal, "--drain", "--name", "t3"]
    done = subprocess.run(
        [sys.executable, "-m", "plangate", *command],
        env={**os.environ, "PLANGATE_DB": db, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert rt.get(record.id).status == "succeeded"
    run = receiver.one("plangate.run")
    assert run.attributes["plangate.plan_id"] == record.id and run.attributes["plangate.run.status"] == "succeeded"
    assert run.attributes["plangate.actor"] == "temporal"
    steps = receiver.named("plangate.step")
    assert sorted(s.attributes["plangate.step_id"] for s in steps) == [1, 2, 3, 4]
    assert {(s.trace_id, s.parent_id) for s in steps} == {(run.trace_id, run.span_id)}
    assert all(s.attributes["plangate.step.status"] == "succeeded" for s in steps)


KILL_TOOLS = '''
import json
import os
import time
from pathlib import Path

from plangate import RunContext, tool

DIR = Path({dir!r})


def _called(name: str, ctx: RunContext) -> None:
    """Each call, with its key and its process, in the order they came; then wait for the test's go."""
    with (DIR / "calls.jsonl").open("a") as calls:
        calls.write(json.dumps({{"tool": name, "key": ctx.idempotency_key, "pid": os.getpid()}}) + "\\n")
    while not (DIR / f"go-{{name}}").exists():
        time.sleep(0.05)


@tool(effect="write", idempotent=True, timeout=120)
def charge(amount: int, ctx: RunContext) -> int:
    _called("charge", ctx)
    ledger = DIR / "ledger.json"
    done = json.loads(ledger.read_text()) if ledger.exists() else {{}}
    done.setdefault(ctx.idempotency_key, amount)  # the tool's own ledger: one effect per key
    ledger.write_text(json.dumps(done))
    return amount


@tool(effect="write", timeout=120)
def ship(to: str, ctx: RunContext) -> str:
    _called("ship", ctx)
    return to
'''


def _calls(tmp_path: Path) -> list[dict[str, object]]:
    import json

    found = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in found.read_text().splitlines()] if found.exists() else []


def _wait_for_call(
    tmp_path: Path, rt: Runtime, plan_id: str, tool: str, count: int, worker: subprocess.Popen[str]
) -> list[dict[str, object]]:
    """Until the tool's ``count``-th call is in flight in ``worker``, its step recorded ``started``."""
    import time

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        calls = [c for c in _calls(tmp_path) if c["tool"] == tool]
        step = 1 if tool == "charge" else 2
        row = rt.store.steps(plan_id).get(step)
        if len(calls) >= count and row is not None and row.status == "started":
            assert len(calls) == count and calls[-1]["pid"] == worker.pid
            return calls
        assert worker.poll() is None, f"the worker exited with {worker.returncode}"
        time.sleep(0.1)
    raise AssertionError(f"no call {count} of {tool} in time")


async def _heartbeat_seen(address: str, plan_id: str) -> None:
    """Until Temporal holds a heartbeat from the step's first attempt, sent while its tool waits."""
    from temporalio.client import Client

    handle = (await Client.connect(address)).get_workflow_handle(plan_id)
    for _ in range(600):
        pending = (await handle.describe()).raw_description.pending_activities
        if any(a.attempt == 1 and a.HasField("last_heartbeat_time") for a in pending):
            return
        await asyncio.sleep(0.1)
    raise AssertionError("no heartbeat reached Temporal while the step ran")


def test_a_temporal_worker_killed_mid_activity_is_retried_by_another_under_the_resume_rules(
    temporal: str, tmp_path: Path
) -> None:
    """SIGKILL a worker while a step's tool runs: its heartbeats stop and Temporal runs the activity again
    on the next worker within seconds. The idempotent step runs again under the same key (one effect);
    the one that is not halts the plan with its outcome unknown, never called twice."""
    import signal
    from datetime import UTC, datetime

    from temporalio.api.enums.v1 import TimeoutType
    from temporalio.client import Client

    from tests.helpers import plan

    tools = tmp_path / "blocking.py"
    tools.write_text(KILL_TOOLS.format(dir=str(tmp_path)))
    db = f"sqlite:///{tmp_path}/t.db"
    rt = Runtime(Catalogue.from_module(tools), db=db)
    record = rt.submit(
        plan(
            {"id": 1, "tool": "charge", "params": {"amount": 5}},
            {"id": 2, "tool": "ship", "params": {"to": "ann"}, "after": [1]},
        ),
        "ann",
    )
    rt.approve(record.id, "ben", record.hash)
    logs: list[Path] = []

    def worker(name: str) -> subprocess.Popen[str]:
        logs.append(tmp_path / f"{name}.log")
        command = ["worker", "--tools", str(tools), "--temporal", temporal, "--drain", "--name", name]
        with logs[-1].open("w") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "plangate", *command, "--heartbeat-timeout", "2", "--max-activities", "4"],
                env={**os.environ, "PLANGATE_DB": db},
                stdout=subprocess.DEVNULL,
                stderr=log,
                text=True,
            )

    first = worker("w-a")
    try:
        key = _wait_for_call(tmp_path, rt, record.id, "charge", 1, first)[0]["key"]
        asyncio.run(_heartbeat_seen(temporal, record.id))
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        killed_at = datetime.now(UTC)
        second = worker("w-b")
        _wait_for_call(tmp_path, rt, record.id, "charge", 2, second)
        (tmp_path / "go-charge").touch()
        _wait_for_call(tmp_path, rt, record.id, "ship", 1, second)
        second.send_signal(signal.SIGKILL)
        second.wait(timeout=30)
        third = worker("w-c")
        assert third.wait(timeout=180) == 0, logs[-1].read_text()[-2000:]
    finally:
        for log in logs:
            print(log.name, log.read_text()[-2000:])  # shown when the test fails
    charges = [c for c in _calls(tmp_path) if c["tool"] == "charge"]
    assert [c["key"] for c in charges] == [key, key] == [f"{record.id}:1"] * 2, "the same key on both calls"
    assert len({c["pid"] for c in charges}) == 2, "run again by the second worker"
    import json

    assert json.loads((tmp_path / "ledger.json").read_text()) == {key: 5}, "one effect for the key"
    assert [c["tool"] for c in _calls(tmp_path)].count("ship") == 1, "not idempotent: never called twice"
    assert rt.get(record.id).status == "halted"
    steps = rt.store.steps(record.id)
    assert steps[1].status == "succeeded" and steps[1].idempotency_key == key
    assert steps[2].status == "outcome_unknown" and "not idempotent" in (steps[2].error or "")
    assert rt.store.steps(record.id)[1].attempt == 2
    retried = [e for e in rt.trace(record.id) if e.kind == "step.retrying" and e.step_id == 1]
    assert len(retried) == 1 and key in retried[0].data["reason"]
    seconds = (datetime.fromisoformat(retried[0].at.replace("Z", "+00:00")) - killed_at).total_seconds()
    assert seconds < 60, "retried on the heartbeat timeout, not at the end of the step's budget and margin"
    assert rt.store.verify_audit().ok

    async def timeouts() -> list[int]:
        history = await (await Client.connect(temporal)).get_workflow_handle(record.id).fetch_history()
        return [
            e.activity_task_started_event_attributes.last_failure.timeout_failure_info.timeout_type
            for e in history.events
            if e.HasField("activity_task_started_event_attributes")
            and e.activity_task_started_event_attributes.attempt > 1
        ]

    assert asyncio.run(timeouts()) == [TimeoutType.TIMEOUT_TYPE_HEARTBEAT] * 2, "both retries: heartbeats stopped"


def test_a_temporal_worker_refuses_too_few_threads_for_its_activities_in_one_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from plangate.cli import main

    command = ["worker", "--tools", str(EXAMPLES / "business.py"), "--db", f"sqlite:///{tmp_path}/t.db"]
    done = CliRunner().invoke(
        main, [*command, "--temporal", "127.0.0.1:1", "--max-activities", "4", "--activity-threads", "4"]
    )
    assert done.exit_code == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("plangate: worker --temporal: 4 activity threads for 4 activities"), line
    done = CliRunner().invoke(main, [*command, "--temporal", "127.0.0.1:1", "--heartbeat-timeout", "0"])
    assert done.exit_code == 2 and "--heartbeat-timeout" in done.stderr


def test_a_temporal_worker_survives_a_plan_it_cannot_read_and_a_store_out_of_reach(
    temporal: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan whose check record was damaged outside plangate used to end the worker at every start
    (its error went up through serve), and so did a store that could not be reached for one claim.
    Now the plan is left alone (said once, its lease released) and the claim is tried again."""
    import asyncio
    import itertools

    from plangate import temporal as temporal_module
    from plangate.errors import StoreError
    from plangate.store import open_store
    from tests.test_worker_concurrency import TOOLS, submit

    db = f"sqlite:///{tmp_path}/t.db"
    broken, good = submit(db, ["count"], 2)
    store = open_store(db)
    with store.transaction():
        store.command("UPDATE plan_versions SET check_result = '{' WHERE plan_id = ?", (broken,))
    real_claim, claims = temporal_module._claim, itertools.count()

    def claim(*args: object) -> object:
        if next(claims) == 0:
            raise StoreError("cannot open the store: connection refused")
        return real_claim(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(temporal_module, "_claim", claim)
    monkeypatch.setattr(timeouts, "STORE_RETRY_SECONDS", (0.05, 0.1))
    ran = asyncio.run(temporal_module.serve(temporal, db, str(TOOLS), drain=True, poll=0.05, name="t-survivor"))
    assert ran == 1
    try:
        plan = store.get_plan(broken)
        assert plan is not None and plan.status == "approved" and plan.lease_owner is None  # left for a person
        assert store.get_plan(good).status == "succeeded"  # type: ignore[union-attr]
        assert [row.status for row in store.steps(good).values()] == ["succeeded"]
        assert store.steps(broken) == {}  # nothing of it ran
        assert store.verify_audit().ok
    finally:
        store.close()


def test_a_workers_heartbeats_are_not_held_back_past_the_beat(
    temporal: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step's thread heartbeats each second, but the SDK sends one heartbeat per 0.8 of the timeout at most
    unless told otherwise, holding the rest back: Temporal heard from a live worker once in 8 s (at the default
    10 s timeout), so a pause of 2 s at the wrong moment had it run a step still running elsewhere. The worker
    ``serve`` hosts holds the SDK's throttle to the beat."""
    from datetime import timedelta
    from typing import Any

    import temporalio.worker

    from plangate import temporal as temporal_module
    from tests.test_worker_concurrency import TOOLS

    made: list[dict[str, Any]] = []

    class Recorded(temporalio.worker.Worker):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(temporalio.worker, "Worker", Recorded)
    db = f"sqlite:///{tmp_path}/beat.db"
    ran = asyncio.run(temporal_module.serve(temporal, db, str(TOOLS), drain=True, poll=0.05, name="t-beat"))
    assert ran == 0 and len(made) == 1
    assert made[0]["max_heartbeat_throttle_interval"] == timedelta(seconds=1)
