"""The engine: runs an approved plan deterministically, durably, and never calls a model.

For each step that is ready (everything it reads has finished): evaluate its condition,
resolve its references, validate its parameters, hold them against the policy's deny
rules, **durably record ``started`` with the idempotency key ``plan_id:step_id``**, call
the tool, check the output against the declared and the expected type, and durably
record the output. A failure is recorded and **halts** the run: no new step starts, the
steps already running finish and are recorded, and the result names the step, its
rationale and the error. Nothing is improvised.

Commits are grouped: the outcome of the steps that just finished and the ``started``
records of the steps they unblock go into one transaction, so a sequential plan costs one
commit (one fsync with ``synchronous=full``) per step, and no step starts before what it
reads is durable.

On resume, completed steps are loaded and never re-run. A step with ``started`` but no
outcome has an *unknown* outcome (the process died during the call): it is re-run with
the same idempotency key only when its tool is idempotent; otherwise the run halts for a
person.

If the store goes away mid-run (a PostgreSQL restart, a connection cut), the run stops with a
:class:`~plangate.errors.StoreLostError` that carries the outcomes its tools had answered and no
commit confirmed (:class:`Unconfirmed`); the run that takes it back under the same lease records
each of them, once, only where the step's record is still that call's ``started`` one.

Every call runs under a time limit (:mod:`plangate.timeouts`). A call that overruns it, or
raises, is made again under the same key when its tool is idempotent and has ``retries``
left (after a backoff, without holding up other steps); a call to a tool that is not
idempotent that overruns has an unknown outcome, exactly as after a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Literal

from plangate import _calls as calls
from plangate import answer, ledger, lifecycle, metrics, provenance, results, timeouts, tracing
from plangate._calls import Outcome
from plangate._clock import Clock, iso, parse_iso
from plangate._decide import SKIPPED, decide
from plangate._overrides import governed, origin
from plangate.errors import LeaseLostError, StateError, StoreLostError
from plangate.graph import run_deps
from plangate.plan import Plan, Step
from plangate.policy import Policy
from plangate.results import Progress, RunResult
from plangate.store import DONE, PlanRow, StepRow, StepStatus, Store
from plangate.tools import Catalogue, RunContext, Tool, idempotency_key
from plangate.tracing import Traces

DEFAULT_CONCURRENCY = 8


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


@dataclass
class Engine:
    """Runs one plan. Deterministic: time and ids come from ``clock``, never from the system."""

    store: Store
    catalogue: Catalogue
    clock: Clock
    policy: Policy | None = None
    max_concurrency: int = DEFAULT_CONCURRENCY
    progress: Callable[[Progress], None] | None = None
    owner: str | None = None
    """Who holds the run's lease (see :mod:`plangate.lifecycle`); the run ends only while it does."""
    lease_lost: threading.Event | None = None
    """Set when the lease was lost: no new step starts, and the run stops."""
    backoff: timeouts.Backoff = field(default_factory=timeouts.Backoff)
    """The waits before the retries of idempotent tools that declare ``retries``."""
    traces: Traces | None = None
    """Where the run's spans go (:mod:`plangate.tracing`); None: the process's, off unless configured."""

    def __post_init__(self) -> None:
        self.catalogue = governed(self.catalogue, self.policy)  # the tools as the policy says they are

    def run(
        self,
        plan_id: str,
        version: int,
        plan: Plan,
        *,
        actor: str = "engine",
        rows: Mapping[int, StepRow] | None = None,
        claimed: PlanRow | None = None,
        failed: tuple[int, ...] = (),
        known: Unconfirmed | None = None,
    ) -> RunResult:
        """Run (or continue) the plan to its end or to a halt.

        The loop runs on a thread of its own; this thread waits, and carries the run on if
        a sync call made on that thread overruns its limit (see :class:`plangate.timeouts.Watch`).
        ``rows``: the plan's step rows as its claim read them (and held against its audit log), which
        the run then does not read again; else it reads them as it begins. ``claimed``: the plan's
        row as the run's owner claimed it, which its end moves on without reading it again. ``failed``:
        steps whose failure the run this one takes over recorded before it died, with no halt after it;
        this run halts on the first of them (as that run would have) and calls none of them again.
        ``known``: the outcomes a run of the same lease knew when its store went away (:class:`Unconfirmed`).
        """
        run = _Run(self, plan_id, version, plan, actor)
        run.known = None if rows is None else dict(rows)
        run.claimed = claimed
        run.unhalted = failed
        known = known or Unconfirmed()
        run.carried = known.by_step
        run.uncalled = set(known.uncalled)
        return run.watched()

    def record_known(
        self, plan_id: str, version: int, plan: Plan, rows: Mapping[int, StepRow], known: Unconfirmed, *, actor: str
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Record, in the caller's open transaction, the outcomes a run cut off from its store knew (``known``),
        where the run may not go on: its take-back's claim was refused by the tools or the policy now in force.
        What a tool answered is a fact, whatever may run next; left ``started``, a payment plangate knew was
        made would wait for a person to settle it. Each is recorded as the run would have (signed, a known
        overrun or broken call of a tool that is not idempotent as of unknown outcome), only where the step's
        record is still the answering attempt's ``started`` one, with no retry: nothing is called or started.
        A step whose tool is gone from the catalogue is left as it is. The steps recorded come back, and those
        whose outcomes were left so."""
        return _Run(self, plan_id, version, plan, actor).record_known(rows, known)

    def stepper(
        self,
        plan_id: str,
        version: int,
        plan: Plan,
        *,
        actor: str = "engine",
        traceparent: str | None = None,
        held: Callable[[], Mapping[int, StepRow]] | None = None,
        known: Unconfirmed | None = None,
    ) -> _Run:
        """The engine one step at a time (``one(step_id)``, then ``finish``), for an orchestrator.

        ``traceparent``: the run span the orchestrator opened, which the steps' spans join. ``held``: the
        plan's step rows held against its audit log, read in the open transaction under the log's lock: what
        ``one`` and ``finish`` act on, so no row changed after a check made apart from them is acted on
        (else they read the rows as stored). ``known``: what an attempt cut off from its store knew of its
        step's call (:class:`Unconfirmed`), recorded once, where the step's record is still that attempt's.
        """
        run = _Run(self, plan_id, version, plan, actor)
        run.spans = (self.traces or tracing.default()).joined(plan_id, traceparent)
        run.held = held
        run.carried = (known or Unconfirmed()).by_step
        return run


class _Run:
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

    # -- the loop ------------------------------------------------------------------------
    def watched(self) -> RunResult:
        """The loop on a thread of its own, under a watch; a call that overran leaves its thread behind."""
        self.watch = timeouts.Watch()
        self.spans = (self.e.traces or tracing.default()).run(self.plan_id, self.version, self.plan, actor=self.actor)
        with self.spans:
            result = self.watch.run(lambda: asyncio.run(self.go()), self._overran)
        assert isinstance(result, RunResult)
        return result

    def _overran(self, call: timeouts.Inline) -> Callable[[], object]:
        """In the caller's thread, while the loop's thread is stuck in the call: the run goes on without it."""
        self.finished.append(calls.timed_out(call.step_id, call.seconds, time.perf_counter() - call.seconds))
        return lambda: asyncio.run(self.go(load=False))

    async def go(self, *, load: bool = True) -> RunResult:
        """The loop. Its result goes to the watch as the event loop ends, or at once when an async call
        that overran is still there: one that ignores its cancellation would hold the event loop's end."""
        assert self.watch is not None
        try:
            result = await self._go(load)
        except timeouts.Abandoned:
            raise
        except BaseException as exc:
            if self.strays:
                self.watch.deliver(error=exc)
            raise
        if self.strays:
            self.watch.deliver(result)
        return result

    async def _go(self, load: bool = True) -> RunResult:
        try:
            return await self._loop(load)
        except Exception as exc:
            if not self.store.broken():
                raise
            raise await self._cut_off(exc) from exc

    async def _loop(self, load: bool) -> RunResult:
        self.halting = asyncio.Event()  # of this event loop (the run may go on in another after an overrun)
        while True:
            with self.store.transaction():
                self._tick()
                if load:  # what earlier runs recorded, read in the transaction that starts the first steps
                    self._load()
                    load = False
                self._sort_calls()
                self.recording = list(self.finished)  # until the commit confirms them (see _cut_off)
                self._record_finished()
                if not self.in_flight and (self.halt is not None or not self.waiting):
                    return self._end()  # the plan moves on only from the runner that holds it (_move)
                # What this transaction records (the outcomes above, even with nothing to start, or after the
                # renewals gave up) commits only while the runner still holds the plan: once another runner
                # claimed it and read the step as started, a late outcome is that runner's to decide.
                self._fence()
                lost = self.e.lease_lost is not None and self.e.lease_lost.is_set()
                if not lost:
                    self._check_lease()
                    launch = self.starting = self._start_ready()
                    if not launch and not self.in_flight and self.waiting and self.halt is None:
                        raise RuntimeError(f"engine stalled: steps {sorted(self.waiting)} can never start")
            self.recording, self.starting = [], []
            if lost:  # the outcomes just recorded commit (over their own started records, fenced); nothing starts
                raise self._lease_lost()
            if len(launch) == 1 and not self.in_flight and not self._tool(launch[0]).is_async:
                self.finished.append(self._call_inline(launch[0]))  # nothing else to overlap with
                continue
            for step_id in launch:
                self.in_flight[asyncio.create_task(self._call(step_id))] = step_id
            if self.in_flight:
                await self._next_done()

    async def _cut_off(self, cause: Exception) -> StoreLostError:
        """The store went away: the calls in flight are waited for (each within its limit), and the outcomes
        that no commit confirmed go back with the error, for the run that takes the plan back to record. So
        does what this run was given to record and has not loaded (the store went away again before its first
        transaction), and every step it knows was started and never called (a commit that failed here may not
        have started it again)."""
        answered = {outcome.step_id: outcome for outcome in [*self.recording, *self.finished]}
        ended = await asyncio.gather(*self.in_flight, return_exceptions=True)  # a retry's own commit fails too
        answered.update({outcome.step_id: outcome for outcome in ended if isinstance(outcome, Outcome)})
        self.in_flight.clear()
        known_by_step = {**self.carried, **{s: (self.rows[s].attempt, outcome) for s, outcome in answered.items()}}
        uncalled = self.uncalled | {(self.rows[step_id].attempt, step_id) for step_id in self.starting}
        known = Unconfirmed(tuple(known_by_step[s] for s in sorted(known_by_step)), tuple(sorted(uncalled)))
        held = f"; the outcomes of steps {known.steps} are known and not confirmed recorded" if known.outcomes else ""
        return StoreLostError(f"plan {self.plan_id}'s run lost its store ({cause}){held}", known)

    async def _next_done(self) -> None:
        """Wait for the next call (or retry) to end; once the run halts, retries waiting out a backoff stop."""
        if self.halt is not None:
            self.halting.set()
        done, _ = await asyncio.wait(self.in_flight, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            del self.in_flight[task]
            self.finished.append(task.result())

    # -- one step at a time, for an outside orchestrator (the Temporal backend) -------------
    def one(self, step_id: int) -> str:
        """Run exactly one step with the usual rules; its status comes back (repeat calls are safe).

        The run must have been claimed (:meth:`plangate.runtime.Runtime.start`). What it records
        before and after the call commits only while the run's owner still holds the plan running
        (a fence): a late attempt, paused while another took over or a person settled the step,
        changes nothing. A store that goes away after the call ends it with a
        :class:`~plangate.errors.StoreLostError` that carries the call's outcome, for the next attempt
        (``stepper(known=...)``) to record.
        """
        with self.store.transaction():
            self._tick()
            self._fence()
            # The log's lock before the step's record is read: two attempts of the step under one claim (an
            # orchestrator's retry beside an attempt it gave up on) pass the same fence, and on PostgreSQL
            # both would read the step as never started and both call its tool. Now one reads the other's start.
            self.store.lock_log()
            self._reload()
            row = self.rows.get(step_id)
            if row is not None and row.status in DONE:
                return row.status  # already done: the same answer again
            if row is not None and row.status == "failed" and self._failed_in_this_run(step_id):
                return row.status  # an attempt whose answer was lost, made again: the same answer again
            known = self._known(row) if row is not None else None
            if known is None:
                said = self._start_one(step_id, row)
                if said is not None:
                    return said
        try:
            outcome = self._one_call(step_id, known)
            with self.store.transaction():
                self._tick()
                self._fence()
                if not outcome.handled:
                    self._record_call(outcome)
                self._record_finished()
        except Exception as exc:
            if self.answered is None or not self.store.broken():
                raise
            raise self._one_cut_off(exc) from exc
        return self.rows[step_id].status

    def _start_one(self, step_id: int, row: StepRow | None) -> str | None:
        """Record the step as started (None: its tool is to be called), or say why it does not start."""
        if row is not None and row.status in ("started", "outcome_unknown"):
            self._unknown_outcome(row)
            if self.halt is not None:
                return "outcome_unknown"
        if not self.deps[step_id] <= self.outputs.keys():
            return "blocked"
        self.ready = [(0, step_id)]
        self._check_lease()
        return None if self._prepare(step_id) else self.rows[step_id].status

    def _one_cut_off(self, cause: Exception) -> StoreLostError:
        """The store went away after the step's call: its outcome goes back with the error, for the attempt
        that takes the step back under the same lease to record (as :meth:`_cut_off` does for a whole run)."""
        assert self.answered is not None
        attempt, outcome = self.answered
        held = f"the outcome of step {outcome.step_id} (attempt {attempt}) is known and not confirmed recorded"
        return StoreLostError(
            f"plan {self.plan_id} lost its store ({cause}): {held}", Unconfirmed(((attempt, outcome),))
        )

    def _failed_in_this_run(self, step_id: int) -> bool:
        """Whether the step's failure was recorded in this run (or the run it took over), with no halt since.

        A step that failed before (a halt, a step a person settled as not done) runs again when a person
        resumes or corrects the plan; one that failed in this run is never called again on its own: its
        tool may not be idempotent, and the orchestrator that asks again only lost the first answer.
        """
        return step_id in ledger.unhalted(self.store.events(self.plan_id))

    def _one_call(self, step_id: int, known: Outcome | None = None) -> Outcome:
        """The call and its retries, in this thread: an orchestrator's activity may block. ``known``: the
        outcome of the call an attempt cut off from its store made, in place of a call."""
        outcome = known or self._call_bounded(step_id)
        while True:
            self.answered = (self.rows[step_id].attempt, outcome)
            with self.store.transaction():
                self._tick()
                self._fence()  # the retry is recorded only while the runner holds the plan
                self._hold(step_id)  # and while the step is still this attempt's
                delay = self._retry_delay(outcome)
            if delay is None:
                return outcome
            time.sleep(delay)
            with self.store.transaction():
                self._tick()
                if not self._restart(step_id):
                    return replace(outcome, handled=True)
            outcome = self._call_bounded(step_id)

    def finish(self) -> RunResult:
        """Record how the run ended, from what the steps recorded."""
        with self.store.transaction():
            self._tick()
            self.store.lock_log()  # the rows read (and checked) are the ones the end is decided on
            self._reload()
            for sid in self.order:
                row = self.rows.get(sid)
                if self.halt is None and sid not in self.outputs:
                    self.halt = (sid, row.error or row.status if row else "the step never ran", None)
            return self._end()

    def _reload(self) -> None:
        """The recorded step rows (as checked, when the orchestrator checks them), and the outputs (or skips)
        of the steps that are done."""
        self.rows = dict(self.held()) if self.held is not None else self.store.steps(self.plan_id)
        for sid in self.order:
            row = self.rows.get(sid)
            if row is not None and row.status in DONE:
                self._recorded(row)

    def record_known(self, rows: Mapping[int, StepRow], known: Unconfirmed) -> tuple[tuple[int, ...], tuple[int, ...]]:
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
        return tuple(sorted(outcome.step_id for outcome in answered)), tuple(left)

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

    def _start_ready(self) -> list[int]:
        """Record ``started`` for every step that can start now (skips may unblock more)."""
        launch: list[int] = []
        while self.ready and self.halt is None and len(self.in_flight) + len(launch) < self.e.max_concurrency:
            _, step_id = heapq.heappop(self.ready)
            self.waiting.discard(step_id)
            if self._prepare(step_id):
                launch.append(step_id)
        return launch

    def _prepare(self, step_id: int) -> bool:
        """Condition, references, validation, policy (:func:`plangate._decide.decide`), then the durable ``started``."""
        step = self.steps[step_id]
        flow = self.flows.of(step_id)
        decision = decide(step, self._tool(step_id), self.e.policy, self.outputs, self.nulls, flow=flow)
        if decision.action == "skip":
            return self._skip(step, decision.reason)
        if decision.action == "fail":
            if decision.violation is not None:
                metrics.violations([decision.violation])
            return self._fail_before_call(step, decision.reason)
        params, kwargs = decision.params, decision.kwargs
        assert kwargs is not None
        previous = self.rows.get(step_id)
        attempt = previous.attempt + 1 if previous is not None else 1
        row = StepRow(
            plan_id=self.plan_id,
            step_id=step_id,
            version=self.version,
            status="started",
            attempt=attempt,
            idempotency_key=idempotency_key(self.plan_id, step_id),
            params=params,
            started_at=previous.started_at if previous and previous.status == "started" else self._now(),
        )
        self.rows[step_id] = row
        self.store.put_step(row)
        # A start this run knew was never called may not have committed: this one, at its attempt, may be called.
        self.uncalled.discard((attempt, step_id))
        self._event(
            "step.started",
            step_id,
            {
                "tool": step.tool,
                "params": params,
                "attempt": attempt,
                "idempotency_key": row.idempotency_key,
                **self._origin(step_id),
                **(decision.provenance or {}),
            },
        )
        self.kwargs[step_id] = kwargs
        self._report("started", step_id, "")
        self.spans.step_started(step_id, step.tool, attempt)
        return True

    def _skip(self, step: Step, why: str) -> bool:
        self._done(step.id, SKIPPED)
        row = StepRow(
            plan_id=self.plan_id,
            step_id=step.id,
            version=self.version,
            status="skipped",
            attempt=0,
            idempotency_key=idempotency_key(self.plan_id, step.id),
            error=why,
            finished_at=self._now(),
        )
        self.rows[step.id] = row
        self.store.put_step(row)
        self._event("step.skipped", step.id, {"reason": why})
        self._report("skipped", step.id, why)
        self.store.on_commit(self.spans.step_ended, step.id, step.tool, "skipped", why)
        return False

    def _fail_before_call(self, step: Step, error: str) -> bool:
        previous = self.rows.get(step.id)
        row = StepRow(
            plan_id=self.plan_id,
            step_id=step.id,
            version=self.version,
            status="failed",
            attempt=(previous.attempt if previous else 0) + 1,
            idempotency_key=idempotency_key(self.plan_id, step.id),
            error=error,
            finished_at=self._now(),
        )
        self.rows[step.id] = row
        self.store.put_step(row)
        self._event("step.failed", step.id, {"error": error, "before_call": True})
        self._report("failed", step.id, error)
        self.store.on_commit(self.spans.step_ended, step.id, step.tool, "failed", error)
        self.halt = (step.id, error, None)
        return False

    # -- calling tools -------------------------------------------------------------------
    def _context(self, step_id: int) -> RunContext:
        row = self.rows[step_id]
        return RunContext(
            plan_id=self.plan_id,
            step_id=step_id,
            now=parse_iso(row.started_at or self._now()),
            attempt=row.attempt,
            trace_context=self.spans.traceparent(step_id),
        )

    def _arguments(self, step_id: int) -> tuple[Tool, dict[str, Any], Callable[..., Any]]:
        """The tool, its arguments, and its function made to run with the step's span current."""
        tool = self._tool(step_id)
        kwargs = self.kwargs.pop(step_id)
        if tool.ctx_param is not None:
            kwargs[tool.ctx_param] = self._context(step_id)
        return tool, kwargs, self.spans.wrap(step_id, tool.fn, tool.is_async)

    def _call_inline(self, step_id: int) -> Outcome:
        """A sync call on the loop's own thread (nothing else to overlap with), under the watch's eye."""
        if self.watch is None:
            return self._call_bounded(step_id)
        tool, kwargs, fn = self._arguments(step_id)
        limit = timeouts.call_limit(tool, self.e.policy)
        return calls.inline(self.steps[step_id], tool, kwargs, limit, self.watch, fn=fn)

    def _call_bounded(self, step_id: int) -> Outcome:
        """A call on a thread of its own, waited for up to its limit (for :meth:`one`: no loop, no watch)."""
        tool, kwargs, fn = self._arguments(step_id)
        limit = timeouts.call_limit(tool, self.e.policy)
        return calls.bounded(self.steps[step_id], tool, kwargs, limit, self.pool, fn=fn)

    async def _call(self, step_id: int) -> Outcome:
        if self.watch is not None and self.watch.stopped:
            raise timeouts.Abandoned  # nobody waits for the run any more: call nothing
        tool, kwargs, fn = self._arguments(step_id)
        seconds = timeouts.call_limit(tool, self.e.policy)
        outcome = await calls.on_loop(self.steps[step_id], tool, kwargs, seconds, self.pool, fn=fn)
        self.strays += tool.is_async and outcome.timed_out is not None  # cancelled, not waited for
        return outcome

    # -- after a call: retry, unknown outcome, or record -----------------------------------
    def _sort_calls(self) -> None:
        """Calls to make again go back in flight; the rest are recorded (inside the loop's transaction)."""
        finished, self.finished = self.finished, []
        for outcome in finished:
            if outcome.ok:
                self.finished.append(outcome)
                continue
            if outcome.handled:
                continue
            delay = self._retry_delay(outcome)
            if delay is not None:
                self.in_flight[asyncio.create_task(self._retry(outcome, delay))] = outcome.step_id
            else:
                self._record_call(outcome)

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

    def _retry_delay(self, outcome: Outcome) -> float | None:
        """How long to wait before calling again, recorded as ``step.retrying``; None when the outcome stands.

        Only an idempotent tool's raise or overrun is retried, within its ``retries``, and not
        once the run is halting.
        """
        tool, step_id = self._tool(outcome.step_id), outcome.step_id
        done = self.retried.get(step_id, 0)
        if not outcome.retryable or self.halt is not None or done >= timeouts.retries(tool, self.e.policy):
            return None
        row = self.rows[step_id]
        delay = self.e.backoff.delay(row.idempotency_key, row.attempt + 1)
        self.retried[step_id] = done + 1
        reason = (
            f"{outcome.error}; {tool.name!r} is idempotent, so it runs again with the same key {row.idempotency_key}"
        )
        self._event("step.retrying", step_id, {"reason": reason, "attempt": row.attempt + 1, "delay": delay})
        self.spans.step_retrying(step_id, row.attempt + 1, reason, delay)
        return delay

    async def _retry(self, last: Outcome, delay: float) -> Outcome:
        with contextlib.suppress(TimeoutError):  # other steps go on meanwhile; a halt ends the wait
            await asyncio.wait_for(self.halting.wait(), timeout=delay)
        if self.halt is not None or (self.watch is not None and self.watch.stopped):
            return replace(last, retryable=False)
        with self.store.transaction():
            self._tick()
            if not self._restart(last.step_id):
                return replace(last, handled=True)
        return await self._call(last.step_id)

    def _restart(self, step_id: int) -> bool:
        """A new ``started`` record (attempt + 1, the same key), under the lease, as for any step, in place of
        this attempt's own record only."""
        if self.e.owner is not None:
            self.store.fence(self.plan_id, self.e.owner)
        self._check_lease()
        self._hold(step_id)
        return self._prepare(step_id)

    def _hold(self, step_id: int) -> None:
        """This transaction commits only while the step's record is still the ``started`` one this run made.

        An orchestrator may run one step in two attempts at once (Temporal runs an activity again once
        its heartbeats stop, while the first may still run): one that completed the step, or took it
        over, is never undone by the other's retry, which would call the tool again and record over it.
        """
        attempt = self.rows[step_id].attempt
        self.store.hold_step(
            self.plan_id,
            step_id,
            attempt=attempt,
            lost=f"step {step_id}'s record changed while its call (attempt {attempt}) ran: another attempt "
            "completed it or took it over, or a person settled it; this attempt makes no retry, and stops here",
        )

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
