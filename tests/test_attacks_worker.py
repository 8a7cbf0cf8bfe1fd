"""Workers against tools that raise what is not an ``Exception`` (``SystemExit`` from a library that
calls ``sys.exit``, ``KeyboardInterrupt``, a ``CancelledError`` of the tool's own, sync or async), and
against a cut-off run that the tools now in force refuse."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sized
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue, RunContext, _calls, story, timeouts, tool
from plangate.errors import GovernanceError, StateError
from plangate.plan import Plan
from plangate.results import RunResult
from plangate.runtime import Runtime
from plangate.store import open_store
from plangate.tools import Tool
from plangate.worker import Worker
from tests.helpers import until

made: list[tuple[str, int]] = []


def _quits(kind: str) -> BaseException:
    return {
        "exit": SystemExit(2),
        "interrupt": KeyboardInterrupt(),
        "cancelled": asyncio.CancelledError(),
    }[kind]


def make(kind: str, *, is_async: bool, idempotent: bool) -> Tool:
    """A tool that counts its call and raises ``kind``."""
    effect = "write" if idempotent else "irreversible"
    if is_async:

        @tool(effect=effect, idempotent=idempotent, name="quits")
        async def quits_async(n: int, ctx: RunContext) -> int:
            """Count the call, then raise."""
            made.append((ctx.plan_id, ctx.step_id))
            await asyncio.sleep(0)
            raise _quits(kind)

        return quits_async

    @tool(effect=effect, idempotent=idempotent, name="quits")
    def quits_sync(n: int, ctx: RunContext) -> int:
        """Count the call, then raise."""
        made.append((ctx.plan_id, ctx.step_id))
        raise _quits(kind)

    return quits_sync


@tool
def fine(n: int) -> int:
    """Nothing to it."""
    return n


def approved(db: str, catalogue: Catalogue, steps: list[dict[str, Any]]) -> str:
    rt = Runtime(catalogue, db=db)
    record = rt.submit({"task": "t", "category": "test", "steps": steps}, "alice")
    rt.approve(record.id, "reviewer", record.hash)
    rt.close()
    return record.id


def serve(w: Worker, results: list[RunResult]) -> threading.Thread:
    thread = threading.Thread(
        target=w.serve, kwargs={"drain": True, "poll": 0.05, "on_result": results.append}, daemon=True
    )
    thread.start()
    return thread


CASES = [
    pytest.param("exit", False, id="sync-SystemExit"),
    pytest.param("interrupt", False, id="sync-KeyboardInterrupt"),
    pytest.param("exit", True, id="async-SystemExit"),
    pytest.param("interrupt", True, id="async-KeyboardInterrupt"),
    pytest.param("cancelled", True, id="async-own-CancelledError"),
]


@pytest.mark.parametrize(("kind", "is_async"), CASES)
@pytest.mark.parametrize("parallel", [False, True], ids=["alone", "beside-another-step"])
def test_an_idempotent_tool_that_raises_a_base_exception_is_called_once_and_the_plan_ends(
    tmp_path: Path, kind: str, is_async: bool, parallel: bool, died: list[str]
) -> None:
    """The raise is the tool's failure: the step fails, the plan halts, the worker drains and returns.

    Before, it went through the engine and the worker (which catch ``Exception``): the runner thread
    died, its lease was released with the plan still running, the worker claimed it again at once and
    resumed it, and the idempotent step ran again, and again, hundreds of times a second, without end:
    the plan never ended, a tool declaring no retries was called without limit, and the log grew.
    """
    made.clear()
    db = f"sqlite:///{tmp_path}/plangate.db"
    catalogue = Catalogue([make(kind, is_async=is_async, idempotent=True), fine])
    steps = [{"id": 1, "tool": "quits", "params": {"n": 1}, "rationale": "r"}]
    if parallel:
        steps.append({"id": 2, "tool": "fine", "params": {"n": 2}, "rationale": "r"})
    plan_id = approved(db, catalogue, steps)
    results = drained(catalogue, db, died)
    store = open_store(db)
    try:
        row = store.get_plan(plan_id)
        assert row is not None
        assert made == [(plan_id, 1)], f"called {len(made)} times; the plan is {row.status}"
        assert row.status == "halted" and row.lease_owner is None
        assert [r.status for r in results] == ["halted"] and kind_name(kind) in (results[0].error or "")
        assert store.verify_audit().ok
    finally:
        store.close()
        made.clear()


def drained(catalogue: Catalogue, db: str, died: list[str], calls: Sized = made) -> list[RunResult]:
    """Serve the store's plans with a worker until it drains (or a step runs a second time, which is
    already wrong: ``calls`` holds more than one); the worker must still be alive. What its runs came back with."""
    w = Worker(catalogue, db=db, concurrency=2, drain_timeout=1.0)
    results: list[RunResult] = []
    thread = serve(w, results)
    until("the worker drained, or the step ran again", lambda: not thread.is_alive() or len(calls) > 1, limit=60)
    w.stop()
    thread.join(30)
    w.close()
    assert not thread.is_alive() and not died, died[:3]
    return results


@pytest.mark.parametrize(("kind", "is_async"), CASES)
def test_a_tool_that_is_not_idempotent_raising_a_base_exception_halts_the_run_at_once(
    tmp_path: Path, kind: str, is_async: bool, died: list[str]
) -> None:
    """Recorded as its failure in the run that called it, the step once, the worker alive and done."""
    made.clear()
    db = f"sqlite:///{tmp_path}/plangate.db"
    catalogue = Catalogue([make(kind, is_async=is_async, idempotent=False), fine])
    plan_id = approved(db, catalogue, [{"id": 1, "tool": "quits", "params": {"n": 1}, "rationale": "r"}])
    results = drained(catalogue, db, died)
    store = open_store(db)
    try:
        assert made == [(plan_id, 1)]
        assert [r.status for r in results] == ["halted"], "the run that made the call records how it ended"
        assert kind_name(kind) in (results[0].error or "")
        kinds = [e.kind for e in store.events(plan_id)]
        assert "run.resumed" not in kinds and kinds.count("step.started") == 1
        assert store.verify_audit().ok
    finally:
        store.close()
        made.clear()


def kind_name(kind: str) -> str:
    return type(_quits(kind)).__name__


@pytest.fixture
def died() -> Iterator[list[str]]:
    """The worker's threads that died of what they raised (none may)."""
    hook = threading.excepthook
    dead: list[str] = []

    def seen(args: threading.ExceptHookArgs) -> None:
        dead.append(f"{args.thread.name if args.thread else '?'}: {args.exc_type.__name__}")

    threading.excepthook = seen
    yield dead
    threading.excepthook = hook


@pytest.mark.parametrize(("kind", "is_async"), CASES)
def test_a_call_made_for_an_orchestrator_records_a_base_exception_as_the_tool_s_failure(
    kind: str, is_async: bool
) -> None:
    """The one-step path (``Engine.stepper().one``, the Temporal backend's) calls on a pool thread."""
    made.clear()
    quits = make(kind, is_async=is_async, idempotent=True)
    body = {"task": "t", "category": "c", "steps": [{"id": 1, "tool": "quits", "params": {"n": 1}, "rationale": "r"}]}
    ctx = RunContext(plan_id="p", step_id=1, now=datetime.now(UTC), attempt=1)
    pool = timeouts.shared("plangate-step")
    try:
        outcome = _calls.bounded(Plan.parse(body).step(1), quits, {"n": 1, "ctx": ctx}, 30, pool)
    except BaseException as exc:
        pytest.fail(f"the tool's {type(exc).__name__} came through the call")
    assert not outcome.ok and outcome.retryable and (outcome.error or "").startswith(kind_name(kind))
    assert made == [("p", 1)]
    made.clear()


# -- a run cut off, then refused under the tools now in force ---------------------------------
@tool(effect="irreversible", name="send")
def send_then(n: int) -> int:
    """Send (the contract the plan was approved under)."""
    return n


@tool(effect="irreversible", name="send")
def send_now(n: str) -> int:
    """Send (the contract after a deploy: another parameter type)."""
    return 1


def _cut_off(tmp_path: Path) -> tuple[str, str]:
    """A plan approved under ``send_then``, whose runner died during step 1: its store and its id."""
    from tests.helpers import died_during, plan

    db = f"sqlite:///{tmp_path}/plangate.db"
    rt = Runtime(Catalogue([send_then]), db=db)
    try:
        record = rt.submit(plan({"id": 1, "tool": "send", "params": {"n": 1}}), "alice")
        rt.approve(record.id, "reviewer", record.hash)
        died_during(rt.store, record.id, 1)
    finally:
        rt.close()
    return db, record.id


def test_a_cut_off_run_the_tools_now_refuse_halts_where_a_person_can_end_it(tmp_path: Path) -> None:
    """A worker died during step 1 (a deploy's SIGTERM drain gives its lease back the same way); the
    workers that follow run tools whose contract changed, and the plan no longer passes the check.

    Left ``running``, every worker would claim it again and again, and nobody could end it:
    rejecting, editing, settling and closing are refused to a running plan. The refusal halts it,
    saying why, and a person settles the step and closes the plan.
    """
    db, plan_id = _cut_off(tmp_path)
    w = Worker(Catalogue([send_now]), db=db, concurrency=2)
    try:
        assert w.run_one() is None and w.refused, "the plan no longer passes: refused"
        assert w.run_one() is None, "a halted plan is a person's: no worker claims it"
    finally:
        w.close()
    person = Runtime(Catalogue([send_now]), db=db)
    try:
        row = person.store.get_plan(plan_id)
        assert row is not None and row.status == "halted" and row.lease_owner is None
        refused = [e for e in person.store.events(plan_id) if e.kind == "run.refused"]
        assert len(refused) == 1 and "no longer passes" in refused[0].data["error"]
        assert refused[0].data["transition"] == {"from": "running", "to": "halted"}
        assert "HALTED where it was cut off" in "\n".join(story.tell(person.trace(plan_id)))
        person.settle(plan_id, 1, done=False, actor="reviewer", note="never sent")
        person.close_plan(plan_id, actor="reviewer", reason="the tools changed")
        assert person.get(plan_id).status == "closed"
        assert person.store.verify_audit().ok
        assert made == []
    finally:
        person.close()


def test_a_cut_off_run_refused_and_halted_resumes_once_the_tools_pass_again(tmp_path: Path) -> None:
    """The tools put back as they were (a deploy rolled back): the halted run resumes like any other,
    and its step, not idempotent and cut off during its call, halts for a person as an unknown outcome."""
    from plangate.replay import replay

    db, plan_id = _cut_off(tmp_path)
    refused = Runtime(Catalogue([send_now]), db=db)
    try:
        with pytest.raises(GovernanceError, match="no longer passes"):
            refused.execute(plan_id)
    finally:
        refused.close()
    back = Runtime(Catalogue([send_then]), db=db)
    try:
        assert back.get(plan_id).status == "halted"
        result = back.resume(plan_id)
        assert result.status == "halted" and (result.error or "").startswith("outcome unknown")
        assert back.store.verify_audit().ok
        assert replay(back.store, plan_id, back.catalogue).ok
    finally:
        back.close()


def test_a_refused_start_leaves_a_run_another_runner_holds_alone(tmp_path: Path) -> None:
    """Only the lease's holder ends a run: a start under tools that refuse the plan, while a live runner
    holds it, is refused as any second runner is, before the check now in force acts on it, and the plan
    stays that runner's, running."""
    from plangate import lifecycle

    db, plan_id = _cut_off(tmp_path)
    rt = Runtime(Catalogue([send_now]), db=db)
    try:
        holder = lifecycle.runner("holder")  # this process: a live lease
        with rt.store.transaction():
            rt.store.lock_log()
            row = rt.store.get_plan(plan_id)
            assert row is not None
            until = "2999-01-01T00:00:00.000000Z"
            lifecycle.claim(
                rt.store,
                row,
                owner=holder,
                at="2026-06-01T00:00:00.000000Z",
                until=until,
                actor="engine",
                kind="run.resumed",
                data={"steps": 1},
            )
        with pytest.raises(StateError, match="already running under"):
            rt.start(plan_id, actor="someone")
        row = rt.store.get_plan(plan_id)
        assert row is not None and row.status == "running" and row.lease_owner == holder
        assert not [e for e in rt.store.events(plan_id) if e.kind == "run.refused"]
    finally:
        rt.close()


# -- the lease not renewed in time while a step runs ---------------------------------------------
@tool(effect="irreversible", name="pay")
def pay_once(n: int) -> int:
    """Pay; it waits until the run is told to stop (its lease not renewed in time)."""
    made.append(("pay", n))
    until("the run told to stop", lambda: bool(keepers) and keepers[-1].lost.is_set(), limit=30)
    return n


@tool(effect="irreversible", name="notify")
def notify_once(n: int) -> int:
    made.append(("notify", n))
    return n


keepers: list[Any] = []


def test_an_outcome_that_came_after_the_renewals_gave_up_is_recorded_and_the_step_never_runs_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store out of reach while a step runs: no renewal holds for two thirds of the lease, and the
    run is told to stop starting steps. The step's call then ends, and the store is back: its outcome
    was thrown away with the stop, so the plan, resumed, halted for a person with the step's outcome
    unknown, though the runner knew it. The outcome is recorded (over the step's own started record
    only), no step starts, the run stops, and the resumed run goes on from the next step."""
    from plangate import lifecycle
    from plangate.errors import LeaseLostError, StoreError
    from tests.helpers import plan

    real_enter = lifecycle.LeaseKeeper.__enter__

    def enter(self: lifecycle.LeaseKeeper) -> lifecycle.LeaseKeeper:
        keepers.append(self)
        return real_enter(self)

    monkeypatch.setattr(lifecycle.LeaseKeeper, "__enter__", enter)
    db = f"sqlite:///{tmp_path}/plangate.db"
    rt = Runtime(Catalogue([pay_once, notify_once]), db=db, lease_seconds=0.6)
    try:
        steps = ({"id": 1, "tool": "pay", "params": {"n": 1}}, {"id": 2, "tool": "notify", "params": {"n": 2}})
        record = rt.submit(plan(*steps), "alice")
        rt.approve(record.id, "reviewer", record.hash)

        def unreachable(*_: Any) -> bool:
            raise StoreError("the store cannot be reached")

        monkeypatch.setattr(rt.store, "renew", unreachable)
        with pytest.raises(LeaseLostError, match="lost its lease"):
            rt.execute(record.id)
        assert made == [("pay", 1)], "nothing started after the stop"
        assert rt.store.steps(record.id)[1].status == "succeeded"
        monkeypatch.undo()
        until("the lease ran out", lambda: not lifecycle.lease_is_live(rt.store.get_plan(record.id), rt._now()))
        assert rt.resume(record.id).ok
        assert made == [("pay", 1), ("notify", 2)], "paid once"
        assert rt.store.verify_audit().ok
    finally:
        rt.close()
        made.clear()
        keepers.clear()


@tool(effect="write", compensate="refund")
def charge(n: int) -> dict[str, int]:
    return {"charge": n}


@tool(effect="write", idempotent=True)
def refund(charge: int) -> int:
    """Refund; the first waits until the rollback is told to stop (its lease not renewed in time)."""
    made.append(("refund", charge))
    until("the rollback told to stop", lambda: bool(keepers) and keepers[-1].lost.is_set(), limit=30)
    return charge


@tool(effect="write")
def broken(n: int) -> int:
    raise RuntimeError("no")


def test_a_rollback_whose_renewals_gave_up_starts_no_more_undos(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule a run keeps, kept by a rollback: no renewal held for two thirds of the lease, so no undo
    starts while the lease may run out and another runner carry the rollback on. Before, the rollback went
    on starting undos (each record fenced only by the lease's owner, not its time), so a worker that took
    the rollback over, its lease expired, found an undo in flight: called twice at once, or left for a person."""
    from plangate import lifecycle
    from plangate.errors import LeaseLostError, StoreError
    from tests.helpers import plan

    real_enter = lifecycle.LeaseKeeper.__enter__

    def enter(self: lifecycle.LeaseKeeper) -> lifecycle.LeaseKeeper:
        keepers.append(self)
        return real_enter(self)

    monkeypatch.setattr(lifecycle.LeaseKeeper, "__enter__", enter)
    rt = Runtime(Catalogue([charge, refund, broken]), db=f"sqlite:///{tmp_path}/plangate.db", lease_seconds=0.6)
    try:
        steps = [{"id": n, "tool": "charge", "params": {"n": n}} for n in (1, 2)]
        record = rt.submit(plan(*steps, {"id": 3, "tool": "broken", "params": {"n": 3}}), "bob")
        rt.approve(record.id, "dave", record.hash)
        assert rt.execute(record.id).status == "halted"

        def unreachable(*_: Any) -> bool:
            raise StoreError("the store cannot be reached")

        monkeypatch.setattr(rt.store, "renew", unreachable)
        with pytest.raises(LeaseLostError, match="lost its lease"):
            rt.compensate(record.id, actor="dave", reason="cancelled")
        assert made == [("refund", 2)], "no undo started after the stop"
        assert rt.store.steps(record.id)[-2].status == "succeeded", "the outcome that came is recorded"
        assert rt.store.verify_audit().ok
    finally:
        rt.close()
        made.clear()
        keepers.clear()
