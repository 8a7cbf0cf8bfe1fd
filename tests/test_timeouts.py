"""Time limits and retries: a hung tool never holds a run, and only an idempotent tool is called twice."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue, Policy, timeouts, tool
from plangate.engine import Engine
from plangate.errors import PolicyError, ToolDefinitionError
from plangate.runtime import Runtime
from plangate.timeouts import DEFAULT_TIMEOUT, Backoff, Threads, call_limit, retries
from plangate.tools import RunContext, Tool
from tests.helpers import FixedClock, plan

RELEASE = threading.Event()  # what every hung call waits for; set when each test ends
RETURNED = threading.Event()  # set when send's hung call returned at last
CALLS: list[tuple[str, int, str]] = []  # (tool, attempt, idempotency key)


@pytest.fixture(autouse=True)
def released() -> Iterator[None]:
    RELEASE.clear()
    RETURNED.clear()
    CALLS.clear()
    yield
    RELEASE.set()  # the threads left behind return now, and must change nothing


@tool(effect="write", timeout=0.2)
def send(to: str) -> str:
    """Not idempotent, and it hangs."""
    CALLS.append(("send", 1, to))
    RELEASE.wait()
    RETURNED.set()
    return f"sent to {to}"


@tool(effect="read", idempotent=False, timeout=0.2)
def peek(key: str) -> str:
    """A read that is not safe to repeat (it consumes a message), and it hangs."""
    RELEASE.wait()
    return key


@tool(effect="write", idempotent=True, timeout=0.2, retries=2)
def upsert(key: str, ctx: RunContext) -> str:
    """Idempotent: the first attempt hangs, the second answers."""
    CALLS.append(("upsert", ctx.attempt, ctx.idempotency_key))
    if ctx.attempt == 1:
        RELEASE.wait()
    return f"saved {key}"


@tool(effect="write", idempotent=True, timeout=0.2, retries=1)
def stuck(key: str, ctx: RunContext) -> str:
    """Idempotent, and it always hangs."""
    CALLS.append(("stuck", ctx.attempt, ctx.idempotency_key))
    RELEASE.wait()
    return key


@tool(idempotent=True, retries=2)
def flaky(key: str, ctx: RunContext) -> str:
    """Fails once, as a service that is briefly down does."""
    CALLS.append(("flaky", ctx.attempt, ctx.idempotency_key))
    if ctx.attempt == 1:
        raise ConnectionError("service unavailable")
    return key


@tool(retries=2)
def wrong(key: str) -> int:
    """Answers with the wrong type: that is not retried."""
    CALLS.append(("wrong", 1, key))
    return key  # type: ignore[return-value]


@tool(effect="write", timeout=0.2)
async def send_async(to: str) -> str:
    await asyncio.sleep(3600)
    return to


@tool(effect="write", timeout=0.2)
async def stubborn(to: str) -> str:
    """Ignores its cancellation until the test ends."""
    while not RELEASE.is_set():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.05)
    return to


@tool(effect="write")
def plain(to: str) -> str:
    """Declares no timeout: the policy's default applies."""
    RELEASE.wait()
    return to


@tool
def fetch(key: str) -> str:
    CALLS.append(("fetch", 1, key))
    return key


CAT = Catalogue([send, peek, upsert, stuck, flaky, wrong, send_async, stubborn, plain, fetch])


def runtime(tmp_path: Path, policy: Policy | None = None, catalogue: Catalogue = CAT) -> Runtime:
    return Runtime(catalogue, policy, db=f"sqlite:///{tmp_path}/t.db", clock=FixedClock())


def approved(rt: Runtime, *steps: dict[str, Any]) -> str:
    record = rt.submit(plan(*steps), "ann")
    assert record.status == "pending_approval", record.violations
    return rt.approve(record.id, "ben", record.hash).id


def events(rt: Runtime, plan_id: str, kind: str) -> list[dict[str, Any]]:
    return [e.data for e in rt.trace(plan_id) if e.kind == kind]


def test_a_hung_call_to_a_tool_that_is_not_idempotent_halts_as_outcome_unknown(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    plan_id = approved(rt, {"id": 1, "tool": "send", "params": {"to": "ann"}})
    began = time.monotonic()
    result = rt.execute(plan_id)
    assert time.monotonic() - began < 5, "the run returns; the thread left in the call does not hold it"
    assert not RELEASE.is_set(), "the call is still hanging"
    assert result.status == "halted" and result.failed_step == 1
    assert (result.error or "").startswith("outcome unknown: the call timed out after 0.2 s and may have happened")
    assert "settle" in (result.next_step or "")
    row = rt.store.steps(plan_id)[1]
    assert row.status == "outcome_unknown" and row.attempt == 1
    assert rt.get(plan_id).status == "halted"
    assert [e["error"] for e in events(rt, plan_id, "step.outcome_unknown")] == [result.error]

    RELEASE.set()  # the call returns now, to a run that went on without it: nothing may change
    assert RETURNED.wait(timeout=5)
    time.sleep(0.1)
    assert rt.store.steps(plan_id)[1].status == "outcome_unknown"
    assert rt.store.verify_audit().ok

    rt.settle(plan_id, 1, done=True, actor="ben", output="sent to ann", note="it is in the outbox")
    again = rt.resume(plan_id)
    assert again.ok and again.outputs == {1: "sent to ann"}
    assert CALLS == [("send", 1, "ann")], "settled as done: never called again"


def test_settled_as_not_done_after_a_timeout_runs_again(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    plan_id = approved(rt, {"id": 1, "tool": "send", "params": {"to": "ann"}})
    assert not rt.execute(plan_id).ok
    rt.settle(plan_id, 1, done=False, actor="ben", note="nothing arrived")
    RELEASE.set()
    assert rt.resume(plan_id).ok
    assert rt.store.steps(plan_id)[1].attempt == 2


def test_a_hung_call_among_others_halts_and_the_others_finish(tmp_path: Path) -> None:
    """Two reads start together (the thread-pool path): the hung one is unknown, the other is recorded."""
    rt = runtime(tmp_path)
    plan_id = approved(
        rt, {"id": 1, "tool": "peek", "params": {"key": "a"}}, {"id": 2, "tool": "fetch", "params": {"key": "b"}}
    )
    began = time.monotonic()
    result = rt.execute(plan_id)
    assert time.monotonic() - began < 5
    assert result.failed_step == 1 and (result.error or "").startswith("outcome unknown: the call timed out")
    rows = rt.store.steps(plan_id)
    assert rows[1].status == "outcome_unknown" and rows[2].status == "succeeded"


@pytest.mark.parametrize("name", ["send_async", "stubborn"])
def test_an_async_call_that_hangs_halts_as_outcome_unknown(tmp_path: Path, name: str) -> None:
    rt = runtime(tmp_path)
    plan_id = approved(rt, {"id": 1, "tool": name, "params": {"to": "ann"}})
    began = time.monotonic()
    result = rt.execute(plan_id)
    assert time.monotonic() - began < 5, "even a call that ignores its cancellation does not hold the run"
    assert (result.error or "").startswith("outcome unknown: the call timed out after 0.2 s")


def test_an_idempotent_tool_is_called_again_under_the_same_key(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    plan_id = approved(rt, {"id": 1, "tool": "upsert", "params": {"key": "k"}})
    result = rt.execute(plan_id)
    assert result.ok and result.outputs == {1: "saved k"}
    key = f"{plan_id}:1"
    assert [("upsert", 1, key), ("upsert", 2, key)] == CALLS
    retrying = events(rt, plan_id, "step.retrying")
    assert [(r["attempt"], r["delay"]) for r in retrying] == [(2, Backoff().delay(key, 2))]
    assert "timed out" in retrying[0]["reason"] and key in retrying[0]["reason"]
    started = events(rt, plan_id, "step.started")
    assert [(s["attempt"], s["idempotency_key"]) for s in started] == [(1, key), (2, key)]
    row = rt.store.steps(plan_id)[1]
    assert row.status == "succeeded" and row.attempt == 2
    assert rt.store.verify_audit().ok


def test_an_idempotent_tool_out_of_retries_fails(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    plan_id = approved(rt, {"id": 1, "tool": "stuck", "params": {"key": "k"}})
    result = rt.execute(plan_id)
    assert result.status == "halted" and result.error == "timed out: the call took longer than its limit of 0.2 s"
    assert rt.store.steps(plan_id)[1].status == "failed", "idempotent: a failure, not an unknown outcome"
    assert [c[1] for c in CALLS] == [1, 2]
    assert "resume" in (result.next_step or "")


def test_a_failure_is_retried_but_a_wrong_output_is_not(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    flaky_id = approved(rt, {"id": 1, "tool": "flaky", "params": {"key": "k"}})
    assert rt.execute(flaky_id).ok
    assert [c[1] for c in CALLS] == [1, 2]
    assert "ConnectionError: service unavailable" in events(rt, flaky_id, "step.retrying")[0]["reason"]
    CALLS.clear()
    wrong_id = approved(rt, {"id": 1, "tool": "wrong", "params": {"key": "k"}})
    result = rt.execute(wrong_id)
    assert "does not match 'wrong''s declared type" in (result.error or "")
    assert len(CALLS) == 1 and not events(rt, wrong_id, "step.retrying"), "the same answer would come again"


def test_a_retry_waits_without_holding_other_steps(tmp_path: Path) -> None:
    rt = runtime(tmp_path)
    plan_id = approved(
        rt, {"id": 1, "tool": "flaky", "params": {"key": "k"}}, {"id": 2, "tool": "fetch", "params": {"key": "b"}}
    )
    assert rt.execute(plan_id).ok
    kinds = [(e.kind, e.step_id) for e in rt.trace(plan_id) if e.kind.startswith("step.")]
    assert kinds.index(("step.succeeded", 2)) < kinds.index(("step.started", 1), 1), "step 2 ran during the wait"


def test_the_policy_default_timeout_applies(tmp_path: Path) -> None:
    policy = Policy.from_data({"version": 1, "name": "p", "limits": {"tool_timeout": 0.2}})
    rt = runtime(tmp_path, policy)
    plan_id = approved(rt, {"id": 1, "tool": "plain", "params": {"to": "ann"}})
    began = time.monotonic()
    result = rt.execute(plan_id)
    assert time.monotonic() - began < 5
    assert (result.error or "").startswith("outcome unknown: the call timed out after 0.2 s")


def test_limits_and_their_ceilings() -> None:
    assert call_limit(plain, None) == DEFAULT_TIMEOUT == 300
    assert call_limit(send, None) == 0.2
    policy = Policy.from_data(
        {"version": 1, "name": "p", "limits": {"tool_timeout": 30, "max_tool_timeout": 60, "max_retries": 1}}
    )
    assert call_limit(plain, policy) == 30 and call_limit(send, policy) == 0.2
    slow = replace(plain, timeout=600)
    assert call_limit(slow, policy) == 60, "over the ceiling: cut at run time too"
    assert retries(upsert, policy) == 1 and retries(upsert, None) == 2
    ceiling_only = Policy.from_data({"version": 1, "name": "p", "limits": {"max_tool_timeout": 10}})
    assert call_limit(plain, ceiling_only) == 10
    with pytest.raises(PolicyError, match="tool_timeout 90 is over max_tool_timeout 60"):
        Policy.from_data({"version": 1, "name": "p", "limits": {"tool_timeout": 90, "max_tool_timeout": 60}})
    for bad in ({"tool_timeout": 0}, {"max_tool_timeout": -1}, {"max_retries": -1}, {"tool_timeout": ".inf"}):
        with pytest.raises(PolicyError):
            Policy.from_data({"version": 1, "name": "p", "limits": bad})


def test_a_tool_over_the_ceilings_is_refused_before_approval(tmp_path: Path) -> None:
    @tool(effect="write", idempotent=True, timeout=600, retries=3)
    def export(key: str) -> str:
        return key

    policy = Policy.from_data({"version": 1, "name": "p", "limits": {"max_tool_timeout": 300, "max_retries": 2}})
    rt = runtime(tmp_path, policy, Catalogue([export]))
    record = rt.submit(plan({"id": 1, "tool": "export", "params": {"key": "k"}}), "ann")
    assert record.status == "rejected"
    assert [(v.rule, v.step) for v in record.violations] == [("tool-timeout", 1), ("tool-retries", 1)]
    assert "declares a timeout of 600 s; the policy's max_tool_timeout is 300 s" in str(record.violations[0])


def test_retries_need_an_idempotent_tool() -> None:
    def charge(amount: int) -> str:
        return "ok"

    with pytest.raises(ToolDefinitionError, match="retries=2 needs an idempotent tool"):
        tool(charge, effect="write", retries=2)
    with pytest.raises(ToolDefinitionError, match="retries=1 needs an idempotent tool"):
        tool(charge, effect="read", idempotent=False, retries=1)
    with pytest.raises(ToolDefinitionError, match="needs an idempotent tool"):
        replace(upsert, idempotent=False)
    assert tool(charge, effect="write", idempotent=True, retries=2).retries == 2
    for bad in (0, -1, True, "5", float("inf"), float("nan")):
        with pytest.raises(ToolDefinitionError, match="timeout is a number of seconds above 0"):
            tool(charge, timeout=bad)
    for bad_retries in (-1, 1.5, True):
        with pytest.raises(ToolDefinitionError, match="retries is a whole number"):
            tool(charge, retries=bad_retries)


def test_timeout_and_retries_are_part_of_the_tool_as_data() -> None:
    assert "timeout" not in fetch.describe() and "retries" not in fetch.describe(), "fingerprints stay as they were"
    assert upsert.describe()["timeout"] == 0.2 and upsert.describe()["retries"] == 2
    assert replace(upsert, timeout=5).fingerprint != upsert.fingerprint


def test_backoff_is_exponential_capped_and_the_same_every_time() -> None:
    backoff = Backoff(first=1, cap=5)
    delays = [backoff.delay("p:1", n) for n in range(2, 8)]
    assert delays == [backoff.delay("p:1", n) for n in range(2, 8)], "no chance involved"
    for n, delay in zip(range(2, 8), delays, strict=True):
        full = min(5, 2 ** (n - 2))
        assert full / 2 <= delay <= full
    assert backoff.delay("p:1", 2) != backoff.delay("p:2", 2), "steps that failed together do not retry together"


def test_threads_never_wait_for_a_call_that_does_not_return() -> None:
    threads = Threads("t")
    hung = threads.submit(RELEASE.wait)
    assert threads.submit(lambda: 42).result(timeout=5) == 42, "a new thread takes the next call"
    began = time.monotonic()
    threads.shutdown(wait=True)
    assert time.monotonic() - began < 1 and not hung.done()
    with pytest.raises(RuntimeError):
        threads.submit(lambda: 1)


def test_one_step_at_a_time_honours_limits_and_retries(tmp_path: Path) -> None:
    """What a Temporal activity runs: the call waits up to its limit on a thread of its own, retries inside."""
    rt = runtime(tmp_path)
    record = rt.submit(
        plan({"id": 1, "tool": "upsert", "params": {"key": "k"}}, {"id": 2, "tool": "send", "params": {"to": "x"}}),
        "ann",
    )
    rt.approve(record.id, "ben", record.hash)
    claim = rt.start(record.id, actor="temporal")
    engine = Engine(
        store=rt.store,
        catalogue=rt.catalogue,  # type: ignore[arg-type]
        clock=rt.clock,
        owner=claim.owner,
        backoff=Backoff(first=0.01),
    )
    began = time.monotonic()
    assert engine.stepper(record.id, 1, record.plan).one(1) == "succeeded"  # type: ignore[arg-type]
    assert [c[1] for c in CALLS] == [1, 2]
    assert engine.stepper(record.id, 1, record.plan).one(2) == "outcome_unknown"  # type: ignore[arg-type]
    assert time.monotonic() - began < 5
    result = engine.stepper(record.id, 1, record.plan).finish()  # type: ignore[arg-type]
    assert result.failed_step == 2 and (result.error or "").startswith("outcome unknown: the call timed out")


@tool(timeout=0.2)
def slow_lookup(key: str) -> str:
    """A read (idempotent by default) that hangs."""
    RELEASE.wait()
    return key


def test_an_optional_lookup_that_overruns_gives_null_and_the_plan_goes_on(tmp_path: Path) -> None:
    rt = runtime(tmp_path, catalogue=Catalogue([slow_lookup, fetch]))
    plan_id = approved(
        rt,
        {"id": 1, "tool": "slow_lookup", "params": {"key": "k"}, "on_failure": "continue"},
        {"id": 2, "tool": "fetch", "params": {"key": "fallback"}, "condition": "${1} == null"},
    )
    result = rt.execute(plan_id)
    assert result.ok and result.failed_optional == (1,) and result.outputs[2] == "fallback"
    assert rt.store.steps(plan_id)[1].error == "timed out: the call took longer than its limit of 0.2 s"


@tool(idempotent=True, retries=2)
def always_down(key: str) -> str:
    """Idempotent, and its service is down for good."""
    raise ConnectionError("service unavailable")


@tool
def refuses(key: str) -> str:
    """A read that fails at once."""
    raise LookupError(f"no {key}")


def test_a_halt_ends_a_retrys_wait_at_once(tmp_path: Path) -> None:
    """A retry waiting out its backoff when another step halts the run: the run ends now, not after the wait."""
    rt = runtime(tmp_path, catalogue=Catalogue([always_down, refuses]))
    plan_id = approved(
        rt,
        {"id": 1, "tool": "always_down", "params": {"key": "a"}},
        {"id": 2, "tool": "refuses", "params": {"key": "b"}},
    )
    claim = rt.start(plan_id, actor="ops")
    engine = Engine(
        store=rt.store, catalogue=rt.catalogue, clock=FixedClock(), owner=claim.owner, backoff=Backoff(first=60, cap=60)
    )
    began = time.monotonic()
    result = engine.run(plan_id, 1, claim.body)
    assert time.monotonic() - began < 20, "the backoff of 30 s or more was not waited out"
    assert result.status == "halted"
    rows = rt.store.steps(plan_id)
    assert rows[1].status == "failed" and rows[1].attempt == 1, "no attempt after the halt"
    assert rows[2].status == "failed"


@pytest.mark.parametrize("first", [0.5, 0.0, 1e-300])
def test_a_steps_budget_is_its_calls_and_the_waits_between_them_however_many_retries(first: float) -> None:
    """The budget a Temporal step is given: each call's limit and the backoff before each call again. A tool may
    declare any number of retries; its budget was summed one retry at a time, so a billion stalled the worker."""

    def declared(retries: int) -> Tool:
        return tool(idempotent=True, retries=retries, timeout=2.0)(_echo)

    backoff = timeouts.Backoff(first=first, cap=30.0)
    for again in (0, 1, 2, 5, 7, 70, 200):
        waits = sum(timeouts.doubled((first, 30.0), n - 1) for n in range(2, again + 2))
        assert timeouts.budget(declared(again), None, backoff) == pytest.approx(2.0 * (again + 1) + waits)
    huge = 10**12
    assert timeouts.budget(declared(huge), None, backoff) == pytest.approx(
        2.0 * (huge + 1)
        + sum(timeouts.doubled((first, 30.0), n) for n in range(1, 66))
        + (huge - 65) * min(first * 2.0**64, 30.0)
    )


def _echo(text: str) -> str:
    return text
