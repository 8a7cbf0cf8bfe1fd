"""Workers: processes that claim approved plans and run them, many at once, on one machine or many.

A worker runs up to ``concurrency`` plans at the same time. It leases plans (``approved``,
or ``running`` under a lease that expired because its worker died) in batches, one
statement taking up to its free capacity; on PostgreSQL the claim uses ``FOR UPDATE SKIP
LOCKED``, so workers never wait for each other or take the same plan; on SQLite the
database's write lock serialises claims. Each plan runs on a runner thread of its own with
``resume`` semantics, over a store connection taken from the worker's pool (a runtime per
connection, made once and reused), under its own lease, which a timer renews while the
plan runs (:class:`plangate.lifecycle.LeaseKeeper`), so a step longer than the lease keeps
it. The lease is released at the end. On PostgreSQL a worker whose clock is too far from the
database server's claims nothing until they agree (:attr:`Worker.clock_problem` says why).

:meth:`Worker.stop` (``SIGTERM`` for ``plangate worker``) drains: no new claims, running
plans go on for up to ``drain_timeout`` seconds, and the leases of those still running
then are released. A killed worker's plans are taken over by workers once their leases
expire (a worker's claim goes by the lease's expiry alone; ``plangate resume`` on the same
machine takes over at once a lease naming a dead process), and the engine's resume rules
decide what runs again: never a completed step, an idempotent step with no
outcome under the same key, anything else halts for a person.

A run whose store goes away mid-run (a PostgreSQL restart, a network cut) is not lost with its
connection: it waits for the store, at most until the run's lease would have run out (or the drain),
claims the run again under that same lease, and records the outcomes its tools had answered
(:class:`plangate.engine.Unconfirmed`), once; a lease lost meanwhile records nothing, and says so.
That is the runtime's (:meth:`Runtime.drive`), as for any run; the worker names its drain, and the run's
lease that the drain releases is the one a take-back claims again, so a claim that lands as the drain ends
leaves nothing held.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from plangate import lifecycle, timeouts
from plangate._clock import Clock, SystemClock, iso
from plangate.errors import GovernanceError, LeaseLostError, PlangateError, StateError, StoreLostError
from plangate.policy import Policy
from plangate.results import RunResult
from plangate.runtime import Runtime
from plangate.store import Store, open_store
from plangate.tools import Catalogue

DEFAULT_CONCURRENCY = 8
"""Plans a worker runs at once unless told otherwise."""
CLOCK_CHECK_SECONDS = 60.0
"""How often a worker compares its clock with the database server's (at most: at its claims)."""
CLOCK_RECHECK_SECONDS = 2.0
"""How often a worker that claims nothing for its clock compares again (at most: at its claims)."""
TOLD_KEPT = 1000
"""How many of the newest reasons ``Worker.refused`` and ``Worker.failed`` keep."""
ASIDE_SECONDS = (1.0, 60.0)
"""How long a plan that could not run (refused, or failed before its run could begin or end) is left
before it is claimed again: the first wait, doubled each time it fails again, up to the second."""
ROLLBACK_POLL = 5.0
"""How often a worker looks for rollbacks the policy began whose runner stopped (at most, in seconds)."""


def _cut_off_rollbacks(skipped: int) -> str:
    """The rollbacks the policy began (its runner is named for it) whose lease ran out, and those whose lease was
    given back (at a drain: the name is gone with it), the oldest few, ``skipped`` ids left out (those set aside:
    else a few that cannot be carried on would be taken at every look, and hide the rest). The owner's name only
    picks them: each is proven the policy's from the audit log (:meth:`Runtime.carry_on_rollback`)."""
    excluded = f" AND id NOT IN ({', '.join('?' for _ in range(skipped))})" if skipped else ""
    return (
        "SELECT id FROM plans WHERE kind = 'plan' AND status = 'compensating'"
        f" AND (lease_owner IS NULL OR (lease_owner LIKE 'policy:%' AND lease_until < ?)){excluded}"
        " ORDER BY created_at, id LIMIT 8"
    )


@dataclass
class _Aside:
    until: float  # time.monotonic() until which the plan is not claimed
    times: int  # how many times in a row it could not run
    said: str  # what was last said of it (said once, not at every try)


_log = logging.getLogger("plangate.worker")


@dataclass
class Worker:
    catalogue: Catalogue
    db: str | None = None
    policy: Policy | None = None
    lease_seconds: float = 30.0
    name: str = field(default_factory=lambda: lifecycle.runner(f"worker-{id(object()):x}"))
    clock: Clock = field(default_factory=SystemClock)
    concurrency: int = DEFAULT_CONCURRENCY
    """Plans run at the same time, each on its own runner thread and store connection."""
    drain_timeout: float = 30.0
    """After :meth:`stop`, how long running plans may go on before their leases are released."""
    refused: list[str] = field(default_factory=list)
    """Plans this worker claimed but was not allowed to run, and why (each reason once; the newest TOLD_KEPT)."""
    failed: list[str] = field(default_factory=list)
    """Plans whose run ended in an error other than a halt (the store went away, the plan changed meanwhile);
    each reason once, the newest TOLD_KEPT."""
    left: list[str] = field(default_factory=list)
    """Plans still running when the drain ended: their leases were released for the next worker."""
    clock_problem: str | None = None
    """Why this worker claims nothing for now: its clock too far from the database server's (None: it claims)."""

    def __post_init__(self) -> None:
        self._check()
        self._idle: list[Runtime] = []  # the pool: a runtime (and its store connection) per runner, reused
        self._claims: Store | None = None  # the claiming connection
        self._cond = threading.Condition()
        self._running: dict[str, str] = {}  # plan id -> the lease owner running it
        self._rolling: dict[str, str] = {}  # plan id -> the lease the policy's rollback takes if its run halts
        self._starting: dict[str, str] = {}  # plan id -> the lease its run's claim takes, until the claim answers
        self._aside: dict[str, _Aside] = {}  # plans that could not run, left alone for a while
        self._outage = timeouts.Outage(_log, f"worker {self.name}")  # claims failed in a row: the store away
        self._stopping = threading.Event()
        self._drained = threading.Event()  # the drain's end: runs still waiting for their store give up
        self._clock_due = 0.0  # when to compare the clocks again (time.monotonic)
        self._ran = 0  # runs that came to an end or a halt
        self._ended = 0  # runs that ended in any way: capacity freed
        self._rollbacks_due = time.monotonic()  # when to look for rollbacks to carry on again (if idle)

    def _check(self) -> None:
        """Refuse what the command line refuses. A concurrency or lease the claim's SQL cannot take failed
        every claim, which was waited out for ever as a store out of reach; a lease of 0 s or less was renewed
        in a loop that never waited, and one too short ran out between renewals; an infinite drain raised in the
        drain, leaving the running plans' leases."""
        if not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ValueError(f"a worker's concurrency is a whole number, at least 1, not {self.concurrency!r}")
        least, most = timeouts.LEAST_LEASE_SECONDS, timeouts.MOST_SECONDS
        if not least <= self.lease_seconds <= most:  # NaN fails every comparison
            raise ValueError(f"a worker's lease_seconds is from {least:g} to {most:g}, not {self.lease_seconds}")
        if not 0 <= self.drain_timeout <= most:
            raise ValueError(f"a worker's drain_timeout is from 0 to {most:g} seconds, not {self.drain_timeout}")

    # -- the loop ------------------------------------------------------------------------
    def serve(
        self, *, drain: bool = False, poll: float = 1.0, on_result: Callable[[RunResult], object] | None = None
    ) -> int:
        """Run plans until stopped (or, with ``drain``, until none is left). Returns how many ran."""
        self._drained.clear()  # an earlier serve's drain gave up its own runs' waits for the store, not these
        try:
            while not self._stopping.is_set():
                with self._cond:
                    seen = self._ended
                try:
                    claimed = self._claim_free()
                except Exception as exc:  # noqa: BLE001 - a store out of reach (a restart, a cut) is waited out
                    self._store_lost(exc)
                    continue
                self._outage.over()
                if self._stopping.is_set():  # stopped during the claim: what it took is given back, not started
                    self._give_back(claimed)
                    break
                with self._cond:
                    for plan_id, owner in claimed:
                        self._start(plan_id, owner, functools.partial(self._run_told, plan_id, owner, on_result))
                self._carry_on_rollbacks(idle=not claimed)
                with self._cond:
                    if not claimed and drain and not self._running:
                        break
                    # Wake when a run ends (capacity is free again), when stopped, or to poll for new plans.
                    self._cond.wait_for(functools.partial(self._woken, seen), timeout=poll)
        finally:
            self._drain()
        return self._ran

    def _store_lost(self, exc: Exception) -> None:
        """The claim failed: the claiming connection, and the pool's idle ones, are dropped and made again
        after a wait (doubled each time, up to timeouts.STORE_RETRY_SECONDS[1]); said once for the outage. Running
        plans go on as they can (each on its own connection; one whose store fails ends, is set aside,
        and its connection is made again)."""
        wait = self._outage.failed(exc)
        self._drop_connections()
        with self._cond:  # not the event's own lock, which a SIGTERM's stop() would wait for if it came now
            self._cond.wait_for(self._stopping.is_set, timeout=wait)

    def _drop_connections(self) -> None:
        """Drop the claiming connection and the pool's idle ones: the claim's failed, and an outage most likely
        cut them all."""
        with self._cond:
            claims, self._claims = self._claims, None
            idle, self._idle = self._idle, []
        self._dropped_store(claims)
        for runtime in idle:
            self._dropped(runtime)

    @property
    def store_problem(self) -> str | None:
        """Why the claims fail while the store cannot be reached (None: it answers)."""
        return self._outage.problem

    @staticmethod
    def _dropped_store(store: Store | None) -> None:
        """Close a store connection that is not used again (it may be broken)."""
        if store is not None:
            with contextlib.suppress(Exception):  # a broken connection may refuse to close
                store.close()

    def _woken(self, seen: int) -> bool:
        return self._ended != seen or self._stopping.is_set()

    def stop(self) -> None:
        """Stop claiming; :meth:`serve` lets running plans finish (up to ``drain_timeout``) and returns.

        Called from a signal handler too: the thread serving never holds a lock that this waits for
        (the condition's is reentrant; the event's is taken here alone), so a signal never wedges it."""
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()

    def run_one(self) -> RunResult | None:
        """Claim and run one plan on this thread; None when there is nothing to do."""
        self._drained.clear()  # as in serve: a drain before this gave up its own runs' waits, not this one's
        while True:
            claimed = self._claim(1)
            if not claimed:
                return None
            plan_id, owner = claimed[0]
            with self._cond:
                self._running[plan_id] = owner
            result = self._run(plan_id, owner)
            if result is not None:
                return result

    def close(self) -> None:
        """Close the pool's store connections and end the catalogue's connections to MCP servers."""
        with self._cond:
            idle, self._idle = self._idle, []
            claims, self._claims = self._claims, None
        for runtime in idle:
            runtime.store.close()
        if claims is not None:
            claims.close()
        self.catalogue.close()

    # -- claims --------------------------------------------------------------------------
    def _claim_free(self) -> list[tuple[str, str]]:
        with self._cond:
            free = self.concurrency - len(self._running)
        return self._claim(free) if free > 0 else []

    def _claim(self, limit: int) -> list[tuple[str, str]]:
        """Up to ``limit`` plans leased in one statement, each with the owner that will run it."""
        if self._clock_off():
            return []
        owner = lifecycle.runner(self.name.partition("#")[0])  # a new owner per batch: one plan, one runner
        for again in (False, True):
            store = self._claiming()
            try:
                ids = store.claim_batch(owner, iso(self.clock.now()), self._until(), limit, self._left_aside())
                break
            except Exception:
                if again or not store.broken():
                    raise
                # An outage cut it while idle, which shows only once it is used: once more, on a new one.
                self._drop_connections()
        return [(plan_id, owner) for plan_id in ids]

    def _left_aside(self) -> list[str]:
        """The plans not to claim now; those whose wait ended long ago are forgotten."""
        now = time.monotonic()
        with self._cond:
            for plan_id in [p for p, aside in self._aside.items() if aside.until + 10 * ASIDE_SECONDS[1] < now]:
                del self._aside[plan_id]
            return sorted(plan_id for plan_id, aside in self._aside.items() if aside.until > now)

    def _set_aside(self, plan_id: str, why: str, told: list[str], level: int = logging.WARNING) -> None:
        """Leave a plan that could not run for a while (longer each time in a row), and say why once.

        Without it, a plan that cannot run (its text changed outside plangate, a record that cannot
        be read, a store refusing connections) was claimed again at once, failed again at once, and
        held a worker in a loop that logged the same lines thousands of times a second.
        """
        with self._cond:
            last = self._aside.get(plan_id)
            times = last.times + 1 if last is not None else 1
            wait = timeouts.doubled(ASIDE_SECONDS, times)
            self._aside[plan_id] = _Aside(time.monotonic() + wait, times, why)
        if last is None or last.said != why:
            told.append(f"{plan_id}: {why}")
            del told[:-TOLD_KEPT]  # the newest only: reasons that vary would otherwise pile up for ever
            _log.log(level, "plan %s: %s (not claimed again for %g s, longer if it fails again)", plan_id, why, wait)

    def _clock_off(self) -> bool:
        """Whether this machine's clock is too far from the database server's to claim (see clock_problem).

        A lease is a time written by the runner's clock and read by the others': a worker whose
        clock runs ahead sees live leases as expired and takes over plans whose runners are alive
        (nothing runs twice, but a call cut off halts for a person); one whose clock lags writes
        leases that others see expire early. Within a quarter of the lease the renewals (every
        third of it) keep every lease live on every clock; past that, this worker claims nothing,
        and says why, until the clocks agree again.
        """
        if time.monotonic() < self._clock_due:
            return self.clock_problem is not None
        store = self._claiming()  # connected first: the round trip timed is the question's alone
        before = self.clock.now()
        theirs = store.database_time()  # a store out of reach: compared again at the next claim
        after = self.clock.now()
        if theirs is None:  # no server: one machine, one clock
            self._clock_due = time.monotonic() + CLOCK_CHECK_SECONDS
            return False
        # The server read its clock somewhere between before and after (a slow round trip, a busy machine):
        # this clock is off it by something between these two.
        problem = self._off_by((before - theirs).total_seconds(), (after - theirs).total_seconds())
        if problem != self.clock_problem:
            if problem is not None:
                _log.error("worker %s: %s", self.name, problem)
            else:
                _log.warning("worker %s: its clock agrees with the database server's again: claiming", self.name)
        self.clock_problem = problem
        self._clock_due = time.monotonic() + (CLOCK_CHECK_SECONDS if problem is None else CLOCK_RECHECK_SECONDS)
        return problem is not None

    def _off_by(self, early: float, late: float) -> str | None:
        """Why a clock off the server's by something from ``early`` to ``late`` seconds (ahead: > 0) may not
        claim, if it may not: off by more than a quarter of the lease for certain, or perhaps (a slow answer)."""
        bound = self.lease_seconds / 4
        ahead = max(early, 0.0) - max(-late, 0.0)  # at least this far off
        rule = (
            f"with {self.lease_seconds:g}-second leases a worker may be at most {bound:g} s off, or it could take "
            "over plans whose runners are alive: claiming nothing until"
        )
        if abs(ahead) > bound:
            way = "ahead of" if ahead > 0 else "behind"
            return (
                f"this machine's clock is at least {abs(ahead):.1f} s {way} the database server's; {rule} "
                "the clocks agree (set the time right, e.g. with NTP)"
            )
        if max(-early, late) > bound:  # the server's moment lies within the round trip: which end, nobody knows
            return (
                f"the database server took {late - early:.1f} s to answer, so this machine's clock may be anywhere "
                f"from {early:+.1f} s to {late:+.1f} s off the server's (+: ahead); {rule} an answer comes quickly "
                "enough to tell"
            )
        return None

    def _give_back(self, claimed: list[tuple[str, str]]) -> None:
        """Release these leases (claimed but not started, or left at the drain), so that the plans need not
        wait for them to expire; one that cannot be released (the store out of reach) expires by itself."""
        for plan_id, owner in claimed:
            try:
                self._claiming().release(plan_id, owner)
            except Exception as exc:  # noqa: BLE001 - the store out of reach: the lease then expires by itself
                _log.warning("plan %s: giving the claim back failed (it will expire): %s", plan_id, exc)

    def _claiming(self) -> Store:
        """The claiming connection, made when first needed (again after an outage dropped or broke it); runner
        threads use it too (to give a plan back), so it is swapped under the lock."""
        with self._cond:
            if self._claims is not None and not self._claims.broken():
                return self._claims
            broken, self._claims = self._claims, None
        self._dropped_store(broken)
        made = open_store(self.db)  # not under the lock: a connection may take its time
        with self._cond:
            claims = self._claims = self._claims or made
        if claims is not made:
            self._dropped_store(made)  # another thread made one first
        return claims

    # -- rollbacks the policy began, cut off -----------------------------------------------
    def _carry_on_rollbacks(self, *, idle: bool) -> None:
        """Carry on the rollbacks the policy began whose runner stopped, once their lease ran out or was given back
        (a drain's end, a run that failed): looked for when the worker claimed nothing (``idle``), every
        ROLLBACK_POLL seconds at most, and by a busy worker once a minute; a few at a time, each on a runner thread
        within the concurrency, like a plan's run, so that claims go on meanwhile and the drain gives it up at its
        deadline. A person's rollback is left to them."""
        now = time.monotonic()
        if now < self._rollbacks_due or (not idle and now < self._rollbacks_due + 60.0 - ROLLBACK_POLL):
            return
        self._rollbacks_due = now + ROLLBACK_POLL
        aside = self._left_aside()
        try:
            rows = self._claiming().query(_cut_off_rollbacks(len(aside)), (iso(self.clock.now()), *aside))
        except Exception as exc:  # noqa: BLE001 - a store out of reach: the next claim says so, and waits it out
            _log.debug("looking for rollbacks to carry on failed: %s", exc)
            return
        for (plan_id,) in rows:
            owner = self._policy_runner(self.policy)  # the lease its drain gives back
            with self._cond:
                if len(self._running) >= self.concurrency or self._stopping.is_set():
                    return
                if plan_id not in self._running:
                    self._start(plan_id, owner, functools.partial(self._roll_back, plan_id, owner))

    @staticmethod
    def _policy_runner(policy: Policy | None) -> str:
        """The lease of a rollback the policy runs (named for it: a worker finds one whose runner stopped)."""
        return lifecycle.runner(f"policy:{policy.name if policy is not None else ''}")

    def _roll_back(self, plan_id: str, owner: str) -> None:
        """Carry on the policy's rollback of the plan under the lease ``owner`` (on its runner thread)."""
        runtime: Runtime | None = None
        healthy = True
        try:
            runtime = self._runtime()
            result = runtime.carry_on_rollback(plan_id, owner=owner, stop=self._drained)
            _log.warning("plan %s: the policy's rollback carried on: %s", plan_id, result.status)
        except (StateError, LeaseLostError):
            pass  # another runner carries it on now, or the drain gave it up
        except PlangateError as exc:
            self._set_aside(plan_id, str(exc), self.refused)
        except Exception as exc:  # noqa: BLE001 - a broken connection must not end the worker
            healthy = False
            self._set_aside(plan_id, str(exc), self.failed)
        finally:
            self._finish(plan_id, owner, runtime if healthy else self._dropped(runtime), ran=False)

    # -- runs ----------------------------------------------------------------------------
    def _start(self, plan_id: str, owner: str, work: Callable[[], object]) -> None:
        """Do ``work`` (the plan's run, or the policy's rollback of it) under the lease ``owner``, on a runner
        thread of its own (called holding the condition)."""
        self._running[plan_id] = owner
        # A daemon: a run that overran the drain is left to the next worker, not waited for at exit.
        try:
            threading.Thread(target=work, name=f"plangate-worker-{plan_id[:8]}", daemon=True).start()
        except RuntimeError as exc:  # no thread to be had (the process is out of them): the plan is given back
            del self._running[plan_id]
            self._set_aside(plan_id, f"no runner thread could be started ({exc})", self.failed, logging.ERROR)
            self._give_back([(plan_id, owner)])

    def _run_told(self, plan_id: str, owner: str, on_result: Callable[[RunResult], object] | None) -> None:
        result = self._run(plan_id, owner)
        if result is not None and on_result is not None:
            on_result(result)

    def _run(self, plan_id: str, owner: str) -> RunResult | None:
        runtime: Runtime | None = None
        result: RunResult | None = None
        healthy = True
        with self._cond:  # named before the claim, so that a drain as it commits releases it too
            claiming = self._starting[plan_id] = lifecycle.claimant(owner)
        try:
            runtime = self._runtime()  # a new connection may be refused: the claim is then given back below
            # resume's own checks are the claim's (lifecycle.claim): start at once, without reading the plan twice;
            # only under this claim's lease (a drain may have given it back meanwhile, or a person's decision)
            claim = runtime.start(plan_id, actor=f"worker:{self.name}", owner=owner, leased=True, lease=claiming)
            rollback = self._policy_runner(claim.policy)
            owner = self._run_under(plan_id, owner, claim.owner, rollback)
            # cut off from its store, the run waits for it (within the lease; a stop alone does not end the wait,
            # the drain's end does) and takes itself back, under the lease the drain releases
            result = runtime.drive(claim, rollback_owner=rollback, stop=self._drained)
        except GovernanceError as refused:  # it may not run: sent back for approval, or the log disagrees
            self._set_aside(plan_id, str(refused), self.refused, logging.ERROR)
        except LeaseLostError as lost:  # another runner has the plan now, or the drain gave it back
            _log.warning("plan %s: %s", plan_id, lost)
        except StoreLostError as cut:  # not back within the lease: the next run decides what this one knew
            self._set_aside(plan_id, str(cut), self.failed, logging.ERROR)
        except PlangateError as exc:
            self._set_aside(plan_id, str(exc), self.failed)
        except Exception as exc:  # noqa: BLE001 - a broken connection must not end the worker: drop the runtime
            healthy = False
            self._set_aside(plan_id, str(exc), self.failed)
            _log.debug("plan %s", plan_id, exc_info=True)
        else:
            with self._cond:
                self._aside.pop(plan_id, None)
        finally:
            kept = runtime if healthy else self._dropped(runtime)
            self._finish(plan_id, owner, kept, ran=result is not None, claiming=claiming)
        return result

    def _run_under(self, plan_id: str, leased: str, claimed: str, rollback: str) -> str:
        """The run's own lease, which took the place of the worker's at its claim: what the drain and the
        end release from now on, with the lease the policy's rollback takes if the run halts. If the drain
        gave the plan up meanwhile, this lease is given back too."""
        with self._cond:
            self._starting.pop(plan_id, None)  # the claim answered: its lease is the run's now, or given back below
            if self._running.get(plan_id) == leased:
                self._running[plan_id] = claimed
                self._rolling[plan_id] = rollback
                return claimed
        self._give_back([(plan_id, claimed)])
        raise LeaseLostError(f"plan {plan_id} was given back at the drain as its run began: it does not run")

    def _finish(
        self, plan_id: str, owner: str, runtime: Runtime | None, *, ran: bool, claiming: str | None = None
    ) -> None:
        if runtime is not None and runtime.store.broken():  # cut off, and not back in time: not kept in the pool
            runtime = self._dropped(runtime)
        with self._cond:
            if claiming is not None and self._starting.get(plan_id) == claiming:  # the claim never answered
                del self._starting[plan_id]
            if self._running.get(plan_id) != owner:  # the drain gave it up already: its lease is released
                self._dropped(runtime)  # nor is its connection kept: the worker is closing
                return
            rolling = self._rolling.get(plan_id)
        try:
            if not ran:  # a run that came to its end or a halt gave the lease up in its last transaction; one that
                # failed gives back the policy's rollback too, if it began: else held until it ran out, by nobody
                store = runtime.store if runtime is not None else self._claiming()
                for lease in (owner, rolling) if rolling is not None else (owner,):
                    store.release(plan_id, lease)
        except Exception as exc:  # noqa: BLE001 - the lease then expires by itself; the connection is dropped
            _log.warning("plan %s: releasing the lease failed: %s", plan_id, exc)
            runtime = self._dropped(runtime)
        with self._cond:
            # Only this run's entry: once the lease was released the plan may have been claimed again,
            # and that run must stay counted (for the concurrency, and for the drain to release it).
            if self._running.get(plan_id) == owner:
                del self._running[plan_id]
                self._rolling.pop(plan_id, None)
            self._ran += ran
            self._ended += 1
            if runtime is not None:
                self._idle.append(runtime)
            self._cond.notify_all()

    @staticmethod
    def _dropped(runtime: Runtime | None) -> None:
        """Close a runtime that is not given back to the pool (its connection may be broken): None."""
        Worker._dropped_store(runtime.store if runtime is not None else None)

    def _runtime(self) -> Runtime:
        """One of the pool's runtimes, or a new one on a connection of its own."""
        with self._cond:
            if self._idle:
                return self._idle.pop()
        return Runtime(self.catalogue, self.policy, db=self.db, clock=self.clock, lease_seconds=self.lease_seconds)

    def _drain(self) -> None:
        """Wait for running plans up to the drain timeout; release the leases of those still running."""
        deadline = time.monotonic() + self.drain_timeout
        with self._cond:
            self._cond.wait_for(lambda: not self._running, timeout=max(0.0, deadline - time.monotonic()))
            left, self._running = dict(self._running), {}
            rolling, self._rolling = self._rolling, {}
            starting, self._starting = self._starting, {}  # claims in flight: whether or not they commit first
        self._drained.set()  # a run waiting for its store to take itself back gives up (Runtime.drive's stop)
        # The engine's next fence fails without the lease: the run (or the rollback the policy began as it
        # halted) records nothing more, and the next worker resumes it under the usual rules (a step cut
        # off mid-call is not re-run blindly).
        self._give_back([*left.items(), *rolling.items(), *starting.items()])
        self.left.extend(left)

    def _until(self) -> str:
        return iso(self.clock.now() + timedelta(seconds=self.lease_seconds))
