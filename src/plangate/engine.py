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
from typing import Any

from plangate import _calls as calls
from plangate import ledger, metrics, timeouts, tracing
from plangate._calls import Outcome
from plangate._clock import Clock, parse_iso
from plangate._decide import SKIPPED, decide
from plangate._overrides import governed
from plangate._runrecords import RunRecords, Unconfirmed
from plangate.errors import StoreLostError
from plangate.plan import Plan, Step
from plangate.policy import Policy
from plangate.results import Progress, RunResult
from plangate.store import DONE, PlanRow, StepRow, Store
from plangate.tools import Catalogue, RunContext, Tool, idempotency_key
from plangate.tracing import Traces

__all__ = ["DEFAULT_CONCURRENCY", "Engine", "Unconfirmed"]  # Unconfirmed's home for callers is here

DEFAULT_CONCURRENCY = 8


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
    ) -> tuple[dict[int, StepRow], tuple[int, ...]]:
        """Record, in the caller's open transaction, the outcomes a run cut off from its store knew (``known``),
        where the run may not go on: its take-back's claim was refused by the tools or the policy now in force.
        What a tool answered is a fact, whatever may run next; left ``started``, a payment plangate knew was
        made would wait for a person to settle it. Each is recorded as the run would have (signed, a known
        overrun or broken call of a tool that is not idempotent as of unknown outcome), only where the step's
        record is still the answering attempt's ``started`` one, with no retry: nothing is called or started.
        A step whose tool is gone from the catalogue is left as it is. The step rows as recorded come back, and
        the steps whose outcomes were left so (:meth:`Unconfirmed.refused` says what became of each)."""
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


class _Run(RunRecords):
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
