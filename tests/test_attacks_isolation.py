"""Plans a worker runs side by side, against tools that try to reach past their own call: an error or an
output that cannot be read (its ``__str__`` or ``__hash__`` raises, or hangs), context variables left on a
reused thread for the next plan's call, a pool that cannot start a thread, and a tool that changes its
parameters or its output after it returned."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue, RunContext, timeouts, tool
from plangate.results import RunResult
from plangate.runtime import Runtime
from plangate.store import open_store
from plangate.tools import Tool
from plangate.worker import Worker
from tests.helpers import plan, until
from tests.test_attacks_worker import approved, died, drained, serve

__all__ = ["died"]  # a fixture, used by name

made: list[tuple[str, int]] = []
RELEASE = threading.Event()  # what a hanging __str__ or __hash__ waits for; set when each test ends
ARMED = threading.Event()  # set once a tool returned: its output's key then misbehaves


@pytest.fixture(autouse=True)
def released() -> Iterator[None]:
    made.clear()
    RELEASE.clear()
    ARMED.clear()
    yield
    RELEASE.set()


class UnprintableError(Exception):
    """An exception whose message cannot be read."""

    def __str__(self) -> str:
        raise RuntimeError("no message for you")


class StallingError(Exception):
    """An exception whose message takes for ever to read."""

    def __str__(self) -> str:
        RELEASE.wait()
        return "read at last"


class Opaque:
    """An output no JSON can hold."""


class Turncoat(str):
    """A key that hashes as a string until its tool returned, then raises (or hangs, when ``stalls``)."""

    stalls = False

    def __hash__(self) -> int:
        if ARMED.is_set():
            if not self.stalls:
                raise RuntimeError("no hash for you")
            RELEASE.wait()
        return str.__hash__(self)


class Stalled(Turncoat):
    stalls = True


def _counted(ctx: RunContext) -> None:
    made.append((ctx.plan_id, ctx.step_id))


@tool(name="unprintable")
def unprintable(n: int, ctx: RunContext) -> int:
    """Raise what cannot be said."""
    _counted(ctx)
    raise UnprintableError


@tool(name="opaque")
def opaque(n: int, ctx: RunContext) -> Any:
    """Return what cannot be recorded."""
    _counted(ctx)
    return Opaque()


@tool(name="turncoat")
def turncoat(n: int, ctx: RunContext) -> dict:  # type: ignore[type-arg]
    """Return a mapping whose key turns once returned."""
    _counted(ctx)
    returned = {Turncoat("k"): n}
    ARMED.set()  # the key turns once the mapping is made: the tool returns it
    return returned


@tool(name="unprintable_async")
async def unprintable_async(n: int, ctx: RunContext) -> int:
    """Raise what cannot be said, from the event loop."""
    _counted(ctx)
    await asyncio.sleep(0)
    raise UnprintableError


@tool(name="opaque_async")
async def opaque_async(n: int, ctx: RunContext) -> Any:
    """Return what cannot be recorded, from the event loop."""
    _counted(ctx)
    await asyncio.sleep(0)
    return Opaque()


@tool(name="stalling", timeout=0.3)
def stalling(n: int, ctx: RunContext) -> int:
    """Raise what takes for ever to say."""
    _counted(ctx)
    raise StallingError


@tool(name="stalled", timeout=0.3)
def stalled(n: int, ctx: RunContext) -> dict:  # type: ignore[type-arg]
    """Return a mapping whose key takes for ever to hash once returned."""
    _counted(ctx)
    returned = {Stalled("k"): n}
    ARMED.set()
    return returned


@tool
def fine(n: int) -> int:
    """Nothing to it."""
    return n


BAD = [unprintable, opaque, turncoat, unprintable_async, opaque_async, stalling, stalled]
SAYS = {
    "unprintable": "UnprintableError",
    "opaque": "could not be read",
    "turncoat": "could not be read",
    "unprintable_async": "UnprintableError",
    "opaque_async": "could not be read",
    "stalling": "timed out",
    "stalled": "timed out",
}


def run_beside(tmp_path: Path, bad: Tool, steps: list[dict[str, Any]], died: list[str]) -> tuple[str, list[RunResult]]:
    """A plan of ``steps`` and two plans of ``fine`` served by one worker at concurrency 2, until it drains."""
    db = f"sqlite:///{tmp_path}/plangate.db"
    catalogue = Catalogue([bad, fine])
    plan_id = approved(db, catalogue, steps)
    fines = [[{"id": 1, "tool": "fine", "params": {"n": n}, "rationale": "r"}] for n in (1, 2)]
    others = [approved(db, catalogue, body) for body in fines]
    results = drained(catalogue, db, died, made)
    assert sorted(r.plan_id for r in results if r.status == "succeeded") == sorted(others), "the others ran"
    return plan_id, results


@pytest.mark.parametrize("bad", BAD, ids=[t.name for t in BAD])
@pytest.mark.parametrize("beside", [False, True], ids=["alone", "beside-another-step"])
def test_an_error_or_output_that_cannot_be_read_halts_only_its_own_plan(
    tmp_path: Path, bad: Tool, beside: bool, died: list[str]
) -> None:
    """Read on the call's own thread, within its limit: a failure of its step, said, and the plan halts.

    Before, the error's text and the output's JSON were read by the engine after the call: what raised there
    ended the run with the step started and no outcome (the worker set the plan aside, resumed it, and called
    the tool again, or left it for a person as of unknown outcome), and what hung there held the run, its
    lease and a slot of the worker's for ever, beyond any time limit.
    """
    steps = [{"id": 1, "tool": bad.name, "params": {"n": 1}, "rationale": "r"}]
    if beside:
        steps.append({"id": 2, "tool": "fine", "params": {"n": 2}, "rationale": "r"})
    plan_id, results = run_beside(tmp_path, bad, steps, died)
    store = open_store(f"sqlite:///{tmp_path}/plangate.db")
    try:
        row = store.get_plan(plan_id)
        assert row is not None and row.status == "halted" and row.lease_owner is None, row
        assert made == [(plan_id, 1)]
        (ended,) = [r for r in results if r.plan_id == plan_id]
        assert ended.status == "halted" and ended.failed_step == 1
        assert SAYS[bad.name] in (ended.error or ""), ended.error
        events = list(store.events(plan_id))
        assert "run.resumed" not in [e.kind for e in events]
        assert [e.kind for e in events if e.step_id == 1] == ["step.started", "step.failed"]
        assert store.verify_audit().ok
    finally:
        store.close()


# -- context variables: what a call sets, no later call sees ------------------------------------------
KEY: contextvars.ContextVar[str] = contextvars.ContextVar("KEY", default="nobody's")
read: list[tuple[str, str]] = []


@tool(name="keyed")
def keyed(n: int, ctx: RunContext) -> int:
    """Read the key a library keeps in a context variable, then leave this call's own there."""
    read.append((ctx.idempotency_key, KEY.get()))
    KEY.set(ctx.idempotency_key)
    return n


@tool(name="keyed_async")
async def keyed_async(n: int, ctx: RunContext) -> int:
    """The same, from the event loop."""
    return keyed.fn(n=n, ctx=ctx)


def test_a_call_sees_the_context_its_run_began_in_never_what_another_call_left(tmp_path: Path) -> None:
    """Each call runs in a copy of the context its run began in, inline, on a pool thread or on the loop.

    Before, a sync call on a pool thread ran in whatever that thread's context held: not the caller's, but
    the context variables the last call on that thread had set, another plan's idempotency key among them
    (a library that keeps its request's key there sent the next plan's payment under it); and a call made
    inline saw what the step before it had set.
    """
    read.clear()
    rt = Runtime(Catalogue([keyed, keyed_async]), db=f"sqlite:///{tmp_path}/plangate.db")
    side_by_side = [
        {"id": i, "tool": name, "params": {"n": i}} for i, name in enumerate(["keyed"] * 3 + ["keyed_async"], 1)
    ]
    chained = [{"id": 1, "tool": "keyed", "params": {"n": 1}}, {"id": 2, "tool": "keyed", "params": {"n": "${1}"}}]
    token = KEY.set("the caller's")
    try:
        for steps in (side_by_side, side_by_side, chained):
            record = rt.submit(plan(*steps), "alice")
            rt.approve(record.id, "reviewer", record.hash)
            assert rt.execute(record.id).status == "succeeded"
    finally:
        KEY.reset(token)
        rt.close()
    assert len(read) == 10 and {seen for _, seen in read} == {"the caller's"}, read


# -- a pool that cannot start a thread ----------------------------------------------------------------
def test_a_call_no_thread_could_be_started_for_is_never_made_later(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, the call stayed in the pool's queue while its caller was told it failed: the next thread
    started took it and made it, a call nobody waited for or recorded."""
    pool = timeouts.Threads("t")
    calls: list[str] = []
    start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", _refused)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        pool.submit(calls.append, "refused")
    monkeypatch.setattr(threading.Thread, "start", start)
    pool.submit(calls.append, "made").result(timeout=30)
    assert calls == ["made"]
    pool.shutdown()


def _refused(thread: threading.Thread) -> None:
    raise RuntimeError("can't start new thread")


def test_a_step_no_thread_could_be_started_for_fails_as_not_called(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process out of threads: the steps waiting for one fail, saying they were not called, and the
    plan halts with its run recorded (``resume`` calls them once threads can be had). Before, the run
    ended with the error, its steps started and no outcome: a tool that is not idempotent was then left
    for a person as of unknown outcome, though it was never called."""
    monkeypatch.setattr(timeouts, "_SHARED", {})  # pools of their own: no idle thread to take the call
    start = threading.Thread.start

    def refused_for_steps(thread: threading.Thread) -> None:
        (_refused if thread.name.startswith("plangate-step") else start)(thread)

    monkeypatch.setattr(threading.Thread, "start", refused_for_steps)
    rt = Runtime(Catalogue([keyed]), db=f"sqlite:///{tmp_path}/plangate.db")
    try:
        record = rt.submit(plan(*[{"id": i, "tool": "keyed", "params": {"n": i}} for i in (1, 2)]), "alice")
        rt.approve(record.id, "reviewer", record.hash)
        read.clear()
        result = rt.execute(record.id)
        assert result.status == "halted" and "not called" in (result.error or ""), result.error
        assert rt.store.verify_audit().ok
        monkeypatch.setattr(threading.Thread, "start", start)
        assert rt.resume(record.id).status == "succeeded"
        assert sorted(key for key, _ in read) == [f"{record.id}:1", f"{record.id}:2"], "each called once"
    finally:
        rt.close()


# -- what a tool holds on to after it returned --------------------------------------------------------
LENT: dict[str, list[int]] = {}


@tool(name="lends")
def lends(n: int) -> dict[str, list[int]]:
    """Return a mapping it keeps."""
    LENT["items"] = [n]
    return LENT


@tool(name="spoils")
def spoils(items: list[int]) -> list[int]:
    """Change what step 1 returned, after it was recorded, and its own parameters."""
    LENT["items"].append(666)
    items.append(666)
    return [len(items)]


@tool(name="sums")
def sums(first: list[int], again: list[int]) -> list[int]:
    """Read step 1's output again."""
    return first + again


def test_a_tool_that_changes_its_parameters_or_a_returned_output_changes_nothing_recorded(tmp_path: Path) -> None:
    """Not a fault, proven: an output is recorded as the JSON it was read into when the call returned, and a
    call's parameters are validated from JSON into objects of their own, so what a tool changes afterwards is
    its own copy. Step 3 reads step 1's output as the log has it."""
    rt = Runtime(Catalogue([lends, spoils, sums]), db=f"sqlite:///{tmp_path}/plangate.db")
    try:
        record = rt.submit(
            plan(
                {"id": 1, "tool": "lends", "params": {"n": 1}},
                {"id": 2, "tool": "spoils", "params": {"items": "${1.items}"}},
                {"id": 3, "tool": "sums", "params": {"first": "${1.items}", "again": "${1.items}"}, "after": [2]},
            ),
            "alice",
        )
        rt.approve(record.id, "reviewer", record.hash)
        result = rt.execute(record.id)
        assert result.outputs == {1: {"items": [1]}, 2: [2], 3: [1, 1]}, result.outputs
        logged = {(e.kind, e.step_id): e.data for e in rt.store.events(record.id)}
        assert logged["step.succeeded", 1]["output"] == {"items": [1]}
        assert logged["step.started", 2]["params"] == {"items": [1]}
        assert rt.store.verify_audit().ok
    finally:
        rt.close()


# -- an async tool that blocks its run's event loop ---------------------------------------------------
GO = threading.Event()


@tool(name="blocks")
async def blocks(n: int, ctx: RunContext) -> int:
    """Block the event loop (a sync wait inside ``async def``) until the test lets go."""
    _counted(ctx)
    GO.wait(60)
    return n


def test_an_async_tool_blocking_its_loop_keeps_its_lease_and_holds_up_no_other_plan(
    tmp_path: Path, died: list[str]
) -> None:
    """Not a fault, proven: each run has an event loop on a thread of its own and its lease is renewed by a
    timer thread, so a blocked loop holds up its own plan only; the lease (1 s) is renewed while it is blocked,
    the other plans run meanwhile, and the step is called once."""
    GO.clear()
    db = f"sqlite:///{tmp_path}/plangate.db"
    catalogue = Catalogue([blocks, fine])
    plan_id = approved(db, catalogue, [{"id": 1, "tool": "blocks", "params": {"n": 1}, "rationale": "r"}])
    others = [
        approved(db, catalogue, [{"id": 1, "tool": "fine", "params": {"n": n}, "rationale": "r"}]) for n in (1, 2)
    ]
    w = Worker(catalogue, db=db, concurrency=2, drain_timeout=5.0, lease_seconds=1.0)
    results: list[RunResult] = []
    thread = serve(w, results)
    store = open_store(db)
    try:
        until("the other plans ran", lambda: {r.plan_id for r in results} == set(others))
        leases: set[str | None] = set()
        until("the blocked plan's lease was renewed 4 times", lambda: len(_lease_seen(store, plan_id, leases)) > 4)
        GO.set()
        thread.join(30)
        assert not thread.is_alive() and not died, died[:3]
        row = store.get_plan(plan_id)
        assert row is not None and row.status == "succeeded" and made == [(plan_id, 1)]
        assert "run.resumed" not in [e.kind for e in store.events(plan_id)]
    finally:
        GO.set()
        w.stop()
        w.close()
        store.close()


def _lease_seen(store: Any, plan_id: str, seen: set[str | None]) -> set[str | None]:
    row = store.get_plan(plan_id)
    if row is not None and row.status == "running":
        seen.add(row.lease_until)
    return seen


# -- calls that overran and never return --------------------------------------------------------------
@tool(name="hangs", effect="write", timeout=0.1)
def hangs(n: int, ctx: RunContext) -> int:
    """Send, then hang until the test lets go (at once, once it has)."""
    _counted(ctx)
    RELEASE.wait()
    return n


def test_a_tool_whose_calls_never_return_holds_a_bounded_number_of_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread cannot be stopped: each call that overran keeps one until it returns. Past the bound, the
    tool's next call is not made (its step fails, saying why) until some return, and other tools go on.

    Before, every call was made on a new thread: a tool that never returns, called by plan after plan in a
    worker, took a thread each time without end, until the process could start none (for any plan).
    """
    monkeypatch.setattr(timeouts, "OVERDUE", timeouts.Overdue(most=2))
    rt = Runtime(Catalogue([hangs, fine]), db=f"sqlite:///{tmp_path}/plangate.db")

    def run(*steps: dict[str, Any]) -> RunResult:
        record = rt.submit(plan(*steps), "alice")
        rt.approve(record.id, "reviewer", record.hash)
        return rt.execute(record.id)

    try:
        for n in (1, 2):  # each halts as of unknown outcome, its call left running
            overran = run({"id": 1, "tool": "hangs", "params": {"n": n}})
            assert overran.status == "halted" and "timed out" in (overran.error or "")
        assert len(made) == 2
        held = run({"id": 1, "tool": "hangs", "params": {"n": 3}})
        assert held.status == "halted" and len(made) == 2, "not called"
        assert "not called: 2 calls of 'hangs' overran their limit" in (held.error or ""), held.error
        assert run({"id": 1, "tool": "fine", "params": {"n": 4}}).status == "succeeded", "other tools go on"
        RELEASE.set()
        until("the calls that overran returned", lambda: not timeouts.OVERDUE.overdue("hangs"))
        assert run({"id": 1, "tool": "hangs", "params": {"n": 5}}).status == "succeeded"
        assert rt.store.verify_audit().ok
    finally:
        rt.close()
