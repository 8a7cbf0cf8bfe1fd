"""The trace page's timeline: real runs recorded by the runtime, laid out on one broken time axis, and the page."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue, tool
from plangate.models.test import ScriptedModel
from plangate.react import ReActAgent
from plangate.runtime import Runtime
from plangate.server import _timeline
from plangate.server._timeline import BREAK, POINT, Timeline, build, span
from plangate.store import Event
from plangate.tools import RunContext
from plangate.tools.basic import search
from tests import serverkit
from tests.helpers import FixedClock, plan
from tests.serverkit import browser

DOWN: dict[str, int] = {}  # tool name -> how many more calls fail


@tool(idempotent=True, retries=1)
def fetch_rates(currency: str, ctx: RunContext) -> str:
    """A read of a service that is down for the calls counted in DOWN."""
    if DOWN.get("fetch_rates", 0) > 0:
        DOWN["fetch_rates"] -= 1
        raise ConnectionError(f"service unavailable (attempt {ctx.attempt})")
    return f"1 {currency} = 1.1 USD"


@tool(effect="write", idempotent=True)
def save_note(text: str) -> str:
    """A write that always works."""
    return "saved"


CAT = Catalogue([fetch_rates, save_note, search])
STEPS = (
    {"id": 1, "tool": "fetch_rates", "params": {"currency": "EUR"}},
    {"id": 2, "tool": "save_note", "params": {"text": "${1}"}},
)


class JumpClock(FixedClock):
    """A millisecond per reading, and a jump when a test says a person took days to answer."""

    def __init__(self) -> None:
        super().__init__()
        self.later = timedelta(0)

    def now(self) -> datetime:
        return super().now() + self.later


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, Any]:
    DOWN.clear()
    return serverkit.setup(tmp_path, CAT, None)


def runtime(setup: dict[str, Any], clock: JumpClock) -> Runtime:
    return Runtime(CAT, None, db=setup["db"], clock=clock)


def lane(timeline: Timeline, key: str) -> _timeline.Lane:
    return next(lane for lane in timeline.lanes if lane.key == key)


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (0.0004, "0.4 ms"),
        (0.012, "12 ms"),
        (1.5, "1.50 s"),
        (42.0, "42.0 s"),
        (60.0, "1 min"),
        (192.0, "3 min 12 s"),
        (7500.0, "2 h 5 min"),
        (3 * 86_400 + 4 * 3600 + 59, "3 d 4 h"),
    ],
)
def test_a_duration_reads_in_the_unit_a_person_would_use(seconds: float, words: str) -> None:
    assert span(seconds) == words


def test_an_approval_that_waited_days_and_a_run_of_milliseconds_share_one_readable_axis(
    setup: dict[str, Any],
) -> None:
    clock = JumpClock()
    rt = runtime(setup, clock)
    DOWN["fetch_rates"] = 1
    submitted = rt.submit(plan(*STEPS), "alice")
    clock.later += timedelta(days=2, hours=3)
    rt.approve(submitted.id, "carol", submitted.hash)
    clock.later += timedelta(hours=1)
    assert rt.execute(submitted.id).ok
    timeline = build(rt.get(submitted.id), rt.trace(submitted.id))
    assert timeline is not None

    assert [lane.key for lane in timeline.lanes] == ["people", "run", "step-1", "step-2"]
    first = lane(timeline, "step-1")
    assert (first.state, first.attempts, first.title) == ("succeeded", 2, "1. fetch_rates")
    bars = [(b.lane, b.attempt, b.state) for b in timeline.bars]
    assert bars == [("step-1", 1, "retried"), ("step-1", 2, "succeeded"), ("step-2", 1, "succeeded")]
    assert "✓ succeeded" in first.caption and "2 attempts" in first.caption
    people = [m.kind for m in timeline.markers if m.lane == "people"]
    assert people == ["plan.submitted", "plan.checked", "plan.pending_approval", "plan.approval", "plan.approved"]
    assert [m.kind for m in timeline.markers if m.lane == "run"] == ["run.started", "run.succeeded"]
    assert [m.kind for m in timeline.markers if m.lane == "step-1"] == ["step.retrying"]

    # three stretches: the submission, the approval (2 d 3 h later), the run (1 h after that)
    assert [g[2] for g in timeline.gaps()] == ["2 d 3 h", "1 h"]
    submission, approval, run = timeline.stretches
    assert submission.width == POINT and approval.width == POINT and run.width > 10 * POINT
    assert approval.x - (submission.x + submission.width) == BREAK
    xs = [timeline.x(m.at) for m in sorted(timeline.markers, key=lambda m: m.seq)]
    assert xs == sorted(xs), "left to right in the order things happened"
    retried, succeeded = timeline.bars[:2]
    assert timeline.x(retried.start) < timeline.x(retried.end) <= timeline.x(succeeded.start)
    assert timeline.offset(timeline.end).startswith("+2 d 4 h")


def test_a_halted_run_with_retries_then_resumed(setup: dict[str, Any]) -> None:
    clock = JumpClock()
    rt = runtime(setup, clock)
    DOWN["fetch_rates"] = 2  # both attempts of the first run fail: it halts
    submitted = rt.submit(plan(*STEPS), "alice")
    rt.approve(submitted.id, "carol", submitted.hash)
    assert rt.execute(submitted.id).status == "halted"
    halted = build(rt.get(submitted.id), rt.trace(submitted.id))
    assert halted is not None
    assert lane(halted, "step-1").state == "failed" and lane(halted, "step-2").state == "waiting"
    assert lane(halted, "step-2").caption == "· did not start"

    clock.later += timedelta(minutes=20)
    assert rt.resume(submitted.id).ok
    timeline = build(rt.get(submitted.id), rt.trace(submitted.id))
    assert timeline is not None
    steps = [(b.attempt, b.state) for b in timeline.bars if b.lane == "step-1"]
    assert steps == [(1, "retried"), (2, "failed"), (3, "succeeded")]
    assert lane(timeline, "step-1").attempts == 3
    run = [m.kind for m in timeline.markers if m.lane == "run"]
    assert run == ["run.started", "run.halted", "run.resumed", "run.succeeded"]
    assert [g[2] for g in timeline.gaps()] == ["20 min"], "the halt's wait is the only idle gap"
    halt = next(m for m in timeline.markers if m.kind == "run.halted")
    assert halt.glyph == "‖" and "HALTED at step 1" in halt.text and halt.who == "engine"


def test_an_edit_between_versions_is_a_marker_with_who_and_what(setup: dict[str, Any]) -> None:
    clock = JumpClock()
    rt = runtime(setup, clock)
    submitted = rt.submit(plan(*STEPS), "alice")
    clock.later += timedelta(hours=5)
    edited = rt.edit(submitted.id, plan(*STEPS, {"id": 3, "tool": "save_note", "params": {"text": "again"}}), "dave")
    clock.later += timedelta(days=1)
    rt.approve(edited.id, "carol", edited.hash)
    assert rt.execute(edited.id).ok
    timeline = build(rt.get(submitted.id), rt.trace(submitted.id))
    assert timeline is not None
    edit = next(m for m in timeline.markers if m.kind == "plan.edited")
    assert (edit.who, edit.mark, edit.glyph, edit.lane) == ("dave", "edit", "✎", "people")
    assert "new version" in edit.text
    assert [lane.key for lane in timeline.lanes][-1] == "step-3", "the step the edit added has its lane"
    assert [g[2] for g in timeline.gaps()] == ["5 h", "1 d"]


def test_a_react_run_tells_each_thought_action_and_observation_in_order(setup: dict[str, Any]) -> None:
    from plangate.store import open_store

    store = open_store(setup["db"])
    model = ScriptedModel(
        ["Thought: I need the refund window.\nAction: search[refund window]", "Thought: I know.\nFinal Answer: 30 days"]
    )
    result = ReActAgent(model, CAT, store, clock=FixedClock(), user="alice", category="ops").run("How long to refund?")
    assert result.status == "answered"
    rt = Runtime(CAT, None, db=store)
    timeline = build(rt.get(result.run_id), rt.trace(result.run_id))
    assert timeline is not None
    parts = [(t.part, t.number) for t in timeline.turns]
    assert parts == [
        ("Question", 0),
        ("Thought", 1),
        ("Action", 1),
        ("Observation", 1),
        ("Thought", 2),
        ("Answer", 2),
    ]
    assert timeline.turns[2].text == 'search {"query": "refund window"}'
    assert [lane.key for lane in timeline.lanes] == ["run", "action-1"], "nobody was asked: no lane for people"
    assert [(b.lane, b.state) for b in timeline.bars] == [("action-1", "observed")]
    started, answered = (m for m in timeline.markers if m.lane == "run")
    assert started.text == "ReAct run started (scripted:test, text protocol): 'How long to refund?'"
    assert answered.text == "ANSWERED: 30 days" and answered.glyph == "✓"

    client, _ = browser(setup, "audrey")
    page = client.get(f"/plans/{result.run_id}/trace").text
    assert 'id="react"' in page and "<b>Action</b>" in page and "30 days" in page
    assert page.index("<b>Thought</b>") < page.index("<b>Action</b>") < page.index("<b>Observation</b>")
    store.close()


def test_a_react_action_that_waited_a_day_for_approval_runs_on_resume(setup: dict[str, Any]) -> None:
    from plangate.store import open_store

    store, clock = open_store(setup["db"]), JumpClock()
    model = ScriptedModel(["Thought: write it down.\nAction: save_note[hello]", "Thought: done.\nFinal Answer: saved"])
    agent = ReActAgent(model, CAT, store, clock=clock, user="alice", category="ops")
    paused = agent.run("Note hello")
    assert paused.status == "paused"
    clock.later += timedelta(days=1)
    Runtime(CAT, None, db=store, clock=clock).approve(paused.run_id, "carol", paused.pending_hash or "")
    assert agent.resume(paused.run_id).status == "answered"
    rt = Runtime(CAT, None, db=store)
    timeline = build(rt.get(paused.run_id), rt.trace(paused.run_id))
    assert timeline is not None
    assert [(b.attempt, b.state) for b in timeline.bars] == [(1, "paused"), (2, "observed")]
    assert lane(timeline, "action-1").state == "observed"
    assert [m.kind for m in timeline.markers if m.lane == "run"] == ["react.started", "react.resumed", "react.answered"]
    assert [m.who for m in timeline.markers if m.kind == "plan.approval"] == ["carol"]
    assert [g[2] for g in timeline.gaps()] == ["1 d"]
    parts = [t.part for t in timeline.turns]
    assert parts == ["Question", "Thought", "Action", "Approval", "Observation", "Thought", "Answer"]
    client, _ = browser(setup, "audrey")
    page = client.get(f"/plans/{paused.run_id}/trace")
    assert page.status_code == 200 and "waiting for approval" in page.text and "save_note (write) waits" in page.text
    store.close()


def test_an_open_attempt_an_undo_and_a_clock_that_stepped_back(setup: dict[str, Any]) -> None:
    clock = JumpClock()
    rt = runtime(setup, clock)
    record = rt.submit(plan(*STEPS), "alice")
    at = ["2026-11-29T09:00:00.000000Z", "2026-11-29T09:00:01.500000Z", "2026-11-29T08:00:00.000000Z"]

    def event(seq: int, kind: str, step: int | None, when: str, **data: Any) -> Event:
        return Event(seq=seq, plan_id=record.id, version=1, step_id=step, kind=kind, actor="engine", at=when, data=data)

    events = [
        event(1, "run.started", None, at[0], steps=2),
        event(2, "step.started", 1, at[0], tool="fetch_rates", attempt=1),
        event(3, "step.succeeded", 1, at[1], output="x", ms=1500.0),
        event(4, "step.started", 2, at[1], tool="save_note", attempt=1),
        event(5, "compensation.started", None, at[2], reason="undo"),  # recorded by a clock an hour behind
        event(6, "compensation.step_started", 1, at[2], tool="void"),
        event(7, "compensation.step_succeeded", 1, at[2], output=None),
    ]
    timeline = build(record, events)
    assert timeline is not None
    undo = next(b for b in timeline.bars if b.undo)
    assert undo.state == "undone" and undo.start == timeline.end, "a clock that stepped back keeps the order"
    still = next(b for b in timeline.bars if b.lane == "step-2")
    assert still.open and still.state == "no_outcome" and still.end == timeline.end
    assert lane(timeline, "step-1").state == "undone" and lane(timeline, "step-1").seconds == 1.5


def test_the_trace_page_draws_the_timeline_and_keeps_the_raw_events(setup: dict[str, Any]) -> None:
    clock = JumpClock()
    rt = runtime(setup, clock)
    DOWN["fetch_rates"] = 1
    submitted = rt.submit(plan(*STEPS), "alice")
    clock.later += timedelta(days=3)
    rt.approve(submitted.id, "carol", submitted.hash)
    assert rt.execute(submitted.id).ok
    client, _ = browser(setup, "audrey")
    page = client.get(f"/plans/{submitted.id}/trace").text
    assert page.count('<g class="bar b-') == 3 and 'class="bar b-retried"' in page
    assert '<g class="gap"><title>nothing ran for 3 d</title>' in page
    assert 'class="node n-succeeded"' in page, "the graph says where each step stands"
    assert re.search(r'class="node-state t-succeeded" [^>]*>✓ succeeded · [0-9.]+ ms ×2</text>', page)
    assert "<title>" in page and "carol: approved" in page, "who did what, on hover and in the table"
    assert '<details id="events">' in page and "run SUCCEEDED" in page, "the raw events stay on the page"
    assert re.search(r"<td>\+3 d( \d+ \w+)?</td><td>carol</td>", page)
    assert "style=" not in page and "<script" not in page, "nothing the CSP would refuse"


def test_the_trace_page_keeps_the_read_scopes(setup: dict[str, Any]) -> None:
    rt = runtime(setup, JumpClock())
    submitted = rt.submit(plan(*STEPS), "alice")
    own, _ = browser(setup, "alice")
    assert own.get(f"/plans/{submitted.id}/trace").status_code == 200
    other, _ = browser(setup, "erin")  # approves maintenance plans only
    refused = other.get(f"/plans/{submitted.id}/trace")
    assert refused.status_code == 403 and "fetch_rates" not in refused.text
