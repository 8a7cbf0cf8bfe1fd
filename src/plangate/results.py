"""What a run gives back: its progress as it goes, and how it ended (also rebuilt from the store)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from plangate import answer
from plangate.answer import Answer
from plangate.plan import Plan
from plangate.provenance import EMPTY, Provenance
from plangate.store import StepRow

POLICY_REFUSAL = "refused by the policy: "
"""How the error of a step the policy refused just before its call begins (a deny or require rule)."""

RESUME = "fix the cause, then `plangate resume`; or edit the plan (a new version, approved again) and resume"
SETTLE = "check whether the step's effect happened; a person must settle it before the plan can go on"
REFUSED = (
    "resuming would be refused the same way (the value comes from the plan and the outputs already recorded): "
    "edit the plan (`plangate edit`: a new version, approved again) so that no value breaks the rule, "
    "or change the policy and resume under it (`--policy`); or `plangate close` the plan"
)


def next_step(error: str | None, status: str = "failed") -> str:
    """What a person does about a halt, from how the halting step ended."""
    if status == "outcome_unknown":
        return SETTLE
    return REFUSED if (error or "").startswith(POLICY_REFUSAL) else RESUME


@dataclass(frozen=True, kw_only=True)
class Progress:
    """What the engine reports as it goes (for a progress display)."""

    kind: Literal["started", "succeeded", "failed", "failed_optional", "skipped", "reused", "outcome_unknown"]
    step_id: int
    tool: str
    done: int
    total: int
    detail: str = ""
    ms: float | None = None


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """How a run ended. ``halted`` names the step, its rationale, the error and what to do."""

    plan_id: str
    version: int
    status: Literal["succeeded", "halted"]
    outputs: dict[int, Any] = field(default_factory=dict)
    skipped: tuple[int, ...] = ()
    failed_optional: tuple[int, ...] = ()
    """Optional steps (``on_failure: continue``) that failed: their output is null."""
    ran: tuple[int, ...] = ()
    failed_step: int | None = None
    tool: str | None = None
    rationale: str | None = None
    error: str | None = None
    next_step: str | None = None
    answer: str | None = None
    """The plan's answer, rendered from the outputs (None: the plan has none, or the run did not succeed)."""
    answer_provenance: Answer | None = None
    """Where each part of the answer comes from: ``untrusted`` names the steps (and tools) an injection could steer."""

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"

    def __str__(self) -> str:
        if self.ok:
            optional = f", {len(self.failed_optional)} optional failed" if self.failed_optional else ""
            done = (
                f"succeeded: {len(self.outputs)} steps done, {len(self.skipped)} skipped{optional}, "
                f"{len(self.ran)} run now"
            )
            said = self.answer_provenance
            return done if said is None else f"{done}\nanswer: {said.marked()}"
        lines = [f"halted at step {self.failed_step} ({self.tool}): {self.error}"]
        if self.rationale:
            lines.append(f"  the step's rationale: {self.rationale}")
        if self.next_step:
            lines.append(f"  next: {self.next_step}")
        return "\n".join(lines)


def recorded_result(
    plan_id: str, version: int, plan: Plan, rows: Mapping[int, StepRow], status: str, *, flows: Provenance = EMPTY
) -> RunResult:
    """The result of a finished run, rebuilt from the store (executing it again repeats nothing).

    ``flows``: the plan's provenance, for where the answer's parts come from (:func:`plangate.provenance.analyse`).
    """
    outputs = {s: r.output for s, r in rows.items() if r.status in ("succeeded", "failed_optional")}
    skipped = tuple(s.id for s in plan.steps if rows.get(s.id) and rows[s.id].status == "skipped")
    optional = tuple(s.id for s in plan.steps if rows.get(s.id) and rows[s.id].status == "failed_optional")
    done = RunResult(
        plan_id=plan_id, version=version, status="succeeded", outputs=outputs, skipped=skipped, failed_optional=optional
    )
    if status == "succeeded":
        said = answer.render(plan, outputs, optional, skipped, flows)
        return replace(done, answer=said.text if said else None, answer_provenance=said)
    failed = next((r for r in rows.values() if r.status in ("failed", "outcome_unknown")), None)
    step = plan.step(failed.step_id) if failed else None
    return replace(
        done,
        status="halted",
        failed_step=failed.step_id if failed else None,
        tool=step.tool if step else None,
        rationale=step.rationale if step else None,
        error=failed.error if failed else None,
        next_step=next_step(failed.error, failed.status) if failed else RESUME,
    )
