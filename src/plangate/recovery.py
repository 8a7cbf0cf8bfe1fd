"""After a halt: settling a step whose outcome is unknown, correcting a failed step, closing the plan.

Each is a decision: the runtime checks who may make it
(:func:`plangate.approval.check_may_decide`) and that no run holds the plan. Rolling back
is :mod:`plangate.compensation`. Closing ends a halted plan that nobody will resume; it is
final, and whatever is later asked of a closed plan is refused with who closed it and why
(:func:`refuse_closed`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from plangate import lifecycle
from plangate.errors import StateError, UsageError
from plangate.plan import Plan, Step, same_json
from plangate.store import DONE, PlanRow, PlanStatus, StepRow, Store, VersionRow
from plangate.tools import Catalogue


def check_correction(store: Store, plan: PlanRow, old: VersionRow, corrected: Plan) -> None:
    """A correction of a plan that ran (halted, or its correction since) may change only what has not run."""
    before = {s.id: s for s in Plan.parse(old.body).steps}
    after = {s.id: s for s in corrected.steps}
    rows = sorted(store.steps(plan.id).items())
    refuse_unknown(rows)
    for step_id, row in rows:
        if row.status in DONE and step_id > 0 and not _same_step(after.get(step_id), before.get(step_id)):
            raise StateError(
                f"step {step_id} already ran ({row.status}); a correction may change only steps "
                "that have not succeeded, and keeps the others as they are"
            )


def unknown(rows: Iterable[tuple[int, StepRow]], *, undos: bool = False) -> list[int]:
    """The plan's steps that started with no outcome recorded: they may or may not have happened (``undos``:
    a rollback's calls too, as negative ids)."""
    return [step_id for step_id, row in rows if (step_id > 0 or undos) and row.status in ("started", "outcome_unknown")]


def refuse_unknown(rows: Iterable[tuple[int, StepRow]], then: str | None = None, *, undos: bool = False) -> None:
    """Refuse while a step's outcome (``undos``: or an undo's) is unknown: a person settles it first."""
    found = unknown(rows, undos=undos)
    if found:
        after = f", then {then}" if then else ""
        first = found[0]
        what, flag = (f"step {first}", "") if first > 0 else (f"the undo of step {-first}", " --undo")
        settle = f"plangate settle{flag}"
        raise StateError(f"{what}'s outcome is unknown: settle it first ({settle}){after}")


def _same_step(one: Step | None, other: Step | None) -> bool:
    """Whether two steps say the same, value for value (``==`` takes a parameter's 1, 1.0 and true for one)."""
    if one is None or other is None:
        return one is other
    return same_json(one.model_dump(mode="json"), other.model_dump(mode="json"))


def close(store: Store, plan: PlanRow, *, actor: str, reason: str, at: str) -> PlanRow:
    """Close a halted plan for good (inside the caller's transaction): ``closed``, with who and why.

    Every step's outcome must be known first, so that the closed plan's record says what
    happened: a step whose outcome is unknown is settled before (``plangate settle``).
    """
    refuse_unknown(sorted(store.steps(plan.id).items()), "close", undos=True)
    return lifecycle.move(store, plan, "closed", actor=actor, at=at, data={"reason": reason})


def refuse_closed(store: Store, plan_id: str, status: PlanStatus, doing: str) -> None:
    """Refuse ``doing`` (such as ``be resumed``) to a closed plan, saying who closed it, when and why."""
    if status == "closed":
        raise StateError(f"{closed_note(store, plan_id)}; it cannot {doing}")


def closed_note(store: Store, plan_id: str) -> str:
    """Who closed the plan, when and why, as its audit log says."""
    closing = [e for e in store.events(plan_id) if e.kind == "plan.closed"]
    if not closing:
        return f"plan {plan_id} is closed"
    event = closing[-1]
    return f"plan {plan_id} was closed by {event.actor} at {event.at[:19]}: {event.data.get('reason')!r}"


def not_done(actor: str, note: str | None) -> str:
    """The error a step settled as not done keeps: who settled it, and their note."""
    return f"settled as not done by {actor}" + (f": {note}" if note else "")


def settle(
    store: Store,
    catalogue: Catalogue,
    plan: PlanRow,
    version: VersionRow,
    step_id: int,
    *,
    done: bool,
    actor: str,
    output: Any,
    note: str | None,
    at: str,
) -> None:
    """Record a person's word on a step whose outcome is unknown (inside the caller's transaction).

    Done: the output they observed, checked against the tool's declared type, becomes the
    step's output (the event shows it beside their name). Not done: the step is failed, so
    ``resume`` runs it again. A negative ``step_id`` names the undo of step ``-step_id`` (a
    rollback's compensating call cut off with no outcome): done, it counts as undone; not
    done, the next rollback calls it again.
    """
    row = store.steps(plan.id).get(step_id)
    what = f"step {step_id}" if step_id > 0 else f"the undo of step {-step_id}"
    if row is None or row.status not in ("outcome_unknown", "started"):
        raise StateError(f"{what} of plan {plan.id} has no unknown outcome to settle")
    step = Plan.parse(version.body).step(abs(step_id))  # a row of the plan's: of one of its steps
    tool = catalogue.get(step.tool)
    if step_id < 0:  # the undo's tool: the one the step's tool names to compensate it
        tool = catalogue.get(tool.compensate) if tool is not None and tool.compensate else None
    if done:
        if tool is None:
            raise UsageError(f"the tool of {what} is not in the catalogue, so the output cannot be checked (--tools)")
        try:
            output = tool.dump_output(output)
        except ValueError as exc:
            raise UsageError(f"the output given does not match {tool.name}'s declared type: {exc}") from None
        store.put_step(replace(row, status="succeeded", output=output, error=None, finished_at=at))
    else:
        store.put_step(replace(row, status="failed", error=not_done(actor, note), finished_at=at))
    lifecycle.hold(store, plan, at)
    store.append_event(  # an undo's events name the step it undoes, as the rollback's own do
        plan_id=plan.id,
        version=plan.version,
        step_id=abs(step_id),
        kind="step.settled" if step_id > 0 else "compensation.step_settled",
        actor=actor,
        at=at,
        data={
            "step": abs(step_id),
            "tool": tool.name if tool else step.tool,
            "done": done,
            "output": output,
            "note": note,
        },
    )
