"""What every part of :class:`plangate.react.ReActAgent` stands on: the agent's settings, its run's lease, and how the
run is recorded (its events, its model calls' costs, its end), a store that went away mid-write waited out and the
run taken back under its own lease."""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, TypeVar

from plangate import (
    _storeback,
    approval,
    lifecycle,
    metrics,
)
from plangate._clock import Clock, SystemClock, iso
from plangate._reactstate import Mode, ReActStep, RunState
from plangate.costs import PriceTable
from plangate.engine import Unconfirmed
from plangate.errors import LeaseLostError, StateError, StoreLostError
from plangate.models import Model, Usage
from plangate.policy import Policy
from plangate.store import CallRow, PlanRow, Store
from plangate.tools import Catalogue
from plangate.tracing import Traces

T = TypeVar("T")


@dataclass
class ReActBase:
    """The agent's settings and records (see :class:`plangate.react.ReActAgent`, which is this with its loop)."""

    model: Model
    catalogue: Catalogue
    store: Store
    policy: Policy | None = None
    clock: Clock = field(default_factory=SystemClock)
    prices: PriceTable = field(default_factory=PriceTable.load)
    mode: Mode = "text"
    thoughts: bool = True  # False: Act-only (actions without thoughts), the ReAct paper's baseline
    max_steps: int = 10
    max_unparsed: int = 2
    max_tokens: int = 1024
    user: str = "react"
    role: str | None = None
    category: str = "react"
    on_step: Callable[[ReActStep], None] | None = None
    lease_seconds: float = 30.0
    traces: Traces | None = None
    """Where the run's spans go (:mod:`plangate.tracing`); None: the process's, off unless configured."""
    _lease: contextlib.ExitStack | None = field(default=None, init=False, repr=False)  # the run's lease keeper
    _made: Store | None = field(default=None, init=False, repr=False)  # a connection made again after a cut

    def __post_init__(self) -> None:
        # The role comes from the policy; a claim may only name the role the user holds.
        self.role = approval.held_role(self.policy, self.user, self.role)

    def close(self) -> None:
        """Close the store connection this agent made again after its store went away mid-run (never the one it
        was given, which is its caller's to close)."""
        if self._made is not None:
            self._made.close()
            self._made = None

    def _leased(self, state: RunState) -> contextlib.ExitStack:
        """The run's lease renewed while it goes on (by a new keeper once the run takes itself back: the
        keeper before renewed over the connection that broke, and gives up on it)."""
        self._lease = contextlib.ExitStack()
        self._lease.enter_context(self._keeper(state))
        return self._lease

    def _keeper(self, state: RunState) -> lifecycle.LeaseKeeper:
        assert state.owner is not None
        return lifecycle.LeaseKeeper(self.store, state.run_id, state.owner, self.lease_seconds, self._until)

    def _until(self) -> str:
        return iso(self.clock.now() + timedelta(seconds=self.lease_seconds))

    # -- records ---------------------------------------------------------------------------

    def _stop(self, state: RunState, number: int, reason: str) -> ReActStep:
        state.status, state.reason = "stopped", reason
        self._end(state, "halted", "react.stopped", number, {"reason": reason})
        return ReActStep(number=number, kind="stopped", observation=reason)

    def _end(
        self, state: RunState, status: Literal["succeeded", "halted"], kind: str, number: int, data: dict[str, Any]
    ) -> None:
        """The run's last event, and its status, in one transaction (kept through a store cut)."""

        def record() -> None:
            with self.store.transaction():
                self.store.lock_log()
                row = self._held(state)
                at = iso(self.clock.now())
                lifecycle.move(
                    self.store,
                    row,
                    status,
                    actor=self.user,
                    at=at,
                    kind=kind,
                    data=data,
                    step_id=number,
                    held_by=state.owner,
                )

        self._kept(state, record, lambda: self._newest_is(state, kind, number, data))

    def _held(self, state: RunState) -> PlanRow:
        """The run's row, read under the log's lock: only while this runner holds the run (else it stops here)."""
        row = self.store.get_plan(state.run_id) or missing(state.run_id)
        if state.owner is not None and row.lease_owner != state.owner:
            raise LeaseLostError(
                f"{state.owner} lost its lease on ReAct run {state.run_id} ({row.status}, held by "
                f"{row.lease_owner or 'nobody'}): it stops here"
            )
        return row

    def _event(self, state: RunState, kind: str, step: int | None, data: dict[str, Any], *, known: str = "") -> None:
        """One event of the run, recorded only while this runner holds it, and kept through a store cut
        (:meth:`_kept`; ``known``: what only this run knows, that the event holds)."""
        self._kept(
            state,
            lambda: self._append(state, kind, step, data),
            lambda: self._newest_is(state, kind, step, data),
            known,
        )

    def _append(
        self, state: RunState, kind: str, step: int | None, data: dict[str, Any], *, fenced: bool = True
    ) -> None:
        """One event of the run, recorded only while this runner holds it (``fenced``: unless the caller's
        transaction holds it otherwise)."""
        with self.store.transaction():
            if fenced and state.owner is not None:
                self.store.fence(state.run_id, state.owner)
            self.store.append_event(
                plan_id=state.run_id,
                version=None,
                step_id=step,
                kind=kind,
                actor=self.user,
                at=iso(self.clock.now()),
                data=data,
            )

    def _fenced(self, state: RunState) -> None:
        assert state.owner is not None
        with self.store.transaction():
            self.store.fence(state.run_id, state.owner)

    # -- a store cut -------------------------------------------------------------------------

    def _kept(self, state: RunState, write: Callable[[], T], done: Callable[[], bool], known: str = "") -> T | None:
        """One of the run's records (or reads), kept through a store cut: its connection broken as it is written,
        the run waits for the store and takes itself back under its own lease (:meth:`_take_back`), and writes
        it again unless it is on record (``done``: its commit went through as the connection broke; None comes
        back then). ``known``: what the record holds that only this run knows (an action's outcome), said if
        it cannot be recorded."""
        known = known or "it knew no action's outcome that is not recorded"
        while True:  # the store may go away again as it is written again
            try:
                return write()
            except Exception as exc:
                if not self.store.broken():
                    raise
                if self._take_back(state, exc, done, known):
                    return None

    def _take_back(self, state: RunState, cause: Exception, done: Callable[[], bool], known: str) -> bool:
        """Wait for the store (:func:`plangate._storeback.waited_for`, at most the lease), connect again and
        renew the run's lease where this runner still holds it (a compare-and-set on its owner): whether the
        record is on record already. The store not back in time: a StoreLostError that says what was known
        and not recorded; the lease another's (the run stopped as dead meanwhile): a LeaseLostError."""
        owner = state.owner
        assert owner is not None and self._lease is not None

        def reconnect() -> None:
            self.store = self._made = _storeback.reconnected(self.store)

        def claimed() -> bool:
            held = self.store.renew(state.run_id, owner, self._until())
            if done():
                return True
            if not held:
                raise LeaseLostError(
                    f"ReAct run {state.run_id}'s store is back, but {owner} no longer holds it: {known}"
                )
            return False

        def gave_up(why: str) -> StoreLostError:
            said = f"ReAct run {state.run_id} lost its store ({cause}); the store was not back {why}: {known}"
            return StoreLostError(said, Unconfirmed())

        recorded = _storeback.waited_for(
            self.lease_seconds,
            threading.Event(),
            reconnect=reconnect,
            claim=claimed,
            store=lambda: self.store,
            gave_up=gave_up,
        )
        self._lease.close()  # the keeper that renewed over the broken connection
        self._lease.enter_context(self._keeper(state))
        return recorded

    def _newest_is(self, state: RunState, kind: str, step: int | None, data: dict[str, Any]) -> bool:
        """Whether the run's newest event is this one (written in a commit that went through as the connection
        broke: only the runner that holds a running run writes its events)."""
        events = list(self.store.events(state.run_id))
        newest = events[-1] if events else None
        return (
            newest is not None
            and (newest.kind, newest.step_id) == (kind, step)
            and all(newest.data.get(key) == value for key, value in data.items())
        )

    def _ledger(self, state: RunState, at: str, usage: Usage, seconds: float, error: str | None = None) -> None:
        row = CallRow(
            id=self.clock.new_id(),
            at=at,
            plan_id=state.run_id,
            task=state.question,
            model=self.model.name,
            purpose="react",
            expected_steps=None,
            budget=None,
            effort=None,
            input_tokens=usage.input,
            output_tokens=usage.output,
            thinking_tokens=usage.thinking,
            cost=self.prices.cost(self.model.name, usage),
            seconds=seconds,
            ok=error is None,
            error=error,
        )

        def record() -> None:
            with self.store.transaction():
                self.store.record_call(row)

        self._kept(state, record, lambda: any(call.id == row.id for call in self.store.calls(plan_id=state.run_id)))
        metrics.model_call(row)


def hashed(text: str) -> str:
    """A text's SHA-256, as its hash is recorded."""
    return hashlib.sha256(text.encode()).hexdigest()


def missing(run_id: str) -> PlanRow:
    """No ReAct run of that id: said plainly."""
    raise StateError(f"no ReAct run {run_id!r}")
