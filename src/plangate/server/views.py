"""What the dashboard shows, computed from records: rows, summaries, the dependency graph."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from html import escape
from typing import Any

from plangate import review
from plangate.accounts import User
from plangate.answer import shown
from plangate.graph import PlanGraph, run_deps
from plangate.plan import Plan
from plangate.record import PlanRecord
from plangate.rundiff import RunDiff
from plangate.runtime import Runtime
from plangate.server import _actions, _timeline, _timelinesvg
from plangate.store import PlanQuery, Store
from plangate.story import tell
from plangate.tools import Catalogue, Tool

_RISK = {"read": 0, "write": 1, "irreversible": 2}


def risk(plan: Plan | None, catalogue: Catalogue) -> str:
    effects = [t.effect for t in (catalogue.get(s.tool) for s in (plan.steps if plan else ())) if t is not None]
    return max(effects, key=lambda e: _RISK[e], default="read")


PAGE = 100
"""The plans a page of the dashboard's listings shows."""
SCAN = 500
"""The plans a page reads at most to find those of one risk level."""


def queue(
    rt: Runtime, catalogue: Catalogue, query: PlanQuery, level: str, *, reader: User
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of the plans (not ReAct runs) ``reader`` may see that ``query`` selects, each with its risk,
    and of risk ``level`` if given; and the plan the next page goes on from (None: this is the last).

    The store counts only what ``reader`` may see and ``query`` asks for; a risk is worked out from a
    plan's steps, so a page reads at most :data:`SCAN` plans looking for those of ``level``.
    """
    fetch = SCAN if level else PAGE + 1
    rows = _actions.listing(rt, reader, replace(query, kind="plan"), fetch)
    page: list[dict[str, Any]] = []
    last = None
    for row in rows:
        if len(page) == PAGE:  # more follow
            return page, last
        rating, last = risk(rt.get(row.id).plan, catalogue), row.id
        if not level or rating == level:
            page.append({**row.__dict__, "risk": rating})
    return page, last if len(rows) == fetch else None


def steps(record: PlanRecord, catalogue: Catalogue) -> list[dict[str, Any]]:
    return review.steps(record, catalogue)


def answer(store: Store, record: PlanRecord, catalogue: Catalogue) -> dict[str, Any] | None:
    """The plan's answer for its page: as written, what it reads, and once run, what it said (None: it has none)."""
    if record.plan is None or record.plan.answer is None:
        return None
    found = review.answer_of(record, catalogue, store.events(record.id))
    return {**found, "text": shown(found["text"], lines=True)}  # the API keeps the text as written


def touch(record: PlanRecord, catalogue: Catalogue) -> list[str]:
    """A dry-run summary: what the plan would do, by kind of effect, without running anything."""
    if record.plan is None:
        return []
    tools = [(s, catalogue.get(s.tool)) for s in record.plan.steps]
    effects: Counter[str] = Counter(_kind(t) for _, t in tools if t is not None)
    lasting = sorted({t.name for _, t in tools if t is not None and _kind(t) == "write-kept"})
    lines = [
        f"{effects[kind]} step(s) that {words}"
        for kind, words in (
            ("read", "only read"),
            ("write", "change something that can be undone (a compensating tool undoes it on rollback)"),
            ("write-kept", "change something that nothing undoes (no compensating tool)"),
            ("irreversible", "cannot be undone"),
        )
    ]
    if lasting:
        lines[2] += ": " + ", ".join(lasting)
    external = [s.tool for s, t in tools if t is not None and t.external]
    lines.append(f"{len(external)} call(s) outside the company" + (f": {', '.join(external)}" if external else ""))
    resources = sorted({r for s, t in tools if t is not None and (r := t.resource_for(s.params))})
    if resources:
        lines.append("resources: " + ", ".join(resources))
    scopes = sorted({scope for _, t in tools if t is not None for scope in t.scopes})
    if scopes:
        lines.append("scopes needed: " + ", ".join(scopes))
    return lines


def _kind(tool: Tool) -> str:
    """A write counts as undoable only with a compensating tool, the one a rollback would call."""
    return "write-kept" if tool.effect == "write" and tool.compensate is None else tool.effect


def graph_svg(record: PlanRecord, catalogue: Catalogue, states: Mapping[int, tuple[str, str]] | None = None) -> str:
    """The order steps run in, as an inline SVG: one column per depth; solid arrows carry data from
    a step to the steps that read it, dotted ones are a step's ``after``, dashed ones the plan's
    listed order around effects. With ``states`` (step id: a state and its words), each box also
    says where its step stands, in words and in the colour of its state's class."""
    if record.plan is None:
        return ""
    graph = PlanGraph.of(record.plan)
    run = run_deps(record.plan, lambda name: catalogue[name].effect if name in catalogue else None)
    depth: dict[int, int] = {}
    for step_id in graph.order:
        depth[step_id] = 1 + max((depth[d] for d in run[step_id]), default=-1)
    columns: dict[int, list[int]] = {}
    for step_id in graph.order:
        columns.setdefault(depth[step_id], []).append(step_id)
    box_w, box_h, gap_x, gap_y = 170, 44 if states is None else 58, 60, 18
    where = {
        sid: (20 + col * (box_w + gap_x), 20 + row * (box_h + gap_y))
        for col, ids in columns.items()
        for row, sid in enumerate(ids)
    }
    width = 40 + len(columns) * (box_w + gap_x)
    height = 40 + max(len(ids) for ids in columns.values()) * (box_h + gap_y)
    tools = {s.id: s.tool for s in record.plan.steps}
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="the order steps run in"><defs><marker id="arrow" markerWidth="8" markerHeight="8" refX="8" '
        f'refY="4" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#5b6577"/></marker></defs>'
    ]
    for step_id, waits in run.items():
        x2, y2 = where[step_id]
        for dep in sorted(waits):
            x1, y1 = where[dep]
            parts.append(
                f'<line x1="{x1 + box_w}" y1="{y1 + box_h / 2}" x2="{x2}" y2="{y2 + box_h / 2}" '
                f'stroke="#5b6577" marker-end="url(#arrow)"{_EDGE[_why_waits(record.plan, graph, step_id, dep)]}/>'
            )
    for step_id, (x, y) in where.items():
        state, words = (states or {}).get(step_id, ("", ""))
        parts.append(
            f'<rect x="{x}" y="{y}" width="{box_w}" height="{box_h}" rx="6" fill="#fff" stroke="#2f5bd3"'
            + (f' class="node n-{state}"/>' if states is not None else "/>")
            + f'<text x="{x + 10}" y="{y + (22 if states else 27)}" font-size="13" font-family="system-ui">'
            f"{step_id}. {escape(tools[step_id][:18])}</text>"
        )
        if states is not None:
            parts.append(f'<text class="node-state t-{state}" x="{x + 10}" y="{y + 42}">{escape(words[:28])}</text>')
    parts.append("</svg>")
    return "".join(parts)


_EDGE = {
    "data": ' class="data-edge"',
    "after": ' stroke-dasharray="2 3" class="after-edge"',
    "listed": ' stroke-dasharray="5 4" class="order-edge"',
}


def _why_waits(plan: Plan, graph: PlanGraph, step_id: int, dep: int) -> str:
    """Why a step waits for another: it reads its output, its ``after`` names it, or the listed order."""
    if dep in graph.deps[step_id]:
        return "data"
    return "after" if dep in plan.step(step_id).after else "listed"


def pretty(record: PlanRecord) -> str:
    return pretty_plan(record.plan) if record.plan else ""


def pretty_plan(plan: Plan) -> str:
    body = plan.data()
    return json.dumps(body, indent=2, ensure_ascii=False)


def unsettled_undos(rt: Runtime, record: PlanRecord, catalogue: Catalogue) -> list[dict[str, Any]]:
    """A rollback's calls cut off with no outcome: each the undo of a step, for a person to settle."""
    if record.plan is None or record.status not in ("halted", "compensation_incomplete"):
        return []
    found = []
    for step_id, row in sorted(rt.store.steps(record.id).items(), reverse=True):
        if step_id < 0 and row.status in ("started", "outcome_unknown"):
            tool = catalogue.get(record.plan.step(-step_id).tool)
            found.append({"id": step_id, "of": -step_id, "tool": tool.compensate if tool else None})
    return found


def progress(rt: Runtime, record: PlanRecord) -> dict[str, Any]:
    steps = review.progress(record, rt.store.steps(record.id), rt.trace(record.id))
    return {"status": rt.get(record.id).status, "steps": steps}


def trace(rt: Runtime, record: PlanRecord, catalogue: Catalogue) -> dict[str, Any]:
    """What the trace page shows: the timeline (and its drawing), the graph with each step's state, the raw lines."""
    events = list(rt.trace(record.id))
    timeline = _timeline.build(record, events)
    lanes = timeline.lanes if timeline else ()
    states = {int(lane.key[5:]): (lane.state, lane.short) for lane in lanes if lane.key.startswith("step-")}
    return {
        "timeline": timeline,
        "drawing": _timelinesvg.draw(timeline) if timeline else "",
        "graph": graph_svg(record, catalogue, states),
        "lines": tell(events),
        "clock": _timelinesvg.clock,
        "span": _timeline.span,
        "states": _timeline.STATES,
    }


def compare(diff: RunDiff) -> list[dict[str, Any]]:
    """Each step of two runs side by side: per side, its status, duration, and its parameters and output
    as lines of JSON, each line marked where that field differs from the other run's."""
    cards = []
    for pair in diff.steps:
        sides: list[dict[str, Any] | None] = []
        for mine, theirs in ((pair.a, pair.b), (pair.b, pair.a)):
            if mine is None:
                sides.append(None)
                continue
            sides.append(
                {
                    "status": mine.status,
                    "ms": "" if mine.ms is None else f"{mine.ms:.1f} ms",
                    "params": _marked(mine.params, theirs.params if theirs else None),
                    "output": _marked(mine.output, theirs.output if theirs else None),
                }
            )
        either = pair.a or pair.b
        tool = either.tool if either is not None else ""
        cards.append({"id": pair.id, "tool": tool, "differs": pair.differs, "sides": sides})
    return cards


def _marked(value: Any, other: Any) -> list[tuple[str, bool]]:
    """``value`` as indented JSON lines, a top-level field's lines marked when ``other`` has it otherwise."""
    if not isinstance(value, dict) or not isinstance(other, dict):
        text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True, default=str)
        return [(line, value != other) for line in text.splitlines()]
    lines = [("{", False)]
    for index, key in enumerate(sorted(value)):
        comma = "," if index < len(value) - 1 else ""
        field = json.dumps({key: value[key]}, indent=2, ensure_ascii=False, default=str).splitlines()[1:-1]
        changed = key not in other or other[key] != value[key]
        lines += [(line + (comma if n == len(field) - 1 else ""), changed) for n, line in enumerate(field)]
    return [*lines, ("}", False)]
