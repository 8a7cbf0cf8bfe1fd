"""The store in SQL, written once for every DB-API backend (placeholders are ``?``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

from plangate import audit
from plangate._patterns import like, like_escaped
from plangate.errors import LeaseLostError, NotFoundError, StoreError, quoted_id
from plangate.names import canonical
from plangate.store._base import Store
from plangate.store._log import AuditLog, _dump, _load, _Pending
from plangate.store._records import (
    EVERY_PLAN,
    ApprovalRow,
    CallRow,
    CheckRecord,
    PlanQuery,
    PlanRow,
    ReadScope,
    StepRow,
    TemplateRow,
    VersionRow,
)

# What update_plan may change. The status is not among them: it changes only through
# transition(), a compare-and-set (see plangate.lifecycle).
_PLAN_FIELDS = ("version", "hash", "task", "category", "updated_at")
_PLAN_COLUMNS = (
    "id, status, version, hash, task, category, requested_by, role, tools, created_at, updated_at, kind,"
    " lease_owner, lease_until, purged_at"
)


_PLAN_NAMES = [name.strip() for name in _PLAN_COLUMNS.split(",")]
_VERSION_COLUMNS = "plan_id, version, hash, body, author, created_at, check_result, policy_hash"
_PLAN_VERSION = (
    f"SELECT {', '.join(f'p.{name}' for name in _PLAN_NAMES)},"
    f" {', '.join(f'v.{name}' for name in _VERSION_COLUMNS.split(', '))}"
    " FROM plans p LEFT JOIN plan_versions v ON v.plan_id = p.id AND v.version = p.version WHERE p.id = ?"
)
"""A plan's row and its current version's, in one statement (the version's columns null when it has none)."""

_Lost = str | Callable[[], str]
"""What a failed fence says, or how to find out (asked only when it failed)."""

_MOST_PARAMETERS = 20_000
"""More parameters than this in the waiting writes: they go out one by one (PostgreSQL takes 65,535 a statement)."""


_Position = tuple[str, str]
"""Where a plan stands in a listing: when it was submitted, and its id."""
_READ_ON = 100
"""The fewest rows a listing reads at a time once some it read were not in its scope."""

# The longest text taken as a prefix of a plan id: ids are UUIDs (36 characters), so a longer one matches none.
_LONGEST_ID = 255


class _Write(NamedTuple):
    query: str
    params: tuple[Any, ...]
    key: tuple[Any, ...] | None
    lost: _Lost | None


class _Done(NamedTuple):
    """A statement's rows and count, read before the next statement may be sent on its connection."""

    rows: list[Any]
    rowcount: int

    def fetchall(self) -> list[Any]:
        return self.rows


def _expect_one(lost: _Lost | None, count: int) -> None:
    """A write that had to change exactly one row and did not: the transaction fails, saying ``lost``."""
    if lost is not None and count != 1:
        raise LeaseLostError(lost if isinstance(lost, str) else lost())


def _too_many(writes: list[_Write]) -> bool:
    return sum(len(w.params) for w in writes) > _MOST_PARAMETERS


class SQLStore(AuditLog, Store):
    """Shared SQL for the backends; a subclass supplies the connection and its dialect."""

    def __init__(self, url: str, connection: Any) -> None:
        self.url = url
        self._conn = connection
        self._lock = threading.RLock()
        self._depth = 0
        self._head: tuple[int, str] | None = None  # the audit head while a transaction appends
        # Each plan's newest event as this connection last wrote it: still true while no other
        # writer has appended since (the head is still the one this connection committed).
        self._plan_heads: dict[str, str] = {}
        self._committed: tuple[int, str] | None = None
        self._tails: dict[str, tuple[int, str]] = {}  # the plans this transaction appended to: their newest event
        self._fences: dict[str, str] = {}  # plans this transaction may change only while the owner holds them
        self._pending: list[_Pending] = []  # events recorded, written once the log is needed (record_event)
        self._reading = False  # inside snapshot()
        self._deferred: list[_Write] = []  # writes nobody reads before the commit, sent together (PostgreSQL)
        self._after: list[tuple[Callable[..., object], tuple[Any, ...]]] = []  # on_commit's calls

    # -- plumbing ------------------------------------------------------------------------
    def _begin(self) -> None:
        self._at_once("BEGIN")

    def _at_once(self, query: str, params: tuple[Any, ...] = ()) -> Any:
        """A statement sent under the store's lock whose answer is read before the next one is sent
        (a count, a row, nothing): PostgreSQL's store sends it on one cursor, kept for them all."""
        return self._conn.execute(query, params)

    def _sql(self, query: str) -> str:
        return query

    def _ddl(self, statement: str) -> str:
        """A migration's statement in this database's words."""
        return statement

    def _migrate_by(self, step: str | Callable[[Store], None]) -> None:
        """One step of a migration, inside its transaction: a statement, or a function of the store."""
        if callable(step):
            step(self)
        else:
            self._conn.execute(self._ddl(step))

    def _exec(self, query: str, params: tuple[Any, ...] = ()) -> Any:
        if self._pending and ("events" in query or "audit_head" in query):  # it must see the events recorded
            self.lock_log()
        if self._deferred:  # every statement sees the writes before it
            self._flush()
        return self._conn.execute(self._sql(query), params)

    _DEFER_WRITES = False  # PostgreSQL: a transaction's writes that nobody reads go out in one statement

    def _write(
        self, query: str, params: tuple[Any, ...], *, key: tuple[Any, ...] | None = None, lost: _Lost | None = None
    ) -> None:
        """A write whose result nobody reads before the commit: on PostgreSQL it waits, and goes out
        with the others in one statement (a round trip each saved) when the next statement is sent.

        ``key`` names the row it changes (no two writes of one statement may change one row: the
        waiting ones go out first); ``lost``: it must change exactly one row, else the transaction
        fails with :class:`LeaseLostError` saying that.
        """
        if not (self._DEFER_WRITES and self._depth):  # at once (SQLite: a statement costs no round trip)
            _expect_one(lost, self._exec(query, params).rowcount)
            return
        if key is not None and any(w.key == key for w in self._deferred):
            self._flush()
        self._deferred.append(_Write(query, params, key, lost))

    def _flush(self) -> None:
        """Send the waiting writes: one statement, each write a part of it that counts its rows."""
        writes, self._deferred = self._deferred, []
        if len(writes) > 1 and not _too_many(writes):
            self._together(writes)
            return
        for write in writes:
            _expect_one(write.lost, self._at_once(self._sql(write.query), write.params).rowcount)

    def _read_one(self, query: str, params: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
        """The one row ``query`` reads (None: none, or every column null), with the waiting writes
        in the same statement: a round trip, where there are any."""
        writes = self._deferred
        if not writes or _too_many(writes):
            row = self._exec(query, params).fetchone()
            return None if row is None else tuple(row)
        self._deferred = []
        values = self._together(writes, query, params)
        return None if all(value is None for value in values) else values

    def _together(self, writes: list[_Write], read: str | None = None, params: tuple[Any, ...] = ()) -> tuple[Any, ...]:
        """``writes`` as the parts of one statement, each counting its rows (checked here), and with ``read``
        the one row it reads (its columns come back; every one null when it read none)."""
        parts = ", ".join(f"w{i} AS ({w.query} RETURNING 1)" for i, w in enumerate(writes))
        counts = ", ".join(f"(SELECT COUNT(*) FROM w{i})" for i in range(len(writes)))
        sql = (
            f"WITH {parts} SELECT {counts}"
            if read is None
            else f"WITH {parts}, r AS ({read}) SELECT r.*, {counts} FROM (SELECT 1) AS one LEFT JOIN r ON TRUE"
        )
        row = self._at_once(self._sql(sql), (*(p for w in writes for p in w.params), *params)).fetchone()
        width = len(row) - len(writes)
        for write, count in zip(writes, row[width:], strict=True):
            _expect_one(write.lost, int(count))
        return tuple(row[:width])

    def newest_event(self, plan_id: str) -> str | None:
        if self._pending:  # events recorded in this transaction are the newest: written first, as any read of the log
            self.lock_log()
        if self._head is not None:  # under the log's lock: known for the rest of the transaction
            digest = self._plan_head(plan_id)
            return None if digest == audit.GENESIS else digest
        row = self._read_one("SELECT hash FROM events WHERE plan_id = ? ORDER BY seq DESC LIMIT 1", (plan_id,))
        return None if row is None else str(row[0])

    @contextmanager
    def transaction(self) -> Iterator[None]:
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            self._begin()
            self._depth, self._head = 1, None
            try:
                yield
                # The head row is rewritten by decisions, not by every step of a run: the seals of
                # the plans' newest events already pin the end of the log, and a head that trails
                # the log is still one it extends.
                in_run = bool(self._fences) and not self._HEAD_IS_THE_LOCK
                if self._pending:
                    self.lock_log()  # the log's lock, from here to the commit, and the events recorded
                self._seal_tails()
                if self._head is not None and not in_run:
                    self._write("UPDATE audit_head SET seq = ?, hash = ? WHERE id = 1", self._head, key=("head",))
                if self._deferred:
                    self._flush()
                self._at_once("COMMIT")
            except BaseException:
                # The key id may have been recorded in this transaction: check it again next time.
                self._depth, self._head, self._chain, self._committed = 0, None, None, None
                self._plan_heads.clear()
                self._tails.clear()
                self._fences.clear()
                self._pending.clear()
                self._deferred.clear()
                self._after.clear()
                self._at_once("ROLLBACK")
                raise
            finally:
                self._log_released()
            self._depth, self._committed, self._head = 0, self._head or self._committed, None
            after, self._after = self._after, []
            for fn, args in after:
                fn(*args)

    def _log_released(self) -> None:
        """The transaction has ended (committed or rolled back): the audit log's lock, if it took it, is free."""

    def on_commit(self, fn: Callable[..., object], /, *args: Any) -> None:
        if self._depth:
            self._after.append((fn, args))
        else:
            fn(*args)

    _SNAPSHOT = "BEGIN"  # SQLite: a deferred transaction reads one snapshot (WAL)
    _HEAD_IS_THE_LOCK = False  # PostgreSQL appends after the head row it locks: it must always be current

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        with self._lock:
            if self._depth or self._reading:  # inside a transaction or a snapshot already: it is the snapshot
                yield
                return
            self._at_once(self._SNAPSHOT)
            self._reading = True
            try:
                yield
            finally:
                self._reading = False
                self._at_once("ROLLBACK")

    def _head_for_append(self) -> tuple[int, str]:
        """The audit head, read so that no other writer can append until this transaction ends."""
        row = self._exec("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
        return (row[0], row[1]) if row else (0, audit.GENESIS)

    def _require_tx(self) -> None:
        if not self._depth:
            raise StoreError("writes must happen inside store.transaction()")

    # -- writes --------------------------------------------------------------------------
    def insert_plan(self, row: PlanRow) -> None:
        self._require_tx()
        values = (*(getattr(row, name) for name in _PLAN_NAMES), canonical(row.requested_by))
        self._exec(f"INSERT INTO plans ({_PLAN_COLUMNS}, requester) VALUES ({', '.join('?' for _ in values)})", values)

    def update_plan(self, plan_id: str, **fields: Any) -> None:
        self._require_tx()
        unknown = set(fields) - set(_PLAN_FIELDS)
        if unknown:
            raise StoreError(f"plans have no column(s) {sorted(unknown)}")
        columns = ", ".join(f"{name} = ?" for name in fields)
        self._exec(f"UPDATE plans SET {columns} WHERE id = ?", (*fields.values(), plan_id))

    _SAME = "IS"  # NULL-safe equality; PostgreSQL says IS NOT DISTINCT FROM

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
        self._require_tx()
        held = isinstance(expected_lease, str)  # the owner alone: the lease's end may have been renewed
        cursor = self._exec(
            "UPDATE plans SET status = ?, updated_at = ?, lease_owner = ?, lease_until = ? WHERE id = ?"
            f" AND status = ? AND version = ? AND lease_owner {self._SAME} ?"
            + ("" if held else f" AND lease_until {self._SAME} ?"),
            (to, at, *lease, plan_id, expected, expected_version, *((expected_lease,) if held else expected_lease)),
        )
        return int(cursor.rowcount) == 1

    def update_version_check(self, plan_id: str, version: int, check: CheckRecord, policy_hash: str | None) -> None:
        self._require_tx()
        self._exec(
            "UPDATE plan_versions SET check_result = ?, policy_hash = ? WHERE plan_id = ? AND version = ?",
            (_dump(check.to_dict()), policy_hash, plan_id, version),
        )

    def insert_version(self, row: VersionRow) -> None:
        self._require_tx()
        self._exec(
            "INSERT INTO plan_versions (plan_id, version, hash, body, author, created_at, check_result, policy_hash)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                row.plan_id,
                row.version,
                row.hash,
                row.body,
                row.author,
                row.created_at,
                _dump(row.check.to_dict()),
                row.policy_hash,
            ),
        )

    def insert_approval(self, row: ApprovalRow) -> None:
        self._require_tx()
        self._exec(
            "INSERT INTO approvals (plan_id, version, plan_hash, policy_hash, decision, actor, role, kind, comment,"
            " at, void) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                row.plan_id,
                row.version,
                row.plan_hash,
                row.policy_hash,
                row.decision,
                row.actor,
                row.role,
                row.kind,
                row.comment,
                row.at,
                int(row.void),
            ),
        )

    def void_approvals(self, plan_id: str) -> int:
        self._require_tx()
        cursor = self._exec("UPDATE approvals SET void = 1 WHERE plan_id = ? AND void = 0", (plan_id,))
        return int(cursor.rowcount)

    def put_step(self, row: StepRow) -> None:
        self._require_tx()
        self._write(
            "INSERT INTO steps (plan_id, step_id, version, status, attempt, idempotency_key, params, output, error,"
            " started_at, finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (plan_id, step_id) DO UPDATE SET version = excluded.version, status = excluded.status,"
            " attempt = excluded.attempt, idempotency_key = excluded.idempotency_key, params = excluded.params,"
            " output = excluded.output, error = excluded.error, started_at = excluded.started_at,"
            " finished_at = excluded.finished_at",
            (
                row.plan_id,
                row.step_id,
                row.version,
                row.status,
                row.attempt,
                row.idempotency_key,
                _dump(row.params),
                _dump(row.output),
                row.error,
                row.started_at,
                row.finished_at,
            ),
            key=("step", row.plan_id, row.step_id),
        )

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
        self._require_tx()
        self._write(
            "UPDATE steps SET status = ?, output = ?, error = ?, finished_at = ?"
            " WHERE plan_id = ? AND step_id = ? AND status = 'started' AND attempt = ?",
            (status, _dump(output), error, at, plan_id, step_id, attempt),
            key=("step", plan_id, step_id),
            lost=lost,
        )

    def hold_step(self, plan_id: str, step_id: int, *, attempt: int, lost: str) -> None:
        self._require_tx()
        self._write(
            "UPDATE steps SET attempt = attempt"
            " WHERE plan_id = ? AND step_id = ? AND status = 'started' AND attempt = ?",
            (plan_id, step_id, attempt),
            key=("step", plan_id, step_id),
            lost=lost,
        )

    def save_policy(self, policy_hash: str, name: str, body: str) -> None:
        self._require_tx()
        self._exec(
            "INSERT INTO policies (hash, name, body) VALUES (?, ?, ?) ON CONFLICT (hash) DO NOTHING",
            (policy_hash, name, body),
        )

    _CALL_COLUMNS = (
        "id, at, plan_id, task, model, purpose, expected_steps, budget, effort, input_tokens, output_tokens,"
        " thinking_tokens, cost, seconds, ok, error"
    )

    def record_call(self, row: CallRow) -> None:
        self._require_tx()
        self._exec(
            f"INSERT INTO model_calls ({self._CALL_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                row.id,
                row.at,
                row.plan_id,
                row.task,
                row.model,
                row.purpose,
                row.expected_steps,
                row.budget,
                row.effort,
                row.input_tokens,
                row.output_tokens,
                row.thinking_tokens,
                row.cost,
                row.seconds,
                int(row.ok),
                row.error,
            ),
        )

    def link_calls(self, call_ids: list[str], plan_id: str) -> None:
        self._require_tx()
        for call_id in call_ids:
            self._exec("UPDATE model_calls SET plan_id = ? WHERE id = ?", (plan_id, call_id))

    def save_template(self, row: TemplateRow) -> None:
        self._require_tx()
        self._exec(
            "INSERT INTO templates (name, pattern, slots, body, source_plan, created_by, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET pattern = excluded.pattern,"
            " slots = excluded.slots, body = excluded.body, source_plan = excluded.source_plan,"
            " created_by = excluded.created_by, created_at = excluded.created_at",
            (row.name, row.pattern, _dump(row.slots), row.body, row.source_plan, row.created_by, row.created_at),
        )

    def delete_template(self, name: str) -> bool:
        self._require_tx()
        return int(self._exec("DELETE FROM templates WHERE name = ?", (name,)).rowcount) > 0

    # -- reads ---------------------------------------------------------------------------
    def calls(self, *, plan_id: str | None = None, since: str | None = None) -> list[CallRow]:
        query = f"SELECT {self._CALL_COLUMNS} FROM model_calls WHERE 1 = 1"
        params: list[Any] = []
        if plan_id is not None:
            query, params = query + " AND plan_id = ?", [*params, plan_id]
        if since is not None:
            query, params = query + " AND at >= ?", [*params, since]
        rows = self._exec(query + " ORDER BY at, id", tuple(params)).fetchall()
        return [
            CallRow(
                id=r[0],
                at=r[1],
                plan_id=r[2],
                task=r[3],
                model=r[4],
                purpose=r[5],
                expected_steps=r[6],
                budget=r[7],
                effort=r[8],
                input_tokens=r[9],
                output_tokens=r[10],
                thinking_tokens=r[11],
                cost=r[12],
                seconds=r[13],
                ok=bool(r[14]),
                error=r[15],
            )
            for r in rows
        ]

    def templates(self) -> list[TemplateRow]:
        rows = self._exec(
            "SELECT name, pattern, slots, body, source_plan, created_by, created_at FROM templates ORDER BY name"
        ).fetchall()
        return [
            TemplateRow(
                name=r[0],
                pattern=r[1],
                slots=_load(r[2]),
                body=r[3],
                source_plan=r[4],
                created_by=r[5],
                created_at=r[6],
            )
            for r in rows
        ]

    def get_plan(self, plan_id: str) -> PlanRow | None:
        row = self._exec(
            f"SELECT {_PLAN_COLUMNS} FROM plans WHERE id = ?",
            (plan_id,),
        ).fetchone()
        return None if row is None else _plan(row)

    def find_plans(self, prefix: str) -> list[str]:
        if len(prefix) > _LONGEST_ID:  # no id is this long (and SQLite refuses LIKE patterns past 50,000 bytes)
            return []
        rows = self._exec("SELECT id FROM plans WHERE id LIKE ? ESCAPE '\\' LIMIT 10", (like_escaped(prefix) + "%",))
        return [r[0] for r in rows.fetchall()]

    def list_plans(self, query: PlanQuery = EVERY_PLAN, limit: int = 100) -> list[PlanRow]:
        """Read in an index's order and stopped at ``limit``. A scope's categories are narrowed in SQL
        by LIKE, which may let through plans the scope does not admit: those are left out, and more read."""
        before, after = self._position(query.before), self._position(query.after)
        found: list[PlanRow] = []
        wanted = limit
        while len(found) < limit:
            sql, params = _listing(query, before, after)
            plans = [_plan(row) for row in self._exec(sql, (*params, wanted)).fetchall()]
            found += [plan for plan in plans if _admitted(query.scope, plan)]
            if len(plans) < wanted:
                break
            last = (plans[-1].created_at, plans[-1].id)  # the next rows come after the last one read
            before, after = (last, after) if query.order == "newest" else (before, last)
            wanted = max(limit - len(found), _READ_ON)
        return found[:limit]

    def _position(self, plan_id: str | None) -> _Position | None:
        if plan_id is None:
            return None
        row = self._exec("SELECT created_at, id FROM plans WHERE id = ?", (plan_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"no plan {quoted_id(plan_id)} to list plans before or after")
        return (row[0], row[1])

    def get_version(self, plan_id: str, version: int) -> VersionRow | None:
        row = self._exec(
            f"SELECT {_VERSION_COLUMNS} FROM plan_versions WHERE plan_id = ? AND version = ?", (plan_id, version)
        ).fetchone()
        return None if row is None else _version(row)

    def get_plan_version(self, plan_id: str) -> tuple[PlanRow, VersionRow | None] | None:
        row = self._exec(_PLAN_VERSION, (plan_id,)).fetchone()
        if row is None:
            return None
        width = len(_PLAN_NAMES)
        return _plan(row), None if row[width] is None else _version(row[width:])

    def approvals(self, plan_id: str, version: int | None = None) -> list[ApprovalRow]:
        query = (
            "SELECT plan_id, version, plan_hash, policy_hash, decision, actor, role, kind, comment, at, void"
            " FROM approvals WHERE plan_id = ?"
        )
        params: tuple[Any, ...] = (plan_id,)
        if version is not None:
            query += " AND version = ?"
            params = (plan_id, version)
        rows = self._exec(query + " ORDER BY id", params).fetchall()
        return [
            ApprovalRow(
                plan_id=r[0],
                version=r[1],
                plan_hash=r[2],
                policy_hash=r[3],
                decision=r[4],
                actor=r[5],
                role=r[6],
                kind=r[7],
                comment=r[8],
                at=r[9],
                void=bool(r[10]),
            )
            for r in rows
        ]

    def steps(self, plan_id: str) -> dict[int, StepRow]:
        rows = self._exec(
            "SELECT plan_id, step_id, version, status, attempt, idempotency_key, params, output, error, started_at,"
            " finished_at FROM steps WHERE plan_id = ?",
            (plan_id,),
        ).fetchall()
        return {
            r[1]: StepRow(
                plan_id=r[0],
                step_id=r[1],
                version=r[2],
                status=r[3],
                attempt=r[4],
                idempotency_key=r[5],
                params=_load(r[6]),
                output=_load(r[7]),
                error=r[8],
                started_at=r[9],
                finished_at=r[10],
            )
            for r in rows
        }

    def policy_text(self, policy_hash: str) -> str | None:
        row = self._exec("SELECT body FROM policies WHERE hash = ?", (policy_hash,)).fetchone()
        return None if row is None else str(row[0])

    _LOCK_ROWS = ""  # PostgreSQL: FOR UPDATE SKIP LOCKED (SQLite's write lock already serialises)
    _RUNNABLE = " INDEXED BY plans_runnable"  # SQLite would take plans_status, then sort every waiting plan

    def claim(self, worker: str, now: str, until: str, skip: Sequence[str] = ()) -> str | None:
        """Lease the oldest plan a worker should run: approved, or running under an expired lease."""
        claimed = self.claim_batch(worker, now, until, 1, skip)
        return claimed[0] if claimed else None

    def claim_batch(self, worker: str, now: str, until: str, limit: int, skip: Sequence[str] = ()) -> list[str]:
        """Lease up to ``limit`` of the oldest plans to run, in one statement; oldest first."""
        if limit < 1:
            return []
        rows = self._alone(self._claim_query(len(skip)), (worker, until, now, *skip, limit)).fetchall()
        return [str(row[0]) for row in sorted(rows, key=lambda row: (row[1], row[0]))]

    def _claim_query(self, skipped: int) -> str:
        """The claim: the oldest plans that may run (``skipped`` ids left out), through plans_runnable."""
        excluded = f" AND id NOT IN ({', '.join('?' for _ in range(skipped))})" if skipped else ""
        # Never a plan under a live lease, whatever its status: a plan just claimed is still
        # "approved" until its engine starts, and must not be claimed twice in between.
        return (
            f"UPDATE plans SET lease_owner = ?, lease_until = ? WHERE id IN (SELECT id FROM plans{self._RUNNABLE}"
            " WHERE kind = 'plan' AND status IN ('approved', 'running')"  # as plans_runnable says
            f" AND (lease_until IS NULL OR lease_until < ?){excluded} ORDER BY created_at, id LIMIT ?"
            f"{self._LOCK_ROWS}) RETURNING id, created_at"
        )

    def renew(self, plan_id: str, worker: str, until: str) -> bool:
        """Extend a lease this worker holds; False when it lost it."""
        return self.hand_over(plan_id, worker, worker, until)

    def hand_over(self, plan_id: str, worker: str, to: str, until: str) -> bool:
        query = "UPDATE plans SET lease_owner = ?, lease_until = ? WHERE id = ? AND lease_owner = ?"
        return int(self._alone(query, (to, until, plan_id, worker)).rowcount) == 1

    def release(self, plan_id: str, worker: str) -> None:
        query = "UPDATE plans SET lease_owner = NULL, lease_until = NULL WHERE id = ? AND lease_owner = ?"
        self._alone(query, (plan_id, worker))

    def _alone(self, query: str, params: tuple[Any, ...]) -> Any:
        """One statement that is a transaction of its own (a part of the caller's, inside one): no BEGIN
        and COMMIT around it, two round trips fewer on PostgreSQL. Its rows are read under the lock."""
        with self._lock:
            cursor = self._exec(query, params)
            return _Done(cursor.fetchall() if cursor.description else [], cursor.rowcount)

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in self._exec(sql, params).fetchall()]

    def command(self, sql: str, params: tuple[Any, ...] = ()) -> int:
        self._require_tx()
        return int(self._exec(sql, params).rowcount)

    def close(self) -> None:
        self._conn.close()


def _check(plan_id: str, version: int, text: str) -> CheckRecord:
    try:
        return CheckRecord.from_dict(_load(text))
    except (TypeError, StoreError) as exc:
        raise StoreError(f"plan {plan_id} v{version}: its recorded check cannot be read ({exc})") from None


def _version(row: Any) -> VersionRow:
    return VersionRow(
        plan_id=row[0],
        version=row[1],
        hash=row[2],
        body=row[3],
        author=row[4],
        created_at=row[5],
        check=_check(row[0], row[1], row[6]),
        policy_hash=row[7],
    )


def _plan(row: Any) -> PlanRow:
    return PlanRow(
        id=row[0],
        status=row[1],
        version=row[2],
        hash=row[3],
        task=row[4],
        category=row[5],
        requested_by=row[6],
        role=row[7],
        tools=row[8],
        created_at=row[9],
        updated_at=row[10],
        kind=row[11],
        lease_owner=row[12],
        lease_until=row[13],
        purged_at=row[14],
    )


def _admitted(scope: ReadScope | None, plan: PlanRow) -> bool:
    return scope is None or scope.admits(category=plan.category, requested_by=plan.requested_by)


def _listing(query: PlanQuery, before: _Position | None, after: _Position | None) -> tuple[str, tuple[Any, ...]]:
    """A listing's SELECT, whose last parameter (its LIMIT) is left to add, and its other parameters."""
    equal = {name: getattr(query, name) for name in ("status", "kind", "category")}
    clauses = [f"{name} = ?" for name, value in equal.items() if value is not None]
    params: list[Any] = [value for value in equal.values() if value is not None]
    for side, at in (("<", before), (">", after)):
        if at is not None:
            clauses.append(f"(created_at, id) {side} (?, ?)")
            params += at
    if query.scope is not None:
        patterns = query.scope.categories
        clauses.append("(" + " OR ".join(["requester = ?", *("category LIKE ? ESCAPE '\\'" for _ in patterns)]) + ")")
        params += [query.scope.requester, *(like(pattern) for pattern in patterns)]
    way = "DESC" if query.order == "newest" else "ASC"
    where = " AND ".join(clauses) or "1 = 1"
    return f"SELECT {_PLAN_COLUMNS} FROM plans WHERE {where} ORDER BY created_at {way}, id {way} LIMIT ?", tuple(params)
