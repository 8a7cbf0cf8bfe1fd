"""ReAct calls held to the time limit plans keep: a hung tool never holds the run, what a tool gives back is read
within its limit, and a tool that is not idempotent is never called twice."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue, Policy, tool
from plangate._reactstate import unsettled
from plangate.errors import OutcomeUnknownError, StateError
from plangate.models.test import ScriptedModel
from plangate.react import ReActAgent
from plangate.runtime import Runtime
from plangate.store import Store, open_store
from tests.helpers import FixedClock

CALLS: list[str] = []
CAP = 30.0  # a hung call's wait, capped only so that a regression fails instead of hanging the suite


class Hang:
    """What one test's hung calls wait for, and what they set once they return. A call left over from an earlier
    test holds that test's (taken as the call began): its late return sets nothing of a later test's."""

    def __init__(self) -> None:
        self.release, self.returned = threading.Event(), threading.Event()


NOW = [Hang()]


@pytest.fixture(autouse=True)
def released() -> Iterator[None]:
    NOW[0] = Hang()
    CALLS.clear()
    yield
    NOW[0].release.set()  # the threads left behind return now, and must change nothing


def test_a_call_left_over_from_an_earlier_test_sets_nothing_of_this_ones() -> None:
    """The events a hung call answers to are its own test's: before, one module-wide pair was cleared for each test,
    and a call the last test let go at its end could set "returned" in the next (seen once in a full run)."""
    left = threading.Thread(target=_hung, args=("left",))
    left.start()
    until_called = NOW[0]
    NOW[0] = Hang()  # the next test begins
    until_called.release.set()
    left.join(CAP)
    assert until_called.returned.is_set() and not NOW[0].returned.is_set()


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return open_store(f"sqlite:///{tmp_path}/r.db")


def _hung(name: str) -> str:
    hang = NOW[0]  # this test's, taken now
    CALLS.append(name)
    hang.release.wait(CAP)
    hang.returned.set()
    return f"{name} done"


@tool(timeout=0.2)
def lookup(key: str) -> str:
    """A read that hangs."""
    return _hung("lookup")


@tool(timeout=0.2)
async def alookup(key: str) -> str:
    """An async read that hangs (blocking its event loop)."""
    return _hung("alookup")


@tool(effect="write", idempotent=True)
def save(key: str) -> str:
    """An idempotent write that hangs (its limit is the policy's)."""
    return _hung("save")


@tool(effect="write", timeout=0.2)
def pay(to: str) -> str:
    """Not idempotent, and it hangs."""
    return _hung("pay")


@tool(effect="read", idempotent=False, timeout=0.2)
def take(queue: str) -> str:
    """A read that is not safe to repeat (it consumes a message), and it hangs."""
    return _hung("take")


class UnreadableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


class SlowError(Exception):
    def __str__(self) -> str:
        NOW[0].release.wait(CAP)
        return "at last"


@tool(timeout=0.2)
def fails(how: str) -> str:
    """Raises what ``how`` names."""
    CALLS.append(how)
    raised = {"exit": SystemExit(3), "interrupt": KeyboardInterrupt(), "unreadable": UnreadableError()}
    raise raised[how] if how in raised else SlowError()


@tool(effect="write")
def charge(to: str) -> str:
    """Not idempotent: its connection broke mid-call."""
    CALLS.append("charge")
    raise OutcomeUnknownError("the payment service's connection broke")


CAT = Catalogue([lookup, alookup, save, pay, take, fails, charge])
POLICY = Policy.from_data(
    {
        "version": 1,
        "name": "limits",
        "categories": {"react": {"tools": ["lookup", "alookup", "save", "pay", "take", "fails", "charge"]}},
        "approval": {"auto": ["react"]},
        "limits": {"tool_timeout": 0.2},
    }
)


def _run(store: Store, *replies: str, policy: Policy | None = POLICY, clock: FixedClock | None = None) -> Any:
    model = ScriptedModel([*replies, "Final Answer: gave up"])
    return ReActAgent(model, CAT, store, policy=policy, clock=clock or FixedClock()).run("q"), model


def _kinds(store: Store, run_id: str) -> list[str]:
    return [e.kind for e in store.events(run_id)]


@pytest.mark.parametrize("action", ["lookup[x]", "alookup[x]", "save[x]"])
def test_a_hung_call_to_a_tool_safe_to_repeat_is_an_observation_and_the_run_goes_on(store: Store, action: str) -> None:
    """A read, sync or async, or an idempotent write (its limit the policy's ``tool_timeout``): let go at its
    limit, the model reads that it did not answer, and may ask again."""
    result, model = _run(store, f"Action: {action}")
    assert result.status == "answered" and not NOW[0].returned.is_set(), "the run waited for the hung call"
    assert result.steps[0].observation == f"Error: {action[:-3]} did not answer within 0.2 s (its time limit)"
    assert "did not answer within 0.2 s" in model.requests[1].messages[-1].content
    assert _kinds(store, result.run_id) == ["react.started", "react.action", "react.observation", "react.answered"]


@pytest.mark.parametrize(("action", "name"), [('pay {"to": "bob"}', "pay"), ("take[inbox]", "take")])
def test_a_hung_call_to_a_tool_that_is_not_idempotent_stops_the_run_with_its_outcome_unknown(
    store: Store, action: str, name: str
) -> None:
    """It may have acted: the run stops, the action started with no outcome on record, and the model is never
    asked again (it would call the tool again). What the call returns later changes nothing recorded."""
    result, model = _run(store, f"Action: {action}", "Action: lookup[x]")
    assert result.status == "stopped" and len(model.requests) == 1
    assert result.reason == (
        f"action 1 ({name}) started and did not answer within 0.2 s: it may or may not have happened (it may "
        "still run); check before asking again"
    )
    assert store.get_plan(result.run_id).status == "halted"  # type: ignore[union-attr]
    events = list(store.events(result.run_id))
    assert [e.kind for e in events] == ["react.started", "react.action", "react.stopped"]
    assert unsettled(events) == {1: name}
    NOW[0].release.set()
    assert NOW[0].returned.wait(CAP)
    with pytest.raises(StateError, match="halted"):
        ReActAgent(ScriptedModel([]), CAT, store, policy=POLICY, clock=FixedClock()).resume(result.run_id)
    assert [name] == CALLS and list(store.events(result.run_id)) == events


def test_an_approved_action_that_hangs_is_never_called_again_by_a_resume(store: Store) -> None:
    """The approved payment overruns on resume: the run stops, and a second resume (or one that would take
    the run over) finds it halted and calls nothing."""
    clock = FixedClock()
    paused, _ = _run(store, 'Action: pay {"to": "bob"}', policy=None, clock=clock)
    assert paused.status == "paused" and CALLS == []
    Runtime(CAT, None, db=store, clock=FixedClock()).approve(paused.run_id, "ben", paused.pending_hash or "")
    resumed = ReActAgent(ScriptedModel(["Final Answer: paid"]), CAT, store, clock=clock).resume(paused.run_id)
    assert resumed.status == "stopped" and "action 1 (pay) started and did not answer" in (resumed.reason or "")
    for _ in range(2):
        with pytest.raises(StateError, match="halted"):
            ReActAgent(ScriptedModel(["Final Answer: paid"]), CAT, store, clock=clock).resume(paused.run_id)
    NOW[0].release.set()
    assert NOW[0].returned.wait(CAP) and CALLS == ["pay"]


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("exit", "Error: SystemExit: 3"),
        ("interrupt", "Error: KeyboardInterrupt"),
        ("unreadable", "Error: UnreadableError: (its message could not be read: RuntimeError)"),
        ("slow", "Error: fails did not answer within 0.2 s (its time limit)"),
    ],
)
def test_what_a_tool_raises_is_an_observation_read_within_its_limit(store: Store, how: str, said: str) -> None:
    """Not an ``Exception``, a message that cannot be read, or one that hangs as it is read: the model reads
    the failure, and the run goes on to its answer."""
    result, _ = _run(store, f"Action: fails[{how}]")
    assert result.status == "answered" and result.steps[0].observation == said
    assert _kinds(store, result.run_id)[2] == "react.observation"


def test_a_tool_that_is_not_idempotent_whose_outcome_is_unknown_stops_the_run(store: Store) -> None:
    """It says its call may have had its effect: as for an overrun, the model may not call it again."""
    result, model = _run(store, 'Action: charge {"to": "bob"}', 'Action: charge {"to": "ann"}')
    assert result.status == "stopped" and len(model.requests) == 1 and CALLS == ["charge"]
    assert result.reason == (
        "action 1 (charge) started and its outcome is unknown (the payment service's connection broke): it may "
        "or may not have happened; check before asking again"
    )
    assert unsettled(store.events(result.run_id)) == {1: "charge"}


def test_an_async_tool_is_not_run_on_the_runs_thread(store: Store) -> None:
    """The run's thread has no event loop of its own to lend: the coroutine runs to its end elsewhere."""
    seen: list[threading.Thread] = []

    @tool
    async def where() -> str:
        """Which thread runs it."""
        seen.append(threading.current_thread())
        await asyncio.sleep(0)
        return "here"

    model = ScriptedModel(["Action: where {}", "Final Answer: ok"])
    result = ReActAgent(model, Catalogue([where]), store, clock=FixedClock()).run("q")
    assert result.steps[0].observation == "here" and seen != [threading.current_thread()]
