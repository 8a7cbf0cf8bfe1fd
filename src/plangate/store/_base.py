"""The storage interface: one transactional store for plans, approvals, runs and the audit log."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from plangate.audit import AuditReport
from plangate.store._records import (
    EVERY_PLAN,
    ApprovalRow,
    CallRow,
    CheckRecord,
    Event,
    PlanQuery,
    PlanRow,
    StepRow,
    TemplateRow,
    VersionRow,
)


class Store(abc.ABC):
    """Everything plangate keeps. Writes happen inside :meth:`transaction`; each one is atomic.

    Backends: SQLite (embedded, the default) and, later, PostgreSQL. Both implement this
    interface; nothing outside ``plangate.store`` knows which one it talks to.
    """

    url: str

    @abc.abstractmethod
    def transaction(self) -> AbstractContextManager[None]:
        """One atomic, durable unit of writes (nested calls join the outer one)."""

    @abc.abstractmethod
    def snapshot(self) -> AbstractContextManager[None]:
        """Reads that see one consistent state of the store, while others go on writing (no writes)."""

    # -- writes (inside a transaction) ---------------------------------------------------
    @abc.abstractmethod
    def insert_plan(self, row: PlanRow) -> None: ...

    @abc.abstractmethod
    def update_plan(self, plan_id: str, **fields: Any) -> None: ...

    @abc.abstractmethod
    def transition(
        self,
        plan_id: str,
        *,
        expected: str,
        expected_version: int,
        expected_lease: tuple[str | None, str | None] | str,
        to: str,
        at: str,
        lease: tuple[str | None, str | None],
    ) -> bool:
        """Compare-and-set a plan's status and lease: True when the plan (status, version, lease) was still as expected.

        ``expected_lease``: the lease's owner and end as read, or its owner alone (a runner's own
        lease, whose end its keeper renews meanwhile: the owner names one run). Only
        :func:`plangate.lifecycle.move` calls this; it records the transition's event in the same
        transaction.
        """

    @abc.abstractmethod
    def insert_version(self, row: VersionRow) -> None: ...

    @abc.abstractmethod
    def update_version_check(self, plan_id: str, version: int, check: CheckRecord, policy_hash: str | None) -> None:
        """Record a new check of an existing version (the tools or the policy changed since)."""

    @abc.abstractmethod
    def insert_approval(self, row: ApprovalRow) -> None: ...

    @abc.abstractmethod
    def void_approvals(self, plan_id: str) -> int:
        """Void every standing approval of the plan; return how many."""

    @abc.abstractmethod
    def put_step(self, row: StepRow) -> None:
        """Insert or replace the record of one step."""

    @abc.abstractmethod
    def finish_step(
        self,
        plan_id: str,
        step_id: int,
        *,
        attempt: int,
        status: str,
        output: Any,
        error: str | None,
        at: str,
        lost: str,
    ) -> None:
        """Record the outcome of the step's ``attempt`` (its parameters stay as recorded when it started).

        Only a row still ``started`` at that attempt takes it. When the row moved on while the
        call ran (a person settled it, another attempt took over), the transaction fails with
        :class:`~plangate.errors.LeaseLostError` saying ``lost``, at the latest as it commits,
        and nothing of it is written.
        """

    @abc.abstractmethod
    def hold_step(self, plan_id: str, step_id: int, *, attempt: int, lost: str) -> None:
        """Inside a transaction: let it commit only while the step's record is still ``started`` at ``attempt``.

        Locks the row until the commit, so what the transaction then writes of the step (a retry's new
        ``started`` record) replaces that attempt's record and no other: when the row moved on (another
        attempt completed the step, a person settled it), the transaction fails with
        :class:`~plangate.errors.LeaseLostError` saying ``lost``, at the latest as it commits.
        """

    @abc.abstractmethod
    def on_commit(self, fn: Callable[..., object], /, *args: Any) -> None:
        """Call ``fn(*args)`` once the open transaction commits (never, if it rolls back); at once outside one."""

    @abc.abstractmethod
    def newest_event(self, plan_id: str) -> str | None:
        """The hash of the plan's newest event (None: it has none), whose hash covers its whole chain."""

    @abc.abstractmethod
    def save_policy(self, policy_hash: str, name: str, body: str) -> None: ...

    @abc.abstractmethod
    def append_event(
        self,
        *,
        plan_id: str | None,
        version: int | None,
        step_id: int | None,
        kind: str,
        actor: str,
        at: str,
        data: dict[str, Any],
    ) -> Event:
        """Append one event to the hash-chained audit log."""

    def record_event(
        self,
        *,
        plan_id: str | None,
        version: int | None,
        step_id: int | None,
        kind: str,
        actor: str,
        at: str,
        data: dict[str, Any],
    ) -> None:
        """Inside a transaction: append an event whose seq and hash the caller does not need, at the latest
        when the transaction commits (in the order recorded, before any later append or read of the log)."""
        self.append_event(plan_id=plan_id, version=version, step_id=step_id, kind=kind, actor=actor, at=at, data=data)

    @abc.abstractmethod
    def purge_event(self, seq: int, kept: dict[str, Any], at: str) -> None:
        """Inside a transaction: keep only ``kept`` of event ``seq``'s data, marked and sealed as purged on ``at``
        (see :mod:`plangate.retention`); its hash, which covers its data's digest, stays."""

    @abc.abstractmethod
    def verified_events(self, kind: str) -> list[Event]:
        """The events of ``kind`` that belong to no plan (the register's), each checked under this process's key."""

    @abc.abstractmethod
    def fence(self, plan_id: str, owner: str) -> None:
        """Inside a transaction: let it commit only if ``owner`` still holds the plan's lease then
        (:class:`~plangate.errors.LeaseLostError` otherwise, and nothing of it is kept)."""

    @abc.abstractmethod
    def lock_log(self) -> None:
        """Inside a transaction: take the audit log's write lock now, not at the first append.

        Every writer takes this one lock first, so a decision reads a state that no other
        writer can change before it commits, and two writers never wait for each other in
        opposite orders.
        """

    @abc.abstractmethod
    def record_call(self, row: CallRow) -> None:
        """Add a model call to the cost ledger."""

    @abc.abstractmethod
    def link_calls(self, call_ids: list[str], plan_id: str) -> None:
        """Attribute ledger entries to the plan they produced."""

    @abc.abstractmethod
    def save_template(self, row: TemplateRow) -> None: ...

    @abc.abstractmethod
    def delete_template(self, name: str) -> bool: ...

    # -- reads ---------------------------------------------------------------------------
    @abc.abstractmethod
    def calls(self, *, plan_id: str | None = None, since: str | None = None) -> list[CallRow]:
        """Ledger entries, oldest first: of one plan, or since a time."""

    @abc.abstractmethod
    def templates(self) -> list[TemplateRow]: ...

    @abc.abstractmethod
    def get_plan(self, plan_id: str) -> PlanRow | None: ...

    @abc.abstractmethod
    def find_plans(self, prefix: str) -> list[str]:
        """Ids that start with ``prefix`` (for short ids typed by people)."""

    @abc.abstractmethod
    def list_plans(self, query: PlanQuery = EVERY_PLAN, limit: int = 100) -> list[PlanRow]:
        """The first ``limit`` plans that ``query`` selects, in its order: only those, so that a page
        is full whenever there are that many (``query.before``/``after``: a plan's id, which must exist)."""

    @abc.abstractmethod
    def get_version(self, plan_id: str, version: int) -> VersionRow | None: ...

    @abc.abstractmethod
    def get_plan_version(self, plan_id: str) -> tuple[PlanRow, VersionRow | None] | None:
        """A plan's row and its current version's, in one read (None: no such plan; the version None:
        its row is missing)."""

    @abc.abstractmethod
    def approvals(self, plan_id: str, version: int | None = None) -> list[ApprovalRow]: ...

    @abc.abstractmethod
    def steps(self, plan_id: str) -> dict[int, StepRow]: ...

    @abc.abstractmethod
    def events(self, plan_id: str | None = None) -> Iterator[Event]:
        """Events in order: of one plan, or the whole log."""

    @abc.abstractmethod
    def policy_text(self, policy_hash: str) -> str | None: ...

    @abc.abstractmethod
    def verify_audit(self, anchor: tuple[int, str] | None = None) -> AuditReport:
        """Check the whole audit log's chain with this process's key; ``anchor``: a head (seq, hash) kept
        elsewhere, which the log must still hold.

        The chain alone: :func:`plangate.ledger.verify` also holds the tables against it."""

    @abc.abstractmethod
    def plan_events(self, plan_id: str) -> tuple[list[Event], str | None]:
        """One plan's events, checked with this process's key (see :func:`plangate.audit.verify_plan`);
        or no events and what is wrong with them."""

    @abc.abstractmethod
    def plans_events(self, plan_ids: Iterable[str]) -> Iterator[tuple[str, list[Event], str | None]]:
        """:meth:`plan_events` of many plans, each with its id, read in the caller's snapshot (:meth:`snapshot`):
        what the whole log must hold for each (no event missing from its numbering) is checked once."""

    @abc.abstractmethod
    def audit_head(self) -> tuple[int, str]:
        """The audit log's head: the last event's sequence number and hash (0 and the genesis hash when empty)."""

    @abc.abstractmethod
    def claim(self, worker: str, now: str, until: str, skip: Sequence[str] = ()) -> str | None:
        """Lease the next plan to run (approved, or running under an expired lease) to ``worker``."""

    @abc.abstractmethod
    def claim_batch(self, worker: str, now: str, until: str, limit: int, skip: Sequence[str] = ()) -> list[str]:
        """Lease up to ``limit`` plans to run to ``worker`` in one statement (a worker's free capacity)."""

    @abc.abstractmethod
    def renew(self, plan_id: str, worker: str, until: str) -> bool: ...

    @abc.abstractmethod
    def hand_over(self, plan_id: str, worker: str, to: str, until: str) -> bool:
        """Give a lease this worker holds to ``to`` (the one Temporal workflow run that carries its claim on),
        until ``until``; False when it lost it."""

    def database_time(self) -> datetime | None:
        """The database server's clock, for workers on other machines to compare theirs with
        (leases are times written by one machine's clock and read by another's); None when the
        store has no server (SQLite: every process that opens the file shares one machine's clock)."""
        return None

    def broken(self) -> bool:
        """Whether the connection to the database broke (a server restart, a network cut): the store went
        away, as opposed to a statement it refused. False for SQLite, whose file does not go away."""
        return False

    @abc.abstractmethod
    def release(self, plan_id: str, worker: str) -> None: ...

    @abc.abstractmethod
    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Rows from plangate's own tables (portable SQL, ``?`` placeholders), for small modules
        such as accounts that keep a table of their own."""

    @abc.abstractmethod
    def command(self, sql: str, params: tuple[Any, ...] = ()) -> int:
        """Run one write (inside a transaction); the number of rows it touched."""

    @abc.abstractmethod
    def close(self) -> None: ...
