"""Incidents: plans that halted after at least one effect, what ran, what people did since, what is still open.

An effect is a step whose tool writes or cannot be undone (or whose effect is unknown,
because its tools module could not be loaded) that succeeded, or whose outcome is
unknown, before the run halted. Everything here comes from the plan's audit events and
step rows; the tools module only says which tools have effects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from plangate.store import Event, PlanRow, StepRow
from plangate.story import describe

EffectOf = Callable[[PlanRow, str], str | None]
"""The effect (read, write, irreversible) of a plan's tool; None when it cannot be known."""

_AFTER = frozenset(
    {
        "step.settled",
        "compensation.started",
        "compensation.step_succeeded",
        "compensation.step_failed",
        "compensation.finished",
        "plan.edited",
        "plan.approved",
        "plan.rejected",
        "plan.closed",
        "run.resumed",
        "run.halted",
        "run.succeeded",
    }
)
_RESOLVED = {
    "succeeded": "nothing: the plan was corrected and resumed, and its run succeeded",
    "compensated": "nothing: every effect was undone",
}


@dataclass(frozen=True, kw_only=True)
class Incident:
    plan: PlanRow
    halts: tuple[str, ...]
    ran: tuple[str, ...]
    since: tuple[str, ...]
    open: tuple[str, ...]

    def lines(self) -> list[str]:
        p = self.plan
        return [
            f"## Plan {p.id}: {p.task}",
            "",
            f"Category {p.category}, requested by {p.requested_by}; now **{p.status}**. "
            f"Its story: `traces/{p.id}.txt`.",
            "",
            "Halted:",
            *(f"- {h}" for h in self.halts),
            "",
            "What ran before the halt:",
            *(f"- {r}" for r in self.ran),
            "",
            "Compensated, settled, corrected or closed since, and by whom:",
            *(f"- {s}" for s in self.since or ("nothing yet",)),
            "",
            "Still open:",
            *(f"- {o}" for o in self.open),
        ]


def incident(plan: PlanRow, events: list[Event], steps: dict[int, StepRow], effect_of: EffectOf) -> Incident | None:
    """The plan's incident, or None when it never halted after an effect."""
    halts = [e for e in events if e.kind == "run.halted"]
    if not halts:
        return None
    tools = {e.step_id: str(e.data.get("tool")) for e in events if e.kind == "step.started"}
    effects = [
        e
        for e in events
        if e.kind in ("step.succeeded", "step.outcome_unknown")
        and e.seq < halts[-1].seq
        and effect_of(plan, tools.get(e.step_id, "")) != "read"
    ]
    if not effects:
        return None
    first = halts[0].seq
    return Incident(
        plan=plan,
        halts=tuple(f"{h.at[:19]}: {describe(h)}" for h in halts),
        ran=tuple(_ran(plan, e, tools, effect_of) for e in effects),
        since=tuple(f"{e.at[:19]} {e.actor}: {describe(e)}" for e in events if e.seq > first and e.kind in _AFTER),
        open=tuple(_open(plan, events, steps, tools, effect_of)),
    )


def _ran(plan: PlanRow, event: Event, tools: dict[int | None, str], effect_of: EffectOf) -> str:
    tool = tools.get(event.step_id, "?")
    effect = effect_of(plan, tool) or "effect unknown"
    what = "outcome UNKNOWN" if event.kind == "step.outcome_unknown" else "succeeded"
    return f"step {event.step_id} {tool} ({effect}): {what} at {event.at[:19]}"


def _open(
    plan: PlanRow, events: list[Event], steps: dict[int, StepRow], tools: dict[int | None, str], effect_of: EffectOf
) -> list[str]:
    if plan.status in _RESOLVED:
        return [_RESOLVED[plan.status]]
    if plan.status == "closed":
        closing = [e for e in events if e.kind == "plan.closed"][-1]
        return [f"nothing: closed by {closing.actor} at {closing.at[:19]}: {closing.data.get('reason')!r}"]
    found = []
    for step_id, row in sorted(steps.items()):
        tool = tools.get(step_id, "?")
        if step_id > 0 and row.status in ("started", "outcome_unknown"):
            found.append(f"step {step_id} {tool}: outcome unknown; settle it (plangate settle)")
        elif step_id > 0 and row.status == "succeeded" and effect_of(plan, tool) != "read":
            undo = steps.get(-step_id)
            if undo is None or undo.status != "succeeded":
                found.append(f"step {step_id} {tool} ran and is not undone")
    finished = [e for e in events if e.kind == "compensation.finished"]
    if finished:
        data: dict[str, Any] = finished[-1].data
        found += [f"step {s}: cannot be undone by plangate: {why}" for s, why in data.get("not_undoable", ())]
        found += [f"step {s}: its undo failed: {error}" for s, error in data.get("failed", ())]
    what = {"pending_approval": "a corrected version waits for approval", "approved": "approved, not yet resumed"}
    decide = what.get(plan.status, "a person decides: compensate, correct and resume, or close (docs/incidents.md)")
    return [*found, f"plan is {plan.status}: {decide}"]
