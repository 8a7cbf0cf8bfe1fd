"""A store outage in the middle of a step on Temporal: the next attempt records what the tool answered.

The PostgreSQL connections are cut (``pg_terminate_backend``) from inside the step's tool call, as
``tests/test_worker_outage.py`` cuts them: the tool has answered, and the activity's next transaction
finds its connection gone. The attempt hands the outcome on in its heartbeat's details, sealed under
the audit key; Temporal's retry records it, once, instead of reading the step as of unknown outcome.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue, ledger
from plangate import temporal as temporal_module
from plangate.errors import StoreLostError
from plangate.runtime import Runtime
from plangate.testing import temporal_server
from tests.helpers import plan
from tests.test_temporal_attacks import RUN, _direct

# Tools that write each call down, and cut every other connection to the database during the first call.
TOOLS = """
import time
from contextlib import closing
from pathlib import Path

import psycopg

from plangate import tool

DIR = Path({dir!r})
URL = {url!r}


def _called(name: str) -> None:
    with (DIR / "calls.txt").open("a") as calls:
        calls.write(name + "\\n")
    if (DIR / "calls.txt").read_text().split().count(name) == 1:
        with closing(psycopg.connect(URL, autocommit=True)) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )


@tool(effect="irreversible", timeout=30)
def pay(amount: int) -> str:
    _called("pay")
    return f"paid {{amount}}"


@tool(effect="write", idempotent=True, timeout=30)
def put(n: int) -> int:
    _called("put")
    return n


@tool(effect="write", idempotent=True, timeout=30)
def late(n: int) -> int:
    time.sleep(1)  # answers after the attempt's first heartbeat (0.5 s in): the SDK holds the next one back
    _called("late")
    return n


@tool(effect="write", idempotent=True, timeout=30)
def note(n: int) -> int:
    with (DIR / "calls.txt").open("a") as calls:
        calls.write("note\\n")
    return n
"""


@pytest.fixture(scope="module")
def temporal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with temporal_server(tmp_path_factory.mktemp("temporal") / "server.log") as address:
        yield address


def _setup(tmp_path: Path, db: str, first: str) -> tuple[str, str]:
    """A tools file, and an approved plan: ``first`` (whose call cuts the store's connections), then a note."""
    tools = tmp_path / "outage.py"
    tools.write_text(TOOLS.format(dir=str(tmp_path), url=db))
    rt = Runtime(Catalogue.from_module(tools), db=db)
    params = {"amount": 5} if first == "pay" else {"n": 5}
    record = rt.submit(
        plan({"id": 1, "tool": first, "params": params}, {"id": 2, "tool": "note", "params": {"n": 1}}), "ann"
    )
    rt.approve(record.id, "ben", record.hash)
    rt.close()
    return str(tools), record.id


def _calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls.txt").read_text().split()


def _ran_once_and_verifies(db: str, tools: str, plan_id: str) -> None:
    rt = Runtime(Catalogue.from_spec(tools), db=db)
    try:
        assert rt.get(plan_id).status == "succeeded", rt.store.steps(plan_id)
        kinds = collections.Counter((e.kind, e.step_id) for e in rt.store.events(plan_id))
        assert kinds[("step.started", 1)] == kinds[("step.succeeded", 1)] == 1, kinds
        assert kinds[("step.outcome_unknown", 1)] == 0
        report = ledger.verify(rt.store)
        assert report.ok, str(report)
    finally:
        rt.close()


@pytest.mark.parametrize("first", ["pay", "put", "late"])
def test_a_known_outcome_is_recorded_by_temporals_retry(
    temporal: str, pg_db: str, tmp_path: Path, first: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The step's activity called its tool, then could not record the outcome (its connection cut): it failed,
    and Temporal's retry read the step as started with no outcome. A payment plangate knew was made halted
    the plan for a person to settle; an idempotent write was called again. The retry now records the outcome
    the first attempt sealed in its heartbeat, and the plan goes on; also where the SDK held that heartbeat
    back (``late``): it goes to Temporal with the attempt's failure."""
    tools, plan_id = _setup(tmp_path, pg_db, first)
    settings = temporal_module.Settings(heartbeat_seconds=2, max_activities=2)
    with caplog.at_level(logging.WARNING, logger="plangate.temporal"):
        ran = asyncio.run(
            temporal_module.serve(temporal, pg_db, tools, drain=True, poll=0.05, name="t-outage", settings=settings)
        )
    assert ran == 1
    assert _calls(tmp_path) == [first, "note"], "each tool called once"
    _ran_once_and_verifies(pg_db, tools, plan_id)
    assert "did not seal" not in caplog.text


def _attempt(
    db: str, tools: str, args: dict[str, Any], details: list[Any], heard: Callable[..., None] = lambda *beat: None
) -> tuple[str | BaseException, list[Any]]:
    """The step's activity as Temporal runs it in workflow run ``RUN``, given ``details`` from an earlier
    attempt's heartbeat: what it returned or raised, and the details of the heartbeats it sent (each also
    given to ``heard``, in the thread that sent it)."""
    from temporalio.testing import ActivityEnvironment

    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info, workflow_id=args["plan_id"], workflow_run_id=RUN, heartbeat_details=details
    )
    sent: list[Any] = []

    def on_heartbeat(*beat: Any) -> None:
        sent.extend(beat)
        heard(*beat)

    env.on_heartbeat = on_heartbeat
    step, _ = temporal_module.hosted(db, tools)
    try:
        return env.run(step, args), sent
    except BaseException as exc:  # what the attempt ended with
        return exc, sent


def _cut_off(tmp_path: Path, db: str) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    """A payment whose activity lost its store after the call: the sealed details of its last heartbeat."""
    tools, plan_id = _setup(tmp_path, db, "pay")
    args = {**_direct(db, tools, "t-forged"), "step_id": 1}
    raised, sent = _attempt(db, tools, args, [])
    assert isinstance(raised, StoreLostError), raised
    assert "the outcome of step 1 (attempt 1) is known and not confirmed recorded" in str(raised)
    assert sent and sent[-1]["outcome"]["output"] == "paid 5"
    return tools, plan_id, args, sent[-1]


def test_the_outcome_goes_out_after_a_heartbeat_in_flight(
    pg_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step's heartbeat thread was handing a heartbeat to the SDK (which waits for the worker's event loop
    to take it: long, on a loaded machine) as the store went away after the tool answered. The attempt's own
    heartbeat of the outcome entered the same context meanwhile, which Python refuses (``cannot enter
    context``): the attempt failed with that error and sent no outcome, and Temporal's retry called the
    idempotent tool again. The outcome now goes out once the heartbeat in flight is through, as the last."""
    tools, _ = _setup(tmp_path, pg_db, "put")
    args = {**_direct(pg_db, tools, "t-in-flight"), "step_id": 1, "heartbeat_seconds": 2}
    in_flight, over = threading.Event(), threading.Event()
    beats: list[tuple[Any, ...]] = []

    def slow_loop(*beat: Any) -> None:
        beats.append(beat)
        if threading.current_thread().name == "plangate-heartbeat" and not in_flight.is_set():
            in_flight.set()
            over.wait(1)  # the event loop takes a second to take it, or until the attempt is over

    seal = temporal_module._seal

    def sealed_in_flight(*known: Any) -> dict[str, Any]:
        assert in_flight.wait(30)  # the store is found gone while the thread's first heartbeat is in flight
        return seal(*known)

    monkeypatch.setattr(temporal_module, "_seal", sealed_in_flight)
    try:
        raised, _ = _attempt(pg_db, tools, args, [], slow_loop)
    finally:
        over.set()
    assert isinstance(raised, StoreLostError), repr(raised)
    (last,) = beats[-1]
    assert last["outcome"]["output"] == 5, "the attempt's last heartbeat carries the outcome"
    assert _attempt(pg_db, tools, args, [last])[0] == "succeeded"
    assert _attempt(pg_db, tools, {**args, "step_id": 2}, [])[0] == "succeeded"
    assert _calls(tmp_path) == ["put", "note"], "each tool called once"


def test_a_sealed_outcome_is_recorded_once(pg_db: str, tmp_path: Path) -> None:
    """The retry records the outcome its heartbeat's details carry; a second retry given them again, once the
    step's record moved on, records nothing more and calls nothing."""
    tools, plan_id, args, sealed = _cut_off(tmp_path, pg_db)
    assert _attempt(pg_db, tools, args, [sealed])[0] == "succeeded"
    assert _attempt(pg_db, tools, args, [sealed])[0] == "succeeded"
    assert _attempt(pg_db, tools, {**args, "step_id": 2}, [])[0] == "succeeded"
    assert _calls(tmp_path) == ["pay", "note"]
    rt = Runtime(Catalogue.from_spec(tools), db=pg_db)
    try:
        kinds = collections.Counter((e.kind, e.step_id) for e in rt.store.events(plan_id))
        assert kinds[("step.succeeded", 1)] == 1 and rt.store.steps(plan_id)[1].output == "paid 5"
        assert ledger.verify(rt.store).ok
    finally:
        rt.close()


FORGERIES = {
    "another output": lambda told: {**told, "outcome": {**told["outcome"], "output": "paid 5000"}},
    "another attempt": lambda told: {**told, "attempt": 2},
    "another run's lease": lambda told: {**told, "lease": told["lease"].replace(RUN, "run-0")},
    "no seal": lambda told: {k: v for k, v in told.items() if k != "seal"},
    "not a mapping": lambda told: "paid",
}


@pytest.mark.parametrize("forgery", [*sorted(FORGERIES), "sealed for another attempt"])
def test_a_forged_heartbeat_detail_is_ignored(
    pg_db: str, tmp_path: Path, forgery: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Heartbeat details come from Temporal's server, outside plangate's trust: details that plangate did not
    seal for this step, attempt and run (changed, or sealed for another) make no outcome appear. The step
    is read as it was (started, its outcome unknown: a person settles it), and a plain line says why."""
    tools, plan_id, args, sealed = _cut_off(tmp_path, pg_db)
    if forgery == "sealed for another attempt":  # as plangate seals it: the step's record is not that attempt's
        forged = temporal_module._seal(args, sealed["lease"], _known({**sealed, "attempt": 2}))
    else:
        forged = FORGERIES[forgery](sealed)
    with caplog.at_level(logging.WARNING, logger="plangate.temporal"):
        assert _attempt(pg_db, tools, args, [forged])[0] == "outcome_unknown"
    if forgery != "sealed for another attempt":
        assert f"plan {plan_id} step 1: a heartbeat's details that plangate did not seal" in caplog.text
    assert _calls(tmp_path) == ["pay"]
    rt = Runtime(Catalogue.from_spec(tools), db=pg_db)
    try:
        row = rt.store.steps(plan_id)[1]
        assert row.status == "outcome_unknown" and row.output is None
        assert ledger.verify(rt.store).ok
    finally:
        rt.close()


def _known(told: dict[str, Any]) -> Any:
    from plangate._calls import Outcome
    from plangate.engine import Unconfirmed

    return Unconfirmed(((told["attempt"], Outcome(**told["outcome"])),))
