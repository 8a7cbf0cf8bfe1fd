"""The PostgreSQL store: the same SQL as SQLite's, for many workers on many machines.

``open_store("postgresql://user@host:port/db")``. Appends to the audit log take an advisory
lock and then the head row's (``SELECT ... FOR UPDATE``), so concurrent writers chain their
events one after another (the engine's step events wait for the commit, so a run's transaction
holds that lock only for its last statements). A transaction's writes that nobody reads before
the commit (step records, events, seals, the head) go out together as one statement, with the
lock or at the commit: a step between two others costs four round trips. Within one process,
appending transactions first queue for a lock of the process's own, so that at most one of its
connections waits for the log's lock in the database at a time. Migrations run under
another advisory lock, so workers starting together migrate once. Install with
``pip install 'plangate[postgres]'``.
"""

from __future__ import annotations

import functools
import os
import threading
from datetime import datetime
from typing import Any

from plangate import audit
from plangate.errors import StoreError
from plangate.store._schema import MIGRATIONS
from plangate.store._sql import SQLStore

try:
    import psycopg
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the PostgreSQL store needs psycopg: pip install 'plangate[postgres]'") from exc

_MIGRATION_LOCK = 4_201_746
_LOG_LOCK = 4_201_747

QUEUE_WAIT = 1.0
"""Seconds a transaction waits behind another of its process for the log's lock before it queues
in the database regardless (where a deadlock, should one ever form, is found and broken)."""


class _Queue:
    """A process's queue for the log's lock, held by one store at a time, which it names: a store
    gives it back only if it holds it. An exception raised in a waiting thread from outside (Temporal
    cancels a sync activity so) comes as the thread runs Python again, just after it took a plain
    lock and before it could say so: that lock would stay taken for the process's life."""

    def __init__(self) -> None:
        self._turn = threading.Condition(threading.Lock())
        self._holder: object | None = None

    def take(self, holder: object, timeout: float) -> None:
        """Hold the queue for ``holder``, waiting at most ``timeout`` seconds (then not)."""
        with self._turn:
            if self._turn.wait_for(lambda: self._holder is None, timeout):
                self._holder = holder

    def give_back(self, holder: object) -> None:
        with self._turn:
            if self._holder is holder:
                self._holder = None
                self._turn.notify()

    def locked(self) -> bool:
        return self._holder is not None


_QUEUES: dict[str, _Queue] = {}
"""Per database: the queue this process's appending transactions take before the log's own lock, so
that of all the runs of a worker at most one waits for the log's lock in the database. Measured
with two workers at concurrency 32, eight rounds each: 14% more plans/s for independent steps,
9% for chained ones. It only orders this process's transactions; the database lock still decides."""
os.register_at_fork(after_in_child=_QUEUES.clear)  # a child's own: none of its threads holds them

_LOCK_THE_LOG = (
    f"SELECT seq, hash FROM audit_head WHERE id = (SELECT 1 FROM pg_advisory_xact_lock({_LOG_LOCK})) FOR UPDATE"
)
"""The log's lock, then its head. Appenders queue for the advisory lock, which wakes one at a time;
waiting on the head row's lock wakes them all at every commit, which costs PostgreSQL more CPU than
the appends themselves once dozens wait. The row is still locked, for any writer that takes only that
lock; the advisory lock is taken first (the row's id is computed from it), so no two wait on each other."""


@functools.lru_cache(maxsize=1024)
def _numbered(query: str) -> str:
    """The store's ``?`` placeholders as PostgreSQL's ``$1``, ``$2``..., in order."""
    pieces = query.split("?")
    return "".join(f"{piece}${n}" for n, piece in enumerate(pieces[:-1], start=1)) + pieces[-1]


def _dialect(statement: str) -> str:
    """SQLite's DDL in PostgreSQL's words."""
    return statement.replace("id INTEGER PRIMARY KEY, plan_id", "id BIGSERIAL PRIMARY KEY, plan_id").replace(
        " REAL", " DOUBLE PRECISION"
    )


class PostgresStore(SQLStore):
    def __init__(self, url: str) -> None:
        try:
            # Raw cursors: PostgreSQL's own $1 placeholders, numbered here once per statement's text
            # (cached), rather than the driver parsing each statement's %s, and for statements with more
            # than 50 parameters (a transaction's writes sent together) at every execution.
            conn: Any = psycopg.connect(url, autocommit=True, cursor_factory=psycopg.RawCursor)
        except psycopg.Error as exc:
            raise StoreError(f"cannot open the PostgreSQL store at {url!r}: {exc}") from None
        self._cursor = conn.cursor()
        self._queued: _Queue | None = None  # this process's queue for the log's lock, once asked for
        super().__init__(url, conn)
        try:
            self._migrate()
        except BaseException:
            conn.close()  # a store it refuses (a newer schema) leaves no connection open
            raise

    _LOCK_ROWS = " FOR UPDATE SKIP LOCKED"
    _RUNNABLE = ""  # PostgreSQL's planner finds plans_runnable itself
    _SAME = "IS NOT DISTINCT FROM"
    _SNAPSHOT = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
    _HEAD_IS_THE_LOCK = True
    _DEFER_WRITES = True  # a transaction's writes that nobody reads go out together, in one statement
    _DEFER_APPENDS = True  # the head row's lock is taken late: from the first statement that needs the log

    def database_time(self) -> datetime:
        with self._lock:  # clock_timestamp(): the time now, not the transaction's start (now())
            moment = self._exec("SELECT clock_timestamp()").fetchone()[0]
        assert isinstance(moment, datetime)
        return moment

    def broken(self) -> bool:
        return bool(self._conn.broken)

    def _sql(self, query: str) -> str:
        return _numbered(query)

    def _ddl(self, statement: str) -> str:
        return _dialect(statement)

    def _at_once(self, query: str, params: tuple[Any, ...] = ()) -> Any:
        # psycopg's Connection.execute makes a cursor for each statement, about 15 µs of CPU
        # of the 40 to 60 a statement costs here. These statements are sent under the store's
        # lock and their answers read at once, so one cursor serves them all; a reader that
        # keeps its cursor while it sends others (_exec) still gets a cursor of its own.
        return self._cursor.execute(query, params)

    def _head_for_append(self) -> tuple[int, str]:
        queue = _QUEUES.setdefault(self.url, _Queue())
        self._queued = queue  # before it is taken: the transaction's end gives it back if this store holds it
        queue.take(self, QUEUE_WAIT)  # not taken in time: wait in the database, as any other writer does
        row = self._read_one(_LOCK_THE_LOG)  # with the waiting writes, in one round trip
        return (row[0], row[1]) if row and row[0] else (0, audit.GENESIS)

    def _log_released(self) -> None:
        queue, self._queued = self._queued, None
        if queue is not None:
            queue.give_back(self)

    def _migrate(self) -> None:
        try:  # the usual case, a store already at this version: one statement, no lock waited for
            row = self._conn.execute("SELECT version FROM plangate_schema").fetchone()
        except psycopg.errors.UndefinedTable:
            row = None
        if row is not None and row[0] == len(MIGRATIONS):
            return
        with self.transaction():
            self._conn.execute("SELECT pg_advisory_xact_lock($1)", (_MIGRATION_LOCK,))
            self._conn.execute("CREATE TABLE IF NOT EXISTS plangate_schema (version INTEGER NOT NULL)")
            row = self._conn.execute("SELECT version FROM plangate_schema").fetchone()
            current = row[0] if row else 0
            if row is None:
                self._conn.execute("INSERT INTO plangate_schema (version) VALUES (0)")
            if current > len(MIGRATIONS):
                raise StoreError(
                    f"the store at {self.url!r} has schema version {current}, newer than this "
                    f"plangate understands ({len(MIGRATIONS)}); upgrade plangate"
                )
            for number, statements in enumerate(MIGRATIONS[current:], start=current + 1):
                for statement in statements:
                    self._migrate_by(statement)
                self._conn.execute("UPDATE plangate_schema SET version = $1", (number,))
