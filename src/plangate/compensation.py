"""Undoing a halted plan: compensating tools run in reverse order, each step durable and audited.

A completed step whose tool declares ``compensate="other_tool"`` is undone by calling
that tool. Its parameters are found by name: first in the step's recorded output (a
refund's ``refund_id``), then in the step's own parameters (the ``invoice_id``). Each
undo is recorded as ``started`` before its call, under the idempotency key
``plan_id:undo:step_id``, and its outcome after, so a crash never undoes a step twice:
an undo that started with no outcome runs again only if the compensating tool is
idempotent. An undo is called as the engine calls a tool (sync or async, under its time
limit, whatever it raises its failure); one that overran, or whose tool said its outcome is
unknown, is left without an outcome when its tool is not idempotent, for a person to settle
(``plangate settle ID STEP --undo``). Steps that only read need no undo; steps that write but declare no
compensating tool are listed for a person. The plan ends ``compensated`` or
``compensation_incomplete`` (run it again once a person has dealt with what is listed).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from plangate import _calls as calls
from plangate import lifecycle, timeouts
from plangate._clock import Clock, iso
from plangate.errors import LeaseLostError, ParamsError
from plangate.plan import Plan, Step
from plangate.store import PlanRow, StepRow, Store
from plangate.tools import Catalogue, RunContext, Tool


@dataclass(frozen=True, kw_only=True)
class CompensationResult:
    plan_id: str
    status: Literal["compensated", "compensation_incomplete"]
    undone: tuple[int, ...] = ()
    not_undoable: tuple[tuple[int, str], ...] = ()
    failed: tuple[tuple[int, str], ...] = ()

    def __str__(self) -> str:
        lines = [f"{self.status}: undone steps {list(self.undone) or 'none'}"]
        lines += [f"  step {s} cannot be undone by plangate: {why}" for s, why in self.not_undoable]
        lines += [f"  step {s}: the undo failed: {error}" for s, error in self.failed]
        return "\n".join(lines)


@dataclass
class Compensation:
    """One rollback of a plan already claimed for it (status ``compensating``, see :mod:`plangate.lifecycle`)."""

    store: Store
    catalogue: Catalogue
    clock: Clock
    plan: PlanRow
    body: Plan
    actor: str
    rows: Mapping[int, StepRow]
    """The plan's step rows as the rollback's claim held them against the audit log."""
    lease_lost: threading.Event | None = None
    """Set when the lease was lost, or not renewed in time (:class:`lifecycle.LeaseKeeper`): no undo starts."""

    @property
    def plan_id(self) -> str:
        return self.plan.id

    @property
    def version(self) -> int:
        return self.plan.version

    def run(self) -> CompensationResult:
        rows = self.rows
        undone: list[int] = []
        not_undoable: list[tuple[int, str]] = []
        failed: list[tuple[int, str]] = []
        for step in reversed(self.body.steps):
            row = rows.get(step.id)
            tool = self.catalogue.get(step.tool)
            if row is None or row.status != "succeeded" or tool is None or tool.effect == "read":
                continue
            if tool.compensate is None:
                not_undoable.append((step.id, f"{tool.name} ({tool.effect}) declares no compensating tool"))
                continue
            error = self._undo(step, row, self.catalogue[tool.compensate], rows.get(-step.id))
            (failed.append((step.id, error)) if error else undone.append(step.id))
        status: Literal["compensated", "compensation_incomplete"] = (
            "compensated" if not (not_undoable or failed) else "compensation_incomplete"
        )
        with self.store.transaction():
            self.store.lock_log()
            plan = self.store.get_plan(self.plan_id)
            if plan is None or plan.lease_owner != self.plan.lease_owner:
                raise self._lost()
            lifecycle.move(
                self.store,
                plan,
                status,
                actor=self.actor,
                at=iso(self.clock.now()),
                kind="compensation.finished",
                data={
                    "status": status,
                    "undone": undone,
                    "not_undoable": [list(x) for x in not_undoable],
                    "failed": [list(x) for x in failed],
                },
            )
        return CompensationResult(
            plan_id=self.plan_id,
            status=status,
            undone=tuple(undone),
            not_undoable=tuple(not_undoable),
            failed=tuple(failed),
        )

    def _undo(self, step: Step, row: StepRow, undo: Tool, previous: StepRow | None) -> str | None:
        """Undo one step durably; None when it is undone, else why not."""
        if previous is not None and previous.status == "succeeded":
            return None  # undone before: never twice
        if previous is not None and previous.status == "started" and not undo.idempotent:
            return (
                f"the undo started at {previous.started_at} with no recorded outcome, and {undo.name} is not "
                f"idempotent: a person must check it, then settle it (plangate settle {self.plan_id[:8]} {step.id}"
                " --undo --done or --not-done)"
            )
        params = undo_params(row.params, row.output, undo)
        try:
            kwargs = undo.validate_params(params)
        except ParamsError as exc:
            return str(exc)
        now = iso(self.clock.now())
        started = StepRow(
            plan_id=self.plan_id,
            step_id=-step.id,
            version=self.version,
            status="started",
            attempt=(previous.attempt + 1) if previous else 1,
            idempotency_key=f"{self.plan_id}:undo:{step.id}",
            params=params,
            started_at=previous.started_at if previous and previous.status == "started" else now,
        )
        if self.lease_lost is not None and self.lease_lost.is_set():  # as a run: no call starts that a
            raise self._lost()  # runner taking the rollback over could find in flight
        with self.store.transaction():
            self._fence()
            self.store.put_step(started)
            self._event(
                "compensation.step_started",
                step.id,
                {"tool": undo.name, "params": params, "idempotency_key": started.idempotency_key},
                now,
            )
        if undo.ctx_param is not None:
            kwargs[undo.ctx_param] = RunContext(
                plan_id=f"{self.plan_id}:undo", step_id=step.id, now=self.clock.now(), attempt=started.attempt
            )
        # As the engine calls a tool: sync or async, under its time limit, whatever it raises its failure.
        called = step.model_copy(update={"tool": undo.name, "expected_output": "any"})
        seconds = timeouts.call_limit(undo, None)
        outcome = calls.bounded(called, undo, kwargs, seconds, timeouts.shared("plangate-step"))
        may_have = outcome.unknown or (f"it timed out after {seconds:g} s" if outcome.timed_out is not None else None)
        if may_have is not None and not undo.idempotent:  # no outcome recorded: a person checks, and settles it
            return (
                f"the undo may have happened ({may_have}), and {undo.name} is not idempotent: a person must check "
                f"it, then settle it (plangate settle {self.plan_id[:8]} {step.id} --undo --done or --not-done)"
            )
        if not outcome.ok:
            error = outcome.error or "failed"
            with self.store.transaction():
                self._fence()
                now = iso(self.clock.now())
                self.store.put_step(replace(started, status="failed", error=error, finished_at=now))
                self._event("compensation.step_failed", step.id, {"error": error}, now)
            return error
        with self.store.transaction():
            self._fence()
            now = iso(self.clock.now())
            self.store.put_step(replace(started, status="succeeded", output=outcome.output, finished_at=now))
            self._event("compensation.step_succeeded", step.id, {"output": outcome.output}, now)
        return None

    def _lost(self) -> LeaseLostError:
        return LeaseLostError(
            f"the rollback of plan {self.plan_id} lost its lease, or could not renew it in time; it stops here"
        )

    def _fence(self) -> None:
        """This transaction commits only while this rollback holds the plan: the undo's started record, and its
        outcome too (a rollback taken over after its lease ran out records nothing; the one that took over
        decides from the started record)."""
        assert self.plan.lease_owner is not None
        self.store.fence(self.plan_id, self.plan.lease_owner)

    def _event(self, kind: str, step_id: int | None, data: dict[str, Any], at: str) -> None:
        """Record an event at ``at``: the time the step's row written with it says, so the row is held to it."""
        with self.store.transaction():
            self.store.append_event(
                plan_id=self.plan_id,
                version=self.version,
                step_id=step_id,
                kind=kind,
                actor=self.actor,
                at=at,
                data=data,
            )


def undo_params(called: Any, output: Any, undo: Tool) -> dict[str, Any]:
    """The undo's parameters, found by name: in the step's recorded output first, then in the parameters
    it was called with (``called``: as the engine resolved them, never the plan's text with its references
    and escapes)."""
    source: dict[str, Any] = {
        **(called if isinstance(called, dict) else {}),
        **(output if isinstance(output, dict) else {}),
    }
    return {name: source[name] for name in undo.param_names if name in source}
