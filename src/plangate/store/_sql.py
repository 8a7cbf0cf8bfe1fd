"""The store in SQL, written once for every DB-API backend (placeholders are ``?``)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from plangate import audit
from plangate._auditkey import audit_key, find_audit_key
from plangate.errors import LeaseLostError, StoreError
from plangate.plan import canonical
from plangate.store._base import Store
from plangate.store._records import (
    ApprovalRow,
    CallRow,
    CheckRecord,
    Event,
    PlanRow,
    StepRow,
    TemplateRow,
    VersionRow,
)

# What update_plan may change. The status is not among them: it changes only through
# transition(), a compare-and-set (see plangate.lifecycle).
_PLAN_FIELDS = ("version", "hash", "task", "category", "updated_at")
_PLAN_COLUMNS = (
    "id, status, version, hash, task, category, requested_by, role, tools, created_at, updated_at, kind,"
    " lease_owner, lease_until"
)


def _dump(value: Any) -> str:
    return canonical(value)


def _load(text: str | None) -> Any:
    return None if text is None else json.loads(text)


class SQLStore(Store):
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

    # -- plumbing ------------------------------------------------------------------------
    def _begin(self) -> None:
        self._conn.execute("BEGIN")

    def _sql(self, query: str) -> str:
        return query

    def _exec(self, query: str, params: tuple[Any, ...] = ()) -> Any:
        return self._conn.execute(self._sql(query), params)

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
                if self._head is not None:
                    self._exec("UPDATE audit_head SET seq = ?, hash = ? WHERE id = 1", self._head)
                self._seal_tails()
            except BaseException:
                # The key id may have been recorded in this transaction: check it again next time.
                self._depth, self._head, self._chain, self._committed = 0, None, None, None
                self._plan_heads.clear()
                self._tails.clear()
                self._fences.clear()
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")
            self._depth, self._committed, self._head = 0, self._head or self._committed, None

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
        self._exec(
            "INSERT INTO plans (id, status, version, hash, task, category, requested_by, role, tools, created_at,"
            " updated_at, kind) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                row.id,
                row.status,
                row.version,
                row.hash,
                row.task,
                row.category,
                row.requested_by,
                row.role,
                row.tools,
                row.created_at,
                row.updated_at,
                row.kind,
            ),
        )

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
        expected_lease: tuple[str | None, str | None],
        to: str,
        at: str,
        lease: tuple[str | None, str | None],
    ) -> bool:
        self._require_tx()
        cursor = self._exec(
            "UPDATE plans SET status = ?, updated_at = ?, lease_owner = ?, lease_until = ? WHERE id = ?"
            f" AND status = ? AND lease_owner {self._SAME} ? AND lease_until {self._SAME} ?",
            (to, at, *lease, plan_id, expected, *expected_lease),
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
        self._exec(
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
        )

    def finish_step(self, plan_id: str, step_id: int, *, status: str, output: Any, error: str | None, at: str) -> None:
        self._require_tx()
        self._exec(
            "UPDATE steps SET status = ?, output = ?, error = ?, finished_at = ? WHERE plan_id = ? AND step_id = ?",
            (status, _dump(output), error, at, plan_id, step_id),
        )

    def save_policy(self, policy_hash: str, name: str, body: str) -> None:
        self._require_tx()
        self._exec(
            "INSERT INTO policies (hash, name, body) VALUES (?, ?, ?) ON CONFLICT (hash) DO NOTHING",
            (policy_hash, name, body),
        )

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
        self.lock_log()
        assert self._head is not None
        seq, prev = self._head[0] + 1, self._head[1]
        plan_prev = None if plan_id is None else self._plan_head(plan_id)
        row = (seq, plan_id, version, step_id, kind, actor, at, _dump(data), prev, "", plan_prev)
        digest = self._chain_for_append(seq - 1).hash(row)
        self._exec(
            f"INSERT INTO events ({audit.COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (*row[:9], digest, plan_prev),
        )
        self._head = (seq, digest)
        if plan_id is not None:
            self._plan_heads[plan_id] = digest
            self._tails[plan_id] = (seq, digest)
        return Event(
            seq=seq,
            plan_id=plan_id,
            version=version,
            step_id=step_id,
            kind=kind,
            actor=actor,
            at=at,
            data=data,
            prev=prev,
            hash=digest,
        )

    def seal(self, *parts: object) -> str:
        return self._keyed_chain().seal_text("\n".join(map(str, parts)))

    def fence(self, plan_id: str, owner: str) -> None:
        self._require_tx()
        self._fences[plan_id] = owner

    def _seal_tails(self) -> None:
        """Record, under the key, each plan's newest event beside the plan: cutting the plan's
        story short then shows, unless the row is set back to a seal copied earlier. A fenced
        plan's row changes only while its owner holds it; else the transaction fails."""
        fences, self._fences = self._fences, {}
        tails, self._tails = self._tails, {}
        for plan_id, (seq, digest) in tails.items():
            assert self._chain is not None
            tail = f"{seq}:{digest}:{self._chain.seal_text(audit.tail_text(plan_id, seq, digest))}"
            if plan_id not in fences:
                self._exec("UPDATE plans SET tail = ? WHERE id = ?", (tail, plan_id))
            elif not self._exec(_FENCED, (tail, plan_id, fences.pop(plan_id))).rowcount:
                raise LeaseLostError(f"{self._fence_owner(plan_id)}: the lease on plan {plan_id} was lost")
        for plan_id, owner in fences.items():
            if not self._exec(_FENCED, (None, plan_id, owner)).rowcount:
                raise LeaseLostError(f"{self._fence_owner(plan_id)}: the lease on plan {plan_id} was lost")

    def _fence_owner(self, plan_id: str) -> str:
        row = self._exec("SELECT lease_owner FROM plans WHERE id = ?", (plan_id,)).fetchone()
        return f"plan {plan_id} is held by {row[0] if row else 'nobody'}"

    def _plan_head(self, plan_id: str) -> str:
        """The hash of the plan's newest event (read under the log's lock, remembered for the transaction)."""
        if plan_id not in self._plan_heads:
            row = self._exec(
                "SELECT hash FROM events WHERE plan_id = ? ORDER BY seq DESC LIMIT 1", (plan_id,)
            ).fetchone()
            self._plan_heads[plan_id] = audit.GENESIS if row is None else str(row[0])
        return self._plan_heads[plan_id]

    def lock_log(self) -> None:
        self._require_tx()
        if self._head is None:
            self._head = self._head_for_append()
            if self._head != self._committed:  # another writer appended since: what was remembered may be stale
                self._plan_heads.clear()

    _chain: audit.Chain | None = None  # this process's key, once the log is known to be written with it

    def _chain_for_append(self, last_seq: int) -> audit.Chain:
        """The chain to append with: this process's key, refused if the log was written with another or none.

        Called inside the appending transaction, after the head is locked, so two processes
        appending to a new log cannot both record their key.
        """
        if self._chain is not None:
            return self._chain
        chain = audit.Chain(audit_key())
        row = self._exec("SELECT value FROM settings WHERE key = ?", (audit.KEY_ID,)).fetchone()
        if row is None and last_seq == 0:
            self._exec("INSERT INTO settings (key, value) VALUES (?, ?)", (audit.KEY_ID, chain.key_id))
        elif problem := audit.key_problem(None if row is None else row[0], chain, has_events=last_seq > 0):
            raise StoreError(problem)
        self._chain = chain
        return chain

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
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self._exec("SELECT id FROM plans WHERE id LIKE ? ESCAPE '\\' LIMIT 10", (escaped + "%",))
        return [r[0] for r in rows.fetchall()]

    def list_plans(self, status: str | None = None, limit: int = 100) -> list[PlanRow]:
        query = f"SELECT {_PLAN_COLUMNS} FROM plans"
        params: tuple[Any, ...] = ()
        if status is not None:
            query += " WHERE status = ?"
            params = (status,)
        rows = self._exec(query + " ORDER BY created_at, id LIMIT ?", (*params, limit)).fetchall()
        return [_plan(r) for r in rows]

    def get_version(self, plan_id: str, version: int) -> VersionRow | None:
        row = self._exec(
            "SELECT plan_id, version, hash, body, author, created_at, check_result, policy_hash"
            " FROM plan_versions WHERE plan_id = ? AND version = ?",
            (plan_id, version),
        ).fetchone()
        if row is None:
            return None
        return VersionRow(
            plan_id=row[0],
            version=row[1],
            hash=row[2],
            body=row[3],
            author=row[4],
            created_at=row[5],
            check=CheckRecord.from_dict(_load(row[6])),
            policy_hash=row[7],
        )

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

    def events(self, plan_id: str | None = None) -> Iterator[Event]:
        query = "SELECT seq, plan_id, version, step_id, kind, actor, at, data, prev, hash FROM events"
        params: tuple[Any, ...] = ()
        if plan_id is not None:
            query += " WHERE plan_id = ?"
            params = (plan_id,)
        cursor = self._exec(query + " ORDER BY seq", params)
        while batch := cursor.fetchmany(500):
            yield from map(_event, batch)

    def policy_text(self, policy_hash: str) -> str | None:
        row = self._exec("SELECT body FROM policies WHERE hash = ?", (policy_hash,)).fetchone()
        return None if row is None else str(row[0])

    def verify_audit(self, anchor: tuple[int, str] | None = None) -> audit.AuditReport:
        head = self._exec("SELECT seq, hash FROM audit_head WHERE id = 1").fetchone()
        row = self._exec("SELECT value FROM settings WHERE key = ?", (audit.KEY_ID,)).fetchone()
        written_with = None if row is None else str(row[0])
        rows = self._exec(f"SELECT {audit.COLUMNS} FROM events ORDER BY seq")
        return audit.verify(
            rows,
            written_with=written_with,
            key=find_audit_key() if written_with else None,
            head=(head[0], head[1]) if head and head[0] else None,
            anchor=anchor,
        )

    def _keyed_chain(self) -> audit.Chain:
        """This process's key, once the log is known to be written with it (StoreError if not)."""
        if self._chain is None:
            row = self._exec("SELECT value FROM settings WHERE key = ?", (audit.KEY_ID,)).fetchone()
            key = find_audit_key()
            chain = audit.Chain(key) if key is not None else None
            problem = audit.key_problem(None if row is None else str(row[0]), chain, has_events=True)
            if problem is not None or chain is None:
                raise StoreError(problem or audit.UNKEYED)
            self._chain = chain
        return self._chain

    def plan_events(self, plan_id: str) -> tuple[list[Event], str | None]:
        try:
            self._keyed_chain()
        except StoreError as exc:
            return [], str(exc)
        assert self._chain is not None
        rows = self._exec(f"SELECT {audit.COLUMNS} FROM events WHERE plan_id = ? ORDER BY seq", (plan_id,)).fetchall()
        bad = audit.verify_plan(rows, self._chain)
        if bad is not None:
            return [], f"event {bad[0]}: {bad[1]}"
        sealed = self._exec("SELECT tail FROM plans WHERE id = ?", (plan_id,)).fetchone()
        last = (rows[-1][0], rows[-1][9]) if rows and sealed else None  # no row: the tables' check says so
        if problem := audit.tail_problem(self._chain, plan_id, last, sealed[0] if sealed else None):
            return [], problem
        return [_event(r) for r in rows], None

    def audit_head(self) -> tuple[int, str]:
        row = self._exec("SELECT seq, hash FROM audit_head WHERE id = 1").fetchone()
        return (row[0], row[1]) if row and row[0] else (0, audit.GENESIS)

    _LOCK_ROWS = ""  # PostgreSQL: FOR UPDATE SKIP LOCKED (SQLite's write lock already serialises)

    def claim(self, worker: str, now: str, until: str, skip: Sequence[str] = ()) -> str | None:
        """Lease the oldest plan a worker should run: approved, or running under an expired lease."""
        excluded = f" AND id NOT IN ({', '.join('?' for _ in skip)})" if skip else ""
        with self.transaction():
            row = self._exec(
                # Never a plan under a live lease, whatever its status: a plan just claimed is still
                # "approved" until its engine starts, and must not be claimed twice in between.
                "SELECT id FROM plans WHERE kind = 'plan' AND ((status = 'approved' AND (lease_until IS NULL"
                " OR lease_until < ?)) OR (status = 'running' AND (lease_until IS NULL OR lease_until < ?)))"
                + excluded
                + " ORDER BY created_at, id LIMIT 1"
                + self._LOCK_ROWS,
                (now, now, *skip),
            ).fetchone()
            if row is None:
                return None
            self._exec("UPDATE plans SET lease_owner = ?, lease_until = ? WHERE id = ?", (worker, until, row[0]))
            return str(row[0])

    def renew(self, plan_id: str, worker: str, until: str) -> bool:
        """Extend a lease this worker holds; False when it lost it."""
        with self.transaction():
            cursor = self._exec(
                "UPDATE plans SET lease_until = ? WHERE id = ? AND lease_owner = ?", (until, plan_id, worker)
            )
            return int(cursor.rowcount) == 1

    def release(self, plan_id: str, worker: str) -> None:
        with self.transaction():
            self._exec(
                "UPDATE plans SET lease_owner = NULL, lease_until = NULL WHERE id = ? AND lease_owner = ?",
                (plan_id, worker),
            )

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in self._exec(sql, params).fetchall()]

    def command(self, sql: str, params: tuple[Any, ...] = ()) -> int:
        self._require_tx()
        return int(self._exec(sql, params).rowcount)

    def close(self) -> None:
        self._conn.close()


_FENCED = (
    "UPDATE plans SET tail = COALESCE(?, tail) WHERE id = ? AND lease_owner = ?"
    " AND status IN ('running', 'compensating')"
)


def _event(r: Any) -> Event:
    return Event(
        seq=r[0],
        plan_id=r[1],
        version=r[2],
        step_id=r[3],
        kind=r[4],
        actor=r[5],
        at=r[6],
        data=_load(r[7]),
        prev=r[8],
        hash=r[9],
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
    )


SCHEMA_V1 = [
    """CREATE TABLE plans (
        id TEXT PRIMARY KEY, status TEXT NOT NULL, version INTEGER NOT NULL, hash TEXT NOT NULL,
        task TEXT NOT NULL, category TEXT NOT NULL, requested_by TEXT NOT NULL, role TEXT, tools TEXT,
        created_at TEXT NOT NULL, updated_at TEXT NOT NULL)""",
    "CREATE INDEX plans_status ON plans (status, created_at)",
    """CREATE TABLE plan_versions (
        plan_id TEXT NOT NULL REFERENCES plans (id), version INTEGER NOT NULL, hash TEXT NOT NULL,
        body TEXT NOT NULL, author TEXT NOT NULL, created_at TEXT NOT NULL, check_result TEXT NOT NULL,
        policy_hash TEXT, PRIMARY KEY (plan_id, version))""",
    """CREATE TABLE approvals (
        id INTEGER PRIMARY KEY, plan_id TEXT NOT NULL REFERENCES plans (id), version INTEGER NOT NULL,
        plan_hash TEXT NOT NULL, policy_hash TEXT, decision TEXT NOT NULL, actor TEXT NOT NULL, role TEXT,
        kind TEXT NOT NULL, comment TEXT, at TEXT NOT NULL, void INTEGER NOT NULL DEFAULT 0)""",
    "CREATE INDEX approvals_plan ON approvals (plan_id, version)",
    """CREATE TABLE steps (
        plan_id TEXT NOT NULL REFERENCES plans (id), step_id INTEGER NOT NULL, version INTEGER NOT NULL,
        status TEXT NOT NULL, attempt INTEGER NOT NULL, idempotency_key TEXT NOT NULL, params TEXT, output TEXT,
        error TEXT, started_at TEXT, finished_at TEXT, PRIMARY KEY (plan_id, step_id))""",
    "CREATE TABLE policies (hash TEXT PRIMARY KEY, name TEXT NOT NULL, body TEXT NOT NULL)",
    """CREATE TABLE events (
        seq INTEGER PRIMARY KEY, plan_id TEXT, version INTEGER, step_id INTEGER, kind TEXT NOT NULL,
        actor TEXT NOT NULL, at TEXT NOT NULL, data TEXT NOT NULL, prev TEXT NOT NULL, hash TEXT NOT NULL)""",
    "CREATE INDEX events_plan ON events (plan_id, seq)",
    "CREATE TABLE audit_head (id INTEGER PRIMARY KEY CHECK (id = 1), seq INTEGER NOT NULL, hash TEXT NOT NULL)",
    "INSERT INTO audit_head (id, seq, hash) VALUES (1, 0, '')",
]
SCHEMA_V2 = [
    """CREATE TABLE model_calls (
        id TEXT PRIMARY KEY, at TEXT NOT NULL, plan_id TEXT, task TEXT NOT NULL, model TEXT NOT NULL,
        purpose TEXT NOT NULL, expected_steps INTEGER, budget INTEGER, effort TEXT, input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL, thinking_tokens INTEGER NOT NULL, cost REAL, seconds REAL NOT NULL,
        ok INTEGER NOT NULL, error TEXT)""",
    "CREATE INDEX model_calls_at ON model_calls (at)",
    "CREATE INDEX model_calls_plan ON model_calls (plan_id)",
    """CREATE TABLE templates (
        name TEXT PRIMARY KEY, pattern TEXT NOT NULL, slots TEXT NOT NULL, body TEXT NOT NULL,
        source_plan TEXT NOT NULL, created_by TEXT NOT NULL, created_at TEXT NOT NULL)""",
]
SCHEMA_V3 = ["ALTER TABLE plans ADD COLUMN kind TEXT NOT NULL DEFAULT 'plan'"]
SCHEMA_V4 = [
    """CREATE TABLE users (
        name TEXT PRIMARY KEY, role TEXT NOT NULL, categories TEXT NOT NULL, password_hash TEXT,
        created_at TEXT NOT NULL)""",
    """CREATE TABLE api_tokens (
        digest TEXT PRIMARY KEY, user_name TEXT NOT NULL REFERENCES users (name), label TEXT NOT NULL,
        created_at TEXT NOT NULL)""",
    "CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
]
SCHEMA_V5 = [
    """CREATE TABLE register (
        category TEXT PRIMARY KEY, auto INTEGER NOT NULL, changed_by TEXT NOT NULL, changed_at TEXT NOT NULL,
        reason TEXT NOT NULL)""",
]
SCHEMA_V6 = ["ALTER TABLE plans ADD COLUMN lease_owner TEXT", "ALTER TABLE plans ADD COLUMN lease_until TEXT"]
SCHEMA_V7 = [
    "ALTER TABLE events ADD COLUMN plan_prev TEXT",
    "ALTER TABLE plans ADD COLUMN tail TEXT",
    "ALTER TABLE register ADD COLUMN seal TEXT",
]
MIGRATIONS: list[list[str]] = [SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_V4, SCHEMA_V5, SCHEMA_V6, SCHEMA_V7]
"""Schema migrations, in order: migration N brings the schema from version N-1 to N."""
