"""The audit log in SQL: appending under the key, sealing each plan's newest event, fencing, verifying.

A mixin of :class:`~plangate.store._sql.SQLStore`, which supplies the connection, the
transaction and the state it keeps per transaction (the head, each plan's newest event).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from plangate import audit
from plangate._auditkey import audit_key, find_audit_key
from plangate.errors import StoreError
from plangate.plan import canonical
from plangate.store._records import Event


def _dump(value: Any) -> str:
    return "null" if value is None else canonical(value)


def _load(text: str | None) -> Any:
    try:
        return None if text is None else json.loads(text)
    except ValueError as exc:
        raise StoreError(f"a stored value is not JSON ({exc}): it was changed outside plangate") from None


_Pending = tuple[str | None, int | None, int | None, str, str, str, str]
"""An event recorded but not yet written: plan, version, step, kind, actor, time, its data as JSON text."""

_VERIFIED: dict[tuple[str, str, str], tuple[int, str, tuple[Event, ...]]] = {}
"""Per (store, key, kind): the newest event a process verified, its hash, and the events up to it."""


_ROWS_A_STATEMENT = 1000
"""Events written in one INSERT at most (12 parameters each)."""

_COUNT_AFTER = (
    "SELECT COUNT(*), COALESCE(MAX(seq), 0), (SELECT seq FROM audit_head WHERE id = 1) FROM events WHERE seq > ?"
)


def _key_id() -> str:
    """Which key this process holds, without keeping the key itself in a cache's key."""
    key = find_audit_key()
    return hashlib.sha256(b"plangate verified-events cache\n" + key).hexdigest() if key else ""


class AuditLog:
    """The audit log's half of the SQL store."""

    url: str

    _head: tuple[int, str] | None
    _committed: tuple[int, str] | None
    _plan_heads: dict[str, str]
    _tails: dict[str, tuple[int, str]]
    _fences: dict[str, str]
    _pending: list[_Pending]  # events recorded in this transaction, written when the log is first needed
    _DEFER_APPENDS = False  # SQLite's transactions take the write lock as they begin: nothing to shorten
    _chain: audit.Chain | None = None  # this process's key, once the log is known to be written with it

    def _exec(self, query: str, params: tuple[Any, ...] = ()) -> Any:
        raise NotImplementedError

    def _require_tx(self) -> None:
        raise NotImplementedError

    def _write(
        self,
        query: str,
        params: tuple[Any, ...],
        *,
        key: tuple[Any, ...] | None = None,
        lost: str | Callable[[], str] | None = None,
    ) -> None:
        raise NotImplementedError

    def _head_for_append(self) -> tuple[int, str]:
        raise NotImplementedError

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
        self.lock_log()  # writes the events recorded before it first: the log keeps the order they came in
        row = (plan_id, version, step_id, kind, actor, at, _dump(data))
        ((seq, prev, digest),) = self._write_events([row])
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
        """Append an event at the latest when the transaction commits: the log's lock is then held only
        from the first statement that needs the log (or the commit) to the commit, not for the whole
        transaction. Any statement of this transaction that reads the log writes the waiting events first."""
        self._require_tx()
        row = (plan_id, version, step_id, kind, actor, at, _dump(data))
        if self._head is not None or not self._DEFER_APPENDS:  # the lock is held already: nothing to gain
            self.lock_log()
            self._write_events([row])
        else:
            self._pending.append(row)

    def _write_events(self, rows: list[_Pending]) -> list[tuple[int, str, str]]:
        """Chain ``rows`` after the locked head, in one statement; each one's seq, prev and hash."""
        assert self._head is not None
        values: list[Any] = []
        written: list[tuple[int, str, str]] = []
        for plan_id, version, step_id, kind, actor, at, text in rows:
            seq, prev = self._head[0] + 1, self._head[1]
            chain_of = plan_id if plan_id is not None else f"~{kind}"  # events of no plan chain by kind
            plan_prev = self._plan_head(chain_of)
            row = (seq, plan_id, version, step_id, kind, actor, at, text, prev, "", plan_prev, audit.data_digest(text))
            digest = self._chain_for_append(seq - 1).sign(row)
            values += (*row[:9], digest, *row[10:])
            self._head = (seq, digest)
            self._plan_heads[chain_of] = digest
            self._tails[chain_of] = (seq, digest)
            written.append((seq, prev, digest))
        width = len(values) // len(rows) if rows else 0
        for first in range(0, len(rows), _ROWS_A_STATEMENT):  # PostgreSQL takes 65,535 parameters a statement
            some = rows[first : first + _ROWS_A_STATEMENT]
            places = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * len(some))
            part = values[first * width : (first + len(some)) * width]
            self._write(f"INSERT INTO events ({audit.COLUMNS}) VALUES {places}", tuple(part))
        return written

    def purge_event(self, seq: int, kept: dict[str, Any], at: str) -> None:
        """Replace event ``seq``'s data with ``kept`` marked purged on ``at``, sealed under the key.

        Its hash stays as it is: it covers the digest of the data as first written, which the
        event keeps; the seal lets the verifier take the marked data in its place.
        """
        self._require_tx()
        row = self._exec("SELECT data_hash FROM events WHERE seq = ?", (seq,)).fetchone()
        if row is None or row[0] is None:
            raise StoreError(f"event {seq} was hashed over its data itself: its payload cannot be purged")
        marked = {**kept, "purged": {"at": at}}
        seal = self._keyed_chain().purge_seal(seq, str(row[0]), _dump(marked))
        sealed = _dump({**kept, "purged": {"at": at, "seal": seal}})
        self._exec("UPDATE events SET data = ? WHERE seq = ?", (sealed, seq))

    def verified_events(self, kind: str) -> list[Event]:
        """Every event of ``kind`` that belongs to no plan, each checked under the key, in order.

        The events a process has verified are kept (per store, key and kind), so a later call
        verifies only the newer ones, chained from the newest it knew (itself checked again):
        an older event changed since then cannot change the answer (a new process, and
        ``plangate audit verify``, read them all again).
        No events at all, where the key's seal says there were some, or where the log has
        gaps, is deletion, refused like an edit. The events and their seal are read in separate
        statements: a problem seen while another process appended is looked at again.
        """
        newest = "SELECT COALESCE(MAX(seq), 0) FROM events"
        for _ in range(20):  # each look costs little; a log that grows all the time is looked at again
            before = self._exec(newest).fetchone()[0]
            try:
                return self._verified_events(kind)
            except StoreError:
                if self._exec(newest).fetchone()[0] == before:  # nobody wrote meanwhile: the problem is in the log
                    raise
        return self._verified_events(kind)

    def _verified_events(self, kind: str) -> list[Event]:
        sealed_row = self._exec("SELECT value FROM settings WHERE key = ?", (f"tail:{kind}",)).fetchone()
        sealed = sealed_row and sealed_row[0]
        cached = self._verified_before(kind)
        after, before, known = cached or (0, audit.GENESIS, ())
        query = f"SELECT {audit.COLUMNS} FROM events WHERE plan_id IS NULL AND kind = ? AND seq > ? ORDER BY seq"
        rows = self._exec(query, (kind, after)).fetchall()
        if not rows and not known:
            if sealed:
                raise StoreError(
                    f"the {kind} events were deleted outside plangate (its seal names events that are "
                    "gone); see audit verify"
                )
            if problem := self._gaps() or self._false_starts():  # an edit anywhere hides whether any were deleted
                raise StoreError(
                    f"the audit log was changed outside plangate ({problem}), so whether {kind} events were "
                    "deleted cannot be told; see plangate audit verify"
                )
            return []
        chain = self._keyed_chain()
        bad = audit.verify_plan(rows, chain, before)
        last = (rows[-1][0], rows[-1][9]) if rows else (after, before)
        problem = f"event {bad[0]}: {bad[1]}" if bad else audit.tail_problem(chain, f"~{kind}", last, sealed)
        if problem := problem or self._follows(last, (None, kind)):
            raise StoreError(f"the {kind} events were changed outside plangate ({problem}); see plangate audit verify")
        events = (*known, *(_event(r) for r in rows))
        _VERIFIED[(self.url, _key_id(), kind)] = (last[0], last[1], events)
        return list(events)

    def _verified_before(self, kind: str) -> tuple[int, str, tuple[Event, ...]] | None:
        """What this process verified of ``kind`` before, if its newest event is still there unchanged."""
        cached = _VERIFIED.get((self.url, _key_id(), kind))
        if cached is None:
            return None
        query = f"SELECT {audit.COLUMNS} FROM events WHERE seq = ? AND kind = ? AND plan_id IS NULL"
        row = self._exec(query, (cached[0], kind)).fetchone()
        unchanged = row is not None and row[9] == cached[1] and self._keyed_chain().hash(row) == row[9]
        return cached if unchanged else None

    def _false_starts(self) -> str | None:
        """Whether an event that begins a chain (a plan's, or a kind's) was edited: say, given another kind.

        With no event of a kind at all, the kind's first event may have been relabelled; every
        chain's first event is checked under the key (one per plan and per kind).
        """
        rows = self._exec(f"SELECT {audit.COLUMNS} FROM events WHERE plan_prev = ?", (audit.GENESIS,)).fetchall()
        if not rows:
            return None
        chain = self._keyed_chain()
        bad = next((row[0] for row in rows if chain.hash(row) != row[9]), None)
        return f"event {bad} does not match its hash: it was edited" if bad is not None else None

    def _gaps(self) -> str | None:
        """Whether events were deleted: plangate numbers them 1, 2, 3... with no gaps, up to the head it keeps."""
        count, top, head = self._exec(_COUNT_AFTER, (0,)).fetchone()  # one statement: one snapshot
        if count != top or (head or 0) > top:
            return f"the log holds {count} events numbered up to {top}, its head is event {head}: events were deleted"
        return None

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
            if plan_id.startswith("~"):  # the newest event of a kind that belongs to no plan
                self._write(_SEAL_SETTING, (f"tail:{plan_id[1:]}", tail), key=("setting", plan_id))
            elif plan_id not in fences:
                self._write("UPDATE plans SET tail = ? WHERE id = ?", (tail, plan_id), key=("plan", plan_id))
            else:
                self._fenced(plan_id, tail, fences.pop(plan_id))
        for plan_id, owner in fences.items():
            self._fenced(plan_id, None, owner)

    def _fenced(self, plan_id: str, tail: str | None, owner: str) -> None:
        """Seal the plan's newest event (``tail``, if any) only while ``owner`` holds the plan."""
        lost = functools.partial(self._lease_lost, plan_id)
        self._write(_FENCED, (tail, plan_id, owner), key=("plan", plan_id), lost=lost)

    def _lease_lost(self, plan_id: str) -> str:
        return f"{self._fence_owner(plan_id)}: the lease on plan {plan_id} was lost"

    def _fence_owner(self, plan_id: str) -> str:
        row = self._exec("SELECT lease_owner FROM plans WHERE id = ?", (plan_id,)).fetchone()
        return f"plan {plan_id} is held by {row[0] if row else 'nobody'}"

    def _plan_head(self, plan_id: str) -> str:
        """The hash of the plan's newest event (read under the log's lock, remembered for the transaction)."""
        if plan_id not in self._plan_heads:
            where, key = (
                ("plan_id IS NULL AND kind = ?", plan_id[1:]) if plan_id.startswith("~") else ("plan_id = ?", plan_id)
            )
            row = self._exec(f"SELECT hash FROM events WHERE {where} ORDER BY seq DESC LIMIT 1", (key,)).fetchone()
            self._plan_heads[plan_id] = audit.GENESIS if row is None else str(row[0])
        return self._plan_heads[plan_id]

    def lock_log(self) -> None:
        self._require_tx()
        pending, self._pending = self._pending, []  # taken first: the statements below need the log themselves
        if self._head is None:
            self._head = self._head_for_append()
            if self._head != self._committed:  # another writer appended since: what was remembered may be stale
                self._plan_heads.clear()
        if pending:
            self._write_events(pending)

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

    def events(self, plan_id: str | None = None) -> Iterator[Event]:
        query = "SELECT seq, plan_id, version, step_id, kind, actor, at, data, prev, hash FROM events"
        params: tuple[Any, ...] = ()
        if plan_id is not None:
            query += " WHERE plan_id = ?"
            params = (plan_id,)
        cursor = self._exec(query + " ORDER BY seq", params)
        while batch := cursor.fetchmany(500):
            yield from map(_event, batch)

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
        return self._plan_events(plan_id, numbered=False)

    def plans_events(self, plan_ids: Iterable[str]) -> Iterator[tuple[str, list[Event], str | None]]:
        """:meth:`plan_events` of each plan, in the caller's snapshot: whether an event is missing from the log's
        numbering is asked once for them all, where each plan's alone counts the events after its own newest
        (a count that made reading many plans take time in the square of their number)."""
        numbered = self._gaps() is None
        for plan_id in plan_ids:
            yield plan_id, *self._plan_events(plan_id, numbered=numbered)

    def _plan_events(self, plan_id: str, *, numbered: bool) -> tuple[list[Event], str | None]:
        """``numbered``: the log is known to number its events with no gaps, up to its head."""
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
        if last is not None and (problem := self._follows(last, (plan_id, None), numbered=numbered)):
            return [], problem
        return [_event(r) for r in rows], None

    def _follows(
        self, last: tuple[int, str], chain: tuple[str | None, str | None], *, numbered: bool = False
    ) -> str | None:
        """The log goes on from a chain's newest event, whole, and the chain does not go on elsewhere.

        Cheap checks against a chain's newest events cut out of the log (or given another
        kind or plan) with an older seal put back: the next event links to the newest; no
        event after it is missing (plangate numbers events with no gaps, up to the head it
        keeps; counting the events after one reads only those); and no event after it
        continues the chain under another name (``chain``: the plan, or the kind of a plan-less
        chain, whose newer events are just newer). ``plangate audit verify`` checks everything.
        ``numbered``: the whole log is known to number its events with no gaps (:meth:`_gaps`): none is counted.
        """
        seq, digest = last
        query, params = (_NEXT, (seq, seq, digest, seq)) if numbered else (_FOLLOWS, (seq, seq, seq, digest, seq))
        row = self._exec(query, params).fetchone()  # one statement: one snapshot
        after, count, top, head, moved = row[0:2], row[2], row[3], row[4], row[5:8]
        if after[0] is not None and tuple(after) != (seq + 1, digest):
            return f"the log does not go on from the chain's newest event {seq}: events after it were cut out"
        if (count is not None and count != max(top - seq, 0)) or (head or 0) > max(top, seq):
            return f"events after event {seq} were deleted: the log numbers them with gaps"
        plan_id, kind = chain
        if moved[0] is not None and (moved[1] != plan_id or (plan_id is None and moved[2] != kind)):
            return f"event {moved[0]} continues the chain of event {seq} under another kind or plan: it was relabelled"
        return None

    def audit_head(self) -> tuple[int, str]:
        row = self._exec("SELECT seq, hash FROM audit_head WHERE id = 1").fetchone()
        return (row[0], row[1]) if row and row[0] else (0, audit.GENESIS)


_AFTER = (
    "SELECT n.seq, n.prev, {count}, (SELECT COALESCE(MAX(seq), 0) FROM events"
    " WHERE seq > ?), (SELECT seq FROM audit_head WHERE id = 1), g.seq, g.plan_id, g.kind FROM (SELECT 1) AS one"
    " LEFT JOIN (SELECT seq, prev FROM events WHERE seq > ? ORDER BY seq LIMIT 1) AS n ON 1 = 1"
    " LEFT JOIN (SELECT seq, plan_id, kind FROM events WHERE plan_prev = ? AND seq + 0 > ? ORDER BY seq + 0 LIMIT 1)"
    " AS g ON 1 = 1"
)
_FOLLOWS = _AFTER.format(count="(SELECT COUNT(*) FROM events WHERE seq > ?)")
"""What :meth:`AuditLog._follows` reads after a chain's newest event: the next event, how many follow and the
newest number, the head, and the first later event that continues the chain; in one statement, one snapshot.
The events that continue one chain are one or two, found through the index on plan_prev alone: compared as
``seq + 0``, the events after S are not also gathered from the primary key (a planner would, and AND them)."""
_NEXT = _AFTER.format(count="NULL")
"""The same, but for the count (reading every event after S), where the log is known to have no gaps."""

_SEAL_SETTING = "INSERT INTO settings (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
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
