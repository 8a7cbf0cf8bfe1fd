"""What a run of the engine knows and records: its state (the plan's steps, their rows, outputs, what waits for
what), what earlier runs recorded loaded and decided, each outcome recorded (a step done, failed, or of unknown
outcome), and the run's end. :mod:`plangate.engine` drives it; this is what it stands on."""

from __future__ import annotations

import asyncio
import contextlib
import heapq
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

from plangate import answer, lifecycle, metrics, provenance, results, timeouts, tracing
from plangate._calls import Outcome
from plangate._clock import iso
from plangate._decide import SKIPPED
from plangate._overrides import origin
from plangate.errors import LeaseLostError, StateError
from plangate.graph import run_deps
from plangate.plan import Plan
from plangate.results import Progress, RunResult
from plangate.store import DONE, PlanRow, StepRow, StepStatus
from plangate.tools import Tool

if TYPE_CHECKING:
    from plangate.engine import Engine


@dataclass(frozen=True)
class Unconfirmed:
    """What a run cut off from its store knew and no commit confirmed: the outcomes of the calls its tools
    answered, each with the attempt that answered (``(attempt, outcome)``).

    The run that takes the plan back under the same lease records each one only if the step's record is
    still that attempt's ``started`` one: a commit cut in flight may have recorded it already (the record
    says so, and it is not written again), and a step another runner took over, or a person settled, is
    theirs to decide.
    """

    outcomes: tuple[tuple[int, Outcome], ...] = ()
    uncalled: tuple[tuple[int, int], ...] = ()
    """Steps (``(attempt, step id)``) recorded as started whose tools were never called (by the broken
    transaction, or by one an earlier run of the lease knew of): where that commit went through in flight, they
    run again (never read as of unknown outcome)."""

    @property
    def steps(self) -> list[int]:
        return sorted(outcome.step_id for _, outcome in self.outcomes)

    @property
    def by_step(self) -> dict[int, tuple[int, Outcome]]:
        """Each outcome, with its attempt, by its step."""
        return {outcome.step_id: (attempt, outcome) for attempt, outcome in self.outcomes}

    def recorded_in(self, rows: Mapping[int, StepRow]) -> bool:
        """Whether every outcome is on record, at the attempt that answered (the commit cut in flight went through)."""
        return all(_done_at(rows.get(outcome.step_id), attempt) for attempt, outcome in self.outcomes)

    def told(self, rows: Mapping[int, StepRow]) -> str:
        """What became of these outcomes once another runner holds the plan (or it ended): all on record already
        (the commit cut in flight went through), or not recorded, and never by the run that knew them."""
        if self.outcomes and self.recorded_in(rows):
            return f"the outcomes this run knew (steps {self.steps}) were recorded before the store went away"
        return self.unrecorded()

    def refused(self, rows: Mapping[int, StepRow], gone: Collection[int] = ()) -> str:
        """What became of these outcomes where governance refused the take-back (:meth:`Engine.record_known`), as
        the step records say, for the refusal's message: each recorded as the run knew it, at the attempt that
        answered; or recorded as of unknown outcome, for a person to settle; or still that attempt's start, not
        recorded (``gone``: its tool is gone from the tools in force); or decided without it (another runner ran
        the step again, or a person settled it)."""
        said: dict[str, list[int]] = {}
        for attempt, outcome in self.outcomes:
            row = rows.get(outcome.step_id)
            if row is None or row.attempt != attempt:
                what = "not recorded: another runner took the step over"
            elif row.status == "outcome_unknown":
                what = "recorded as of unknown outcome: a person settles it"
            elif _as_known(row, outcome):
                what = "recorded"
            elif row.status != "started":
                what = "not recorded: a person settled the step"
            else:
                gone_too = " (the tools are gone)" if outcome.step_id in gone else ""
                what = f"not recorded{gone_too}: the next run of the plan decides them by the usual rules"
            said.setdefault(what, []).append(outcome.step_id)
        return "".join(
            f"; {_outcomes(steps)}, known from before the store went away, {_be(steps)} {what}"
            for what, steps in said.items()
        )

    def unrecorded(self) -> str:
        """That these outcomes are not recorded, and what happens to them next."""
        if not self.outcomes:
            return "this run knew no outcome that was not recorded"
        return (
            f"the outcomes this run knew (steps {self.steps}) are not recorded: the next run of the plan decides them "
            "by the usual rules (an idempotent step runs again; any other halts for a person to settle)"
        )


def _done_at(row: StepRow | None, attempt: int) -> bool:
    return row is not None and row.attempt == attempt and row.status in DONE


def _as_known(row: StepRow, outcome: Outcome) -> bool:
    """Whether the step's record is ``outcome``, as the engine records it (not a person's settlement)."""
    if outcome.ok:
        return row.status == "succeeded" and row.output == outcome.output
    return row.status in ("failed", "failed_optional") and row.error == outcome.error


def _outcomes(steps: list[int]) -> str:
    return f"the outcome of step {steps[0]}" if len(steps) == 1 else f"the outcomes of steps {steps}"


def _be(steps: list[int]) -> str:
    return "is" if len(steps) == 1 else "are"


class RunRecords:
    """A run's state and records (the loop is :class:`plangate.engine._Run`'s)."""

    def __init__(self, engine: Engine, plan_id: str, version: int, plan: Plan, actor: str) -> None:
        self.e = engine
        self.store = engine.store
        self.plan_id, self.version, self.plan, self.actor = plan_id, version, plan, actor
        self.steps = {s.id: s for s in plan.steps}
        self.order = [s.id for s in plan.steps]
        self.outputs: dict[int, Any] = {}
        self.nulls: set[int] = set()  # optional steps that failed: null, and every field of theirs too
        self.rows: dict[int, StepRow] = {}
        self.known: dict[int, StepRow] | None = None  # the step rows as the claim read them, for _load
        self.claimed: PlanRow | None = None  # the plan's row as the owner claimed it, for _move
        self.unhalted: tuple[int, ...] = ()  # failures of the run this one takes over, never halted on, for _load
        self.carried: dict[int, tuple[int, Outcome]] = {}  # outcomes a run cut off from its store knew, for _load
        self.held: Callable[[], Mapping[int, StepRow]] | None = None  # the rows as checked, for _reload
        self.answered: tuple[int, Outcome] | None = None  # one()'s last call: its attempt and outcome
        self.uncalled: set[tuple[int, int]] = set()  # (attempt, step id) started and never called, for _load
        self.recording: list[Outcome] = []  # the outcomes handed to the open transaction, until it commits
        self.starting: list[int] = []  # the steps it records as started, until it commits
        self.position = {step_id: index for index, step_id in enumerate(self.order)}
        self.waiting: set[int] = set()  # not started yet in this run
        self.blockers: dict[int, set[int]] = {}  # what each waiting step still waits for
        self.dependents: dict[int, list[int]] = {s: [] for s in self.order}
        self.ready: list[tuple[int, int]] = []  # a heap of (position in the plan, step id)
        self.in_flight: dict[asyncio.Task[Outcome], int] = {}
        self.finished: list[Outcome] = []
        self.ran: list[int] = []
        self.halt: tuple[int, str, str | None] | None = None
        self.now = ""
        self.kwargs: dict[int, dict[str, Any]] = {}  # validated arguments, from _prepare to the call
        self.retried: dict[int, int] = {}  # retries made in this run, by step
        self.strays = 0  # async calls cancelled when they overran, not waited for
        self.halting = asyncio.Event()  # set when the run halts: retries waiting out a backoff stop waiting
        self.pool = timeouts.shared("plangate-step")  # started as needed, reused, never waited for
        self.watch: timeouts.Watch | None = None
        self.spans = tracing.NO_RUN  # the run's spans: opened by ``watched``
        self.deps = run_deps(plan, lambda name: engine.catalogue[name].effect if name in engine.catalogue else None)
        self.tools: dict[int, Tool] = {}  # each step's tool, looked up once
        self.origins: dict[str, dict[str, str]] = {}  # what a started event says of its tool's origin, by tool

    def _reload(self) -> None:
        """The recorded step rows (as checked, when the orchestrator checks them), and the outputs (or skips)
        of the steps that are done."""
        self.rows = dict(self.held()) if self.held is not None else self.store.steps(self.plan_id)
        for sid in self.order:
            row = self.rows.get(sid)
            if row is not None and row.status in DONE:
                self._recorded(row)

    def record_known(
        self, rows: Mapping[int, StepRow], known: Unconfirmed
    ) -> tuple[dict[int, StepRow], tuple[int, ...]]:
        """:meth:`Engine.record_known`: the known outcomes recorded as :meth:`_load` and the loop record them."""
        self.rows, self.carried = dict(rows), known.by_step
        self._tick()
        left = []
        for step_id in self.order:
            row = self.rows.get(step_id)
            if row is None or step_id not in self.carried:
                continue
            if self.steps[step_id].tool not in self.e.catalogue:
                left += [step_id] if self._known(row) is not None else []
            else:
                self._answered(row)
        answered, self.finished = self.finished, []
        for outcome in answered:
            self._record_call(outcome)
        self._record_finished()
        return self.rows, tuple(left)

    def _load(self) -> None:
        """Load what earlier runs recorded; decide what an unknown outcome means."""
        self.rows = self.store.steps(self.plan_id) if self.known is None else self.known
        self.known = None
        for step_id in self.order:
            row = self.rows.get(step_id)
            if row is not None and row.status in DONE and row.version <= self.version:
                self._recorded(row)
                self._report("reused", step_id, row.status)
            elif row is not None and self._answered(row):
                continue  # recorded with the outcomes of this run's first transaction
            elif row is not None and row.status == "started" and (row.attempt, step_id) in self.uncalled:
                self._run_again(row, "its start was recorded as the store went away, before its tool was called")
            elif row is not None and row.status in ("started", "outcome_unknown"):
                self._unknown_outcome(row)
            elif row is not None and row.status == "failed" and step_id in self.unhalted:
                self.halt = self.halt or (step_id, row.error or "failed", None)  # the halt its run did not record
            else:
                self.waiting.add(step_id)
        self.carried = {}  # each recorded above, or moot (the step is done, or has no record)
        for step_id in self.waiting:
            self.blockers[step_id] = set(self.deps[step_id]) - self.outputs.keys()
            for dep in self.blockers[step_id]:
                self.dependents[dep].append(step_id)
            if not self.blockers[step_id]:
                heapq.heappush(self.ready, (self.position[step_id], step_id))

    def _answered(self, row: StepRow) -> bool:
        """Whether the run this one takes back knew the outcome of the call this started record stands for
        (see :class:`Unconfirmed`): if so, it is recorded, as if the call had just ended in this run."""
        known = self._known(row)
        if known is None:
            return False
        self.finished.append(known)
        return True

    def _known(self, row: StepRow) -> Outcome | None:
        """The outcome a run cut off from its store knew of the call this record stands for: only while the
        record is still that attempt's ``started`` one (else it was recorded, taken over or settled)."""
        carried = self.carried.pop(row.step_id, None)
        if carried is None or row.status != "started" or carried[0] != row.attempt:
            return None
        return carried[1]

    def _run_again(self, row: StepRow, why: str) -> None:
        """The step starts again (the next attempt, the same key), and the log says why."""
        reason = f"{why}, so it runs again with the same key {row.idempotency_key}"
        self._event("step.retrying", row.step_id, {"reason": reason, "attempt": row.attempt + 1})
        self.waiting.add(row.step_id)

    def _recorded(self, row: StepRow) -> None:
        """What a finished step's row says it gave: its output, null (an optional failure) or a skip."""
        if row.status == "failed_optional":
            self.nulls.add(row.step_id)
        self.outputs[row.step_id] = SKIPPED if row.status == "skipped" else row.output

    def _done(self, step_id: int, output: Any) -> None:
        """Record an output (or a skip) and make ready the steps that waited only for it."""
        self.outputs[step_id] = output
        for later in self.dependents[step_id]:
            blockers = self.blockers[later]
            blockers.discard(step_id)
            if not blockers and later in self.waiting:
                heapq.heappush(self.ready, (self.position[later], later))

    def _unknown_outcome(self, row: StepRow, cause: str | None = None) -> None:
        """A step that may or may not have had its effect: run again if idempotent, else halt for a person.

        ``cause``: a call that overran its limit (its tool is not idempotent); else a run that died.
        """
        tool = self._tool(row.step_id)
        if tool.idempotent and cause is None:
            self._run_again(row, "started but no outcome recorded; the tool is idempotent")
            return
        cause = cause or f"the step started at {row.started_at} but no outcome was recorded"
        error = (
            f"outcome unknown: {cause}, and {tool.name!r} is not idempotent, "
            "so plangate will not run it again on its own"
        )
        self.rows[row.step_id] = replace(row, status="outcome_unknown", error=error)
        self.store.put_step(self.rows[row.step_id])
        self._event("step.outcome_unknown", row.step_id, {"error": error})
        self._report("outcome_unknown", row.step_id, error)
        self.store.on_commit(self.spans.step_ended, row.step_id, tool.name, "outcome_unknown", error)
        self.halt = (row.step_id, error, results.SETTLE)

    def _record_finished(self) -> None:
        for outcome in self.finished:
            step, now = self.steps[outcome.step_id], self._now()
            # Only a read may fail quietly: the checker says so, and so does the engine, whatever it is given.
            optional = not outcome.ok and step.on_failure == "continue" and self._tool(step.id).effect == "read"
            status: StepStatus = "succeeded" if outcome.ok else "failed_optional" if optional else "failed"
            output = outcome.output if outcome.ok else None
            attempt = self.rows[step.id].attempt
            self.store.finish_step(
                self.plan_id,
                step.id,
                attempt=attempt,
                status=status,
                output=output,
                error=outcome.error,
                at=now,
                lost=f"step {step.id}'s record changed while its call (attempt {attempt}) ran: a person settled it, "
                "or another attempt took it over; this outcome is not recorded, and the run stops here",
            )
            self.rows[step.id] = _finished(self.rows[step.id], status, output, outcome.error, now)
            if outcome.ok:
                self._done(step.id, outcome.output)
                self._event("step.succeeded", step.id, {"output": outcome.output, "ms": round(outcome.ms, 3)})
            elif optional:
                self.nulls.add(step.id)
                self._done(step.id, None)
                self._event("step.failed_optional", step.id, {"error": outcome.error, "ms": round(outcome.ms, 3)})
            else:
                self._event("step.failed", step.id, {"error": outcome.error, "ms": round(outcome.ms, 3)})
                self.halt = self.halt or (step.id, outcome.error or "failed", None)
            self._report(status, step.id, outcome.error or "", outcome.ms)
            self.store.on_commit(self.spans.step_ended, step.id, step.tool, status, outcome.error, outcome.ms)
            self.ran.append(step.id)
        self.finished.clear()

    def _record_call(self, outcome: Outcome) -> None:
        """A call to a tool that is not idempotent that overran, or whose connection broke, may have happened:
        a person must say."""
        if outcome.timed_out is not None and not self._tool(outcome.step_id).idempotent:
            cause = f"the call timed out after {outcome.timed_out:g} s and may have happened (it may still be running)"
            self._unknown_outcome(self.rows[outcome.step_id], cause)
        elif outcome.unknown is not None and not self._tool(outcome.step_id).idempotent:
            self._unknown_outcome(self.rows[outcome.step_id], outcome.unknown)
        else:
            self.finished.append(outcome)

    # -- ending --------------------------------------------------------------------------

    def _end(self) -> RunResult:
        skipped = tuple(s for s in self.order if self.outputs.get(s) is SKIPPED)
        failed_optional = tuple(s for s in self.order if s in self.nulls)
        outputs = {s: v for s, v in self.outputs.items() if v is not SKIPPED}
        if self.halt is None:
            said = answer.render(self.plan, outputs, self.nulls, skipped, self.flows)
            ended = {"steps": len(outputs), "skipped": list(skipped), **answer.event_data(said)}
            self._move("succeeded", "run.succeeded", ended)
            self.store.on_commit(self.spans.end, "succeeded")
            return RunResult(
                plan_id=self.plan_id,
                version=self.version,
                status="succeeded",
                outputs=outputs,
                skipped=skipped,
                failed_optional=failed_optional,
                ran=tuple(self.ran),
                answer=said.text if said else None,
                answer_provenance=said,
            )
        step_id, error, next_step = self.halt
        step = self.steps[step_id]
        next_step = next_step or results.next_step(error)
        self._move(
            "halted", "run.halted", {"step": step_id, "error": error, "rationale": step.rationale, "tool": step.tool}
        )
        self.store.on_commit(self.spans.end, "halted", error, step_id)
        return RunResult(
            plan_id=self.plan_id,
            version=self.version,
            status="halted",
            outputs=outputs,
            skipped=skipped,
            failed_optional=failed_optional,
            ran=tuple(self.ran),
            failed_step=step_id,
            tool=step.tool,
            rationale=step.rationale,
            error=error,
            next_step=next_step,
        )

    def _move(self, to: Literal["succeeded", "halted"], kind: str, data: dict[str, Any]) -> None:
        """End the run: the plan leaves ``running`` only from the runner that holds it."""
        self.store.lock_log()
        claimed, owner, at = self.claimed, self.e.owner, self._now()
        if claimed is not None and owner is not None and claimed.lease_owner == owner:
            with contextlib.suppress(StateError):  # moved on from the claim's row: its lease is still the owner's
                lifecycle.move(self.store, claimed, to, actor=self.actor, at=at, kind=kind, data=data, held_by=owner)
                return
        plan = self.store.get_plan(self.plan_id)
        if plan is None:
            raise LeaseLostError(f"plan {self.plan_id} no longer exists")
        if self.e.owner is not None and plan.lease_owner != self.e.owner:
            raise LeaseLostError(
                f"{self.e.owner} lost its lease on plan {self.plan_id} to {plan.lease_owner}: the run stops here"
            )
        lifecycle.move(self.store, plan, to, actor=self.actor, at=at, kind=kind, data=data)

    def _fence(self) -> None:
        """This transaction commits only while the runner holds the plan running (see :meth:`_check_lease`)."""
        if self.e.owner is not None:
            self.store.fence(self.plan_id, self.e.owner)

    def _check_lease(self) -> None:
        """Before steps start: the runner must still hold the plan, in the store, not only in memory.

        The transaction that records the steps as started commits only while the lease is
        this runner's (a fence), so a runner that lost its lease (a clock that jumped, a
        process that was paused and looked dead) never starts a step its successor may start.
        """
        if self.e.owner is not None and self.ready:
            self.store.fence(self.plan_id, self.e.owner)
        if self.e.lease_lost is not None and self.e.lease_lost.is_set():
            raise self._lease_lost()

    def _lease_lost(self) -> LeaseLostError:
        return LeaseLostError(
            f"{self.e.owner} lost its lease on plan {self.plan_id}: another runner took it over, or it could not "
            "be renewed in time, so this one stops"
        )

    # -- helpers -------------------------------------------------------------------------

    @cached_property
    def flows(self) -> provenance.Provenance:
        """Where each step's values come from: the checker's analysis, made once per run."""
        return provenance.analyse(self.plan, self.e.catalogue)

    def _tool(self, step_id: int) -> Tool:
        tool = self.tools.get(step_id)
        if tool is None:
            tool = self.tools[step_id] = self.e.catalogue[self.steps[step_id].tool]
        return tool

    def _origin(self, step_id: int) -> dict[str, str]:
        name = self.steps[step_id].tool
        found = self.origins.get(name)
        if found is None:
            found = self.origins[name] = origin(self._tool(step_id))
        return found

    def _tick(self) -> None:
        """Read the clock once per transaction: what commits together carries one time."""
        self.now = iso(self.e.clock.now())

    def _now(self) -> str:
        return self.now

    def _event(self, kind: str, step_id: int | None, data: dict[str, Any]) -> None:
        self.store.record_event(  # written at the latest at the commit: the log's lock is held only then
            plan_id=self.plan_id,
            version=self.version,
            step_id=step_id,
            kind=kind,
            actor=self.actor,
            at=self._now(),
            data=data,
        )

    def _report(self, kind: Any, step_id: int, detail: str, ms: float | None = None) -> None:
        """Tell progress and metrics (and, beside it, the steps' spans) what the open transaction records, once it
        commits: a step is never said to have succeeded when its record did not (a fence failed at the commit)."""
        self.store.on_commit(self._report_now, kind, step_id, detail, ms)

    def _report_now(self, kind: Any, step_id: int, detail: str, ms: float | None) -> None:
        metrics.step(self.steps[step_id].tool, kind, ms)
        if self.e.progress is not None:
            done = len(self.outputs)
            self.e.progress(
                Progress(
                    kind=kind,
                    step_id=step_id,
                    tool=self.steps[step_id].tool,
                    done=done,
                    total=len(self.order),
                    detail=detail,
                    ms=ms,
                )
            )


def _finished(row: StepRow, status: StepStatus, output: Any, error: str | None, at: str) -> StepRow:
    """The row of a step whose call ended (what ``dataclasses.replace`` gives, built directly: once per step)."""
    return StepRow(
        plan_id=row.plan_id,
        step_id=row.step_id,
        version=row.version,
        status=status,
        attempt=row.attempt,
        idempotency_key=row.idempotency_key,
        params=row.params,
        output=output,
        error=error,
        started_at=row.started_at,
        finished_at=at,
    )
