"""The PostgreSQL store: the same SQL as SQLite's, for many workers on many machines.

``open_store("postgresql://user@host:port/db")``. Appends to the audit log lock the
head row (``SELECT ... FOR UPDATE``), so concurrent writers chain their events one after
another (the engine's step events wait for the commit, so a run's transaction holds that
lock only for its last statements); migrations run under an advisory lock, so workers starting together migrate
once. Install with ``pip install 'plangate[postgres]'``.
"""

from __future__ import annotations

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


def _dialect(statement: str) -> str:
    """SQLite's DDL in PostgreSQL's words."""
    return statement.replace("id INTEGER PRIMARY KEY, plan_id", "id BIGSERIAL PRIMARY KEY, plan_id").replace(
        " REAL", " DOUBLE PRECISION"
    )


class PostgresStore(SQLStore):
    def __init__(self, url: str) -> None:
        try:
            conn: Any = psycopg.connect(url, autocommit=True)
        except psycopg.Error as exc:
            raise StoreError(f"cannot open the PostgreSQL store at {url!r}: {exc}") from None
        super().__init__(url, conn)
        self._migrate()

    _LOCK_ROWS = " FOR UPDATE SKIP LOCKED"
    _SAME = "IS NOT DISTINCT FROM"
    _SNAPSHOT = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
    _HEAD_IS_THE_LOCK = True
    _DEFER_APPENDS = True  # the head row's lock is taken late: from the first statement that needs the log

    def _sql(self, query: str) -> str:
        return query.replace("?", "%s")

    def _head_for_append(self) -> tuple[int, str]:
        row = self._exec("SELECT seq, hash FROM audit_head WHERE id = 1 FOR UPDATE").fetchone()
        return (row[0], row[1]) if row and row[0] else (0, audit.GENESIS)

    def _migrate(self) -> None:
        with self.transaction():
            self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
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
                    self._conn.execute(_dialect(statement))
                self._conn.execute("UPDATE plangate_schema SET version = %s", (number,))
