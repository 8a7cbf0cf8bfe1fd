"""A plan's life on one time axis: the trace page's view model, computed from its audit events alone.

Each step is a lane of bars (one per attempt, from ``step.started`` to its outcome; an undo
during a rollback is a bar of its own); what people and the run did (submissions, approvals,
edits, runs, halts, settlements, closings) are markers. A ReAct run has a lane per action
and, beside the axis, its turns in order: thought, action, observation.

The axis is broken where nothing runs. An approval may wait days while a step takes
milliseconds: one linear axis would draw the run as a dot, and a log axis would bend every
bar in it. So each stretch of activity (a run, a resume, a rollback; or, as a point, moments
less than :data:`MERGE` apart with nothing running) keeps its own linear scale, where bars
compare truthfully, and each idle gap between stretches is drawn at one fixed width with its
length written on it.
A stretch's width grows with the logarithm of its length, so a run of milliseconds and a
run of minutes both stay readable side by side.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from plangate._clock import parse_iso
from plangate.record import PlanRecord
from plangate.store import Event
from plangate.story import describe

MERGE = timedelta(seconds=1)
"""Moments outside any run closer than this share one point of the axis (a submission and its check)."""
PLOT = 720.0
"""The width (px) the axis fills at least; a long history scrolls sideways instead of shrinking."""
BREAK = 72.0
"""The width (px) of an idle gap, whatever its length."""
POINT = 30.0
"""The width (px) of a stretch that is one moment."""

PEOPLE, RUN = "people", "run"

# event kind -> (marker class, glyph): the glyph says what the colour says, for those who do not see it
_MARKS = {
    "plan.submitted": ("submit", "+"),
    "plan.planned": ("submit", "P"),
    "plan.checked": ("check", "C"),
    "plan.pending_approval": ("wait", "…"),
    "plan.approved": ("approve", "✓"),
    "plan.rejected": ("reject", "✗"),
    "plan.edited": ("edit", "✎"),
    "plan.closed": ("close", "■"),
    "run.started": ("run", "▶"),
    "run.resumed": ("run", "↻"),
    "run.succeeded": ("approve", "✓"),
    "run.halted": ("reject", "‖"),
    "run.refused": ("reject", "‖"),
    "compensation.started": ("undo", "↶"),
    "compensation.finished": ("undo", "↶"),
    "step.skipped": ("wait", "–"),
    "step.settled": ("settle", "S"),
    "compensation.step_settled": ("settle", "S"),
    "step.retrying": ("retry", "↻"),
    "react.started": ("run", "▶"),
    "react.resumed": ("run", "↻"),
    "react.answered": ("approve", "✓"),
    "react.stopped": ("reject", "‖"),
    "react.approval_needed": ("wait", "…"),
    "react.unparsed": ("reject", "?"),
    "react.refused": ("reject", "✗"),
}
# the events that start and end a stretch in which something runs (the axis keeps its scale there)
_BUSY = {"run.started", "run.resumed", "compensation.started", "react.started", "react.resumed"}
_IDLE = {
    "run.succeeded",
    "run.halted",
    "run.refused",
    "compensation.finished",
    "react.answered",
    "react.stopped",
    "react.approval_needed",
}
_RUN_LANE = _BUSY | _IDLE | {"react.unparsed"}
# how an attempt ended: event kind -> bar state
_ENDS = {
    "step.succeeded": "succeeded",
    "step.failed": "failed",
    "step.failed_optional": "failed_optional",
    "step.outcome_unknown": "outcome_unknown",
    "step.retrying": "retried",
    "compensation.step_succeeded": "undone",
    "compensation.step_failed": "undo_failed",
    "react.observation": "observed",
    "react.approval_needed": "paused",
}
# the events drawn as a bar's start or end only, never as a marker of their own
_BAR_ONLY = (set(_ENDS) - set(_MARKS)) | {
    "step.started",
    "compensation.step_started",
    "react.action",
    "react.tool_calls",
}
STATES = {
    "succeeded": ("✓", "succeeded"),
    "failed": ("✗", "failed"),
    "failed_optional": ("✗", "failed (optional)"),
    "outcome_unknown": ("?", "outcome unknown"),
    "retried": ("↻", "failed, retried"),
    "undone": ("↶", "undone"),
    "undo_failed": ("✗", "undo failed"),
    "observed": ("✓", "observed"),
    "refused": ("✗", "refused"),
    "paused": ("…", "waits for approval"),
    "running": ("▶", "running"),
    "no_outcome": ("?", "no outcome recorded"),
    "skipped": ("–", "skipped"),
    "settled_done": ("✓", "settled: done"),
    "settled_not_done": ("✗", "settled: not done"),
    "waiting": ("·", "did not start"),
}
"""Every state a bar or a lane can be in: a glyph and words, so colour is never the only sign."""


def span(seconds: float) -> str:
    """A duration in the unit a person reads it in: ms, s, min, h or days."""
    ms = seconds * 1000
    if ms < 10:
        return f"{ms:.1f} ms"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    size, unit, small, small_unit = next(
        u for u in ((86_400, "d", 3600, "h"), (3600, "h", 60, "min"), (60, "min", 1, "s")) if whole >= u[0]
    )
    rest = (whole % size) // small
    return f"{whole // size} {unit}" + (f" {rest} {small_unit}" if rest else "")


@dataclass(frozen=True, kw_only=True)
class Bar:
    """One attempt of a step (or an undo, or a ReAct action), from its start to its outcome."""

    lane: str
    start: datetime
    end: datetime
    state: str
    attempt: int = 1
    undo: bool = False
    open: bool = False  # no outcome recorded: it ends where the history ends
    who: str = ""
    text: str = ""

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()

    @property
    def words(self) -> str:
        glyph, words = STATES[self.state]
        what = "undo" if self.undo else f"attempt {self.attempt}"
        return f"{glyph} {what}: {words}, {span(self.seconds)}"


@dataclass(frozen=True, kw_only=True)
class Marker:
    """One moment: who did what, on the lane it concerns."""

    lane: str
    at: datetime
    seq: int
    kind: str
    mark: str
    glyph: str
    who: str
    text: str


@dataclass(frozen=True, kw_only=True)
class Lane:
    key: str
    title: str
    state: str = "waiting"
    attempts: int = 0
    seconds: float = 0.0  # time spent in the tool, all attempts together

    @property
    def words(self) -> str:
        glyph, words = STATES[self.state]
        return f"{glyph} {words}"

    @property
    def caption(self) -> str:
        """The state and the time taken, as the graph and the lane headings show them."""
        if not self.attempts:
            return self.words
        tries = f", {self.attempts} attempts" if self.attempts > 1 else ""
        return f"{self.words} · {span(self.seconds)}{tries}"

    @property
    def short(self) -> str:
        """The caption in a graph's box: attempts as ``×3``."""
        if not self.attempts:
            return self.words
        return f"{self.words} · {span(self.seconds)}" + (f" ×{self.attempts}" if self.attempts > 1 else "")


@dataclass(frozen=True, kw_only=True)
class Stretch:
    """A stretch of the axis drawn to its own linear scale, ``x`` to ``x + width`` px."""

    start: datetime
    end: datetime
    x: float = 0.0
    width: float = POINT

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()


@dataclass(frozen=True, kw_only=True)
class Turn:
    """One line of a ReAct run, in order: a thought, an action, an observation, an answer."""

    number: int
    part: str  # Thought, Action, Observation, Refused, Approval, Answer, Stopped, Unparsed
    text: str
    at: datetime


@dataclass(frozen=True, kw_only=True)
class Timeline:
    start: datetime
    end: datetime
    lanes: tuple[Lane, ...]
    bars: tuple[Bar, ...]
    markers: tuple[Marker, ...]
    stretches: tuple[Stretch, ...]
    turns: tuple[Turn, ...] = ()
    width: float = PLOT

    def x(self, moment: datetime) -> float:
        """Where ``moment`` is drawn: linear inside its stretch, the middle of a gap between two."""
        for before, stretch in zip((None, *self.stretches), self.stretches, strict=False):
            if moment < stretch.start and before is not None:
                return (before.x + before.width + stretch.x) / 2
            if moment <= stretch.end:
                if stretch.seconds == 0 or moment <= stretch.start:
                    return stretch.x + (stretch.width / 2 if stretch.seconds == 0 else 0)
                return stretch.x + stretch.width * (moment - stretch.start).total_seconds() / stretch.seconds
        last = self.stretches[-1]
        return last.x + last.width

    def gaps(self) -> list[tuple[float, float, str]]:
        """Each idle gap: where it starts and ends (px) and how long it was, in words."""
        pairs = itertools.pairwise(self.stretches)
        return [(a.x + a.width, b.x, span((b.start - a.end).total_seconds())) for a, b in pairs]

    def offset(self, moment: datetime) -> str:
        """How long after the first event ``moment`` was."""
        return "+" + span((moment - self.start).total_seconds())


@dataclass
class _Builder:
    record: PlanRecord
    lanes: dict[str, Lane] = field(default_factory=dict)
    open: dict[tuple[str, bool], Bar] = field(default_factory=dict)
    bars: list[Bar] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    last: datetime | None = None
    resumed: datetime | None = None

    def lane(self, key: str, title: str) -> str:
        self.lanes.setdefault(key, Lane(key=key, title=title))
        return key

    def step_lane(self, event: Event) -> str:
        number = event.step_id or 0
        if event.kind.startswith("react."):
            return self.lane(f"action-{number}", f"{number}. {event.data.get('tool') or 'action'}")
        undo = event.kind.startswith("compensation.")  # its tool is the undoing one: the lane keeps the step's
        tool = (None if undo else event.data.get("tool")) or _tool_of(self.record, number)
        return self.lane(f"step-{number}", f"{number}. {tool}")

    def add(self, event: Event) -> None:
        at = parse_iso(event.at)
        at = at if self.last is None or at >= self.last else self.last  # a clock that stepped back keeps order
        self.last = at
        if event.kind in ("run.resumed", "react.resumed", "run.started", "react.started"):
            self.resumed = at
        if event.kind in ("step.started", "compensation.step_started", "react.action"):
            self.begin(event, at)
        if event.kind in _ENDS:
            self.finish(event, at)
        if event.kind.startswith("react."):
            self.turn(event, at)
        if event.kind in ("step.skipped", "step.settled"):
            self.settle(event)
        if event.kind not in _BAR_ONLY:
            self.mark(event, at)

    def begin(self, event: Event, at: datetime) -> None:
        key, undo = self.step_lane(event), event.kind.startswith("compensation.")
        stale = self.open.pop((key, undo), None)
        if stale is not None:  # started again with no outcome between: the first attempt's process died
            self.close(replace(stale, end=at, state="no_outcome"))
        attempt = int(event.data.get("attempt", 1))
        self.open[(key, undo)] = Bar(lane=key, start=at, end=at, state="running", attempt=attempt, undo=undo)

    def finish(self, event: Event, at: datetime) -> None:
        key, undo = self.step_lane(event), event.kind.startswith("compensation.")
        bar = self.open.pop((key, undo), None)
        if bar is None:  # a ReAct action approved while paused runs on resume, with no new action event
            if event.kind != "react.observation" or self.lanes[key].state != "paused":
                return
            bar = Bar(lane=key, start=self.resumed or at, end=at, state="running", attempt=2)
        state = "refused" if event.data.get("refused") else _ENDS[event.kind]
        self.close(replace(bar, end=at, state=state, who=event.actor, text=describe(event)))

    def close(self, bar: Bar) -> None:
        self.bars.append(bar)
        lane = self.lanes[bar.lane]
        if bar.undo:
            self.lanes[bar.lane] = replace(lane, state=bar.state)
            return
        self.lanes[bar.lane] = replace(
            lane, state=bar.state, attempts=lane.attempts + 1, seconds=lane.seconds + bar.seconds
        )

    def settle(self, event: Event) -> None:
        key = self.step_lane(event)
        if event.kind == "step.skipped":
            state = "skipped"
        else:
            state = "settled_done" if event.data.get("done") else "settled_not_done"
        self.lanes[key] = replace(self.lanes[key], state=state)

    def mark(self, event: Event, at: datetime) -> None:
        if event.kind in (
            "step.skipped",
            "step.settled",
            "compensation.step_settled",
            "step.retrying",
            "react.refused",
            "react.approval_needed",
        ):
            lane = self.step_lane(event)
        elif event.kind in _RUN_LANE:
            lane = self.lane(RUN, "the run")
        else:
            lane = self.lane(PEOPLE, "people and the plan")
        mark, glyph = _MARKS.get(event.kind, ("other", "•"))
        if event.kind == "plan.approval":
            mark, glyph = ("approve", "✓") if event.data.get("decision") == "approved" else ("reject", "✗")
        self.markers.append(
            Marker(
                lane=lane,
                at=at,
                seq=event.seq,
                kind=event.kind,
                mark=mark,
                glyph=glyph,
                who=event.actor,
                text=_words(event),
            )
        )

    def turn(self, event: Event, at: datetime) -> None:
        number, data = event.step_id or 0, event.data
        for part, text in _turn_parts(event.kind, data):
            self.turns.append(Turn(number=number, part=part, text=text, at=at))

    def timeline(self) -> Timeline:
        end = self.last
        assert end is not None
        for _, bar in sorted(self.open.items()):
            state = "running" if self.record.status in ("running", "compensating") else "no_outcome"
            self.close(replace(bar, end=end, state=state, open=True))
        self.open.clear()
        return _laid_out(self, end)


_REACT_SAYS: dict[str, Callable[[dict[str, Any], int | None], str]] = {
    "react.started": lambda d, _: (
        f"ReAct run started ({d.get('model')}, {d.get('mode')} protocol): {d.get('question')!r}"
    ),
    "react.resumed": lambda d, _: "ReAct run resumed: the approved action runs now",
    "react.approval_needed": lambda d, step: (
        f"action {step} {d.get('tool')} ({d.get('effect')}) waits for approval by {' and by '.join(d.get('needs', []))}"
    ),
    "react.refused": lambda d, step: (
        f"action {step} REFUSED by the policy: "
        + "; ".join(
            [
                *(str(v.get("rule")) for v in d.get("violations", [])),
                *(f"it needs approval by {n}" for n in d.get("needs", [])),
            ]
        )
    ),
    "react.answered": lambda d, _: f"ANSWERED: {d.get('answer')}",
    "react.stopped": lambda d, _: f"STOPPED: {d.get('reason')}",
    "react.unparsed": lambda d, _: f"the model's turn could not be read: {d.get('problem')}",
}
"""A ReAct run's markers in words (the raw events below keep the audit log's own wording)."""


def _words(event: Event) -> str:
    says = _REACT_SAYS.get(event.kind)
    return says(event.data, event.step_id) if says is not None else describe(event)


_SAID = {
    "react.started": ("Question", "question"),
    "react.unparsed": ("Unparsed", "problem"),
    "react.stopped": ("Stopped", "reason"),
}


def _turn_parts(kind: str, data: dict[str, Any]) -> list[tuple[str, str]]:
    """What one ReAct event adds to the run's story: thought, action, observation, answer."""
    if kind in _SAID:
        part, key = _SAID[kind]
        return [(part, str(data.get(key, "")))]
    if kind == "react.tool_calls":
        text = str(data.get("text", "")).strip()
        return [("Thought", text)] if text else []
    if kind == "react.action":
        thought = [] if data.get("call_id") else [("Thought", str(data.get("thought", "")))]
        return [*thought, ("Action", f"{data.get('tool')} {_args(data.get('arguments'))}")]
    if kind == "react.observation":
        return [("Refused" if data.get("refused") else "Observation", str(data.get("observation", "")))]
    if kind == "react.approval_needed":
        return [("Approval", f"{data.get('tool')} waits for approval by {' and by '.join(data.get('needs', []))}")]
    if kind == "react.answered":
        return [("Thought", str(data.get("thought", ""))), ("Answer", str(data.get("answer", "")))]
    return []


def _args(arguments: Any) -> str:
    return json.dumps(arguments, ensure_ascii=False, sort_keys=True) if arguments is not None else ""


def _tool_of(record: PlanRecord, step_id: int) -> str:
    if record.plan is not None:
        for step in record.plan.steps:
            if step.id == step_id:
                return step.tool
    return "step"


def build(record: PlanRecord, events: Iterable[Event]) -> Timeline | None:
    """The timeline of ``record`` from its events (in their order); None when there are none."""
    builder = _Builder(record)
    builder.lane(PEOPLE, "people and the plan")
    if record.kind != "react":
        builder.lane(RUN, "the run")
        for step in record.plan.steps if record.plan else ():
            builder.lane(f"step-{step.id}", f"{step.id}. {step.tool}")
    for event in events:
        builder.add(event)
    return builder.timeline() if builder.last is not None else None


def _laid_out(builder: _Builder, end: datetime) -> Timeline:
    moments = sorted({m.at for m in builder.markers} | {t for b in builder.bars for t in (b.start, b.end)})
    stretches = _stretches(moments, _busy(builder.markers, end))
    people = any(m.lane == PEOPLE for m in builder.markers)  # a ReAct run that never waited for anyone: no lane
    lanes = sorted((lane for lane in builder.lanes.values() if people or lane.key != PEOPLE), key=_lane_order)
    return Timeline(
        start=moments[0],
        end=end,
        lanes=tuple(lanes),
        bars=tuple(builder.bars),
        markers=tuple(builder.markers),
        stretches=stretches,
        turns=tuple(builder.turns),
        width=stretches[-1].x + stretches[-1].width,
    )


def _lane_order(lane: Lane) -> tuple[int, int]:
    if lane.key in (PEOPLE, RUN):
        return (0 if lane.key == PEOPLE else 1, 0)
    return (2, int(lane.key.rsplit("-", 1)[1]))


def _busy(markers: Sequence[Marker], end: datetime) -> list[tuple[datetime, datetime]]:
    """The stretches in which something ran: from a run's (or resume's, or rollback's) start to its end."""
    out, since = [], None
    for marker in markers:
        if marker.kind in _BUSY and since is None:
            since = marker.at
        elif marker.kind in _IDLE and since is not None:
            out.append((since, marker.at))
            since = None
    if since is not None:
        out.append((since, end))
    return out


def _stretches(moments: Sequence[datetime], busy: Sequence[tuple[datetime, datetime]]) -> tuple[Stretch, ...]:
    """Group the moments into stretches (a gap is kept when something ran across it or it is short),
    then give each a width that grows with the logarithm of its length, and fill :data:`PLOT`."""
    groups: list[list[datetime]] = [[moments[0]]]
    ran: list[bool] = [False]
    for before, after in itertools.pairwise(moments):
        during = any(start <= before and after <= stop for start, stop in busy)
        if during or after - before <= _join(before, after, busy):
            groups[-1].append(after)
            ran[-1] = ran[-1] or during
        else:
            groups.append([after])
            ran.append(False)
    # moments close together with nothing running between them (a submission and its check) stay a point
    natural = [_natural((g[-1] - g[0]).total_seconds()) if r else POINT for g, r in zip(groups, ran, strict=True)]
    fixed = BREAK * (len(groups) - 1) + sum(w for w in natural if w == POINT)
    stretchy = sum(w for w in natural if w != POINT)
    grow = max(1.0, (PLOT - fixed) / stretchy) if stretchy else 1.0
    out, x = [], 0.0
    for group, natural_width in zip(groups, natural, strict=True):
        width = natural_width if natural_width == POINT else natural_width * grow
        out.append(Stretch(start=group[0], end=group[-1], x=x, width=width))
        x += width + BREAK
    return tuple(out)


def _join(before: datetime, after: datetime, busy: Sequence[tuple[datetime, datetime]]) -> timedelta:
    """The longest wait that does not break the axis: :data:`MERGE`, or less next to a run: no longer
    than the run itself, so that a wait beside it never squeezes its bars into a corner."""
    runs = [stop - start for start, stop in busy if start <= before <= stop or start <= after <= stop]
    return min([MERGE, *runs])


def _natural(seconds: float) -> float:
    """A busy stretch's width before filling the plot: more the longer it lasted (logarithmically)."""
    return 60.0 + 48.0 * math.log10(1 + seconds * 1000)
