"""The embedded store: one SQLite file in WAL mode."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, Literal

from plangate.errors import StoreError
from plangate.store._schema import MIGRATIONS
from plangate.store._sql import SQLStore

Synchronous = Literal["normal", "full"]

_CHECKPOINT_PAGES = 4_000


class SQLiteStore(SQLStore):
    """A store in one SQLite file.

    WAL journal; ``synchronous=normal`` (the default) survives a crash of the process,
    ``synchronous=full`` also survives losing power, at the cost of an fsync per commit.
    The engine commits once per step, so that is one fsync per step.
    """

    def __init__(self, path: str | Path, *, synchronous: Synchronous = "normal") -> None:
        self.path = Path(path)
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(str(path), timeout=30, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(f"PRAGMA synchronous = {'FULL' if synchronous == 'full' else 'NORMAL'}")
            conn.execute("PRAGMA foreign_keys = ON")
            conn.execute("PRAGMA busy_timeout = 30000")
            # A checkpoint (the WAL's pages copied into the file, and an fsync) every 4,000 pages
            # rather than SQLite's 1,000: a step writes about 10, so the engine's thread stops for
            # one every 400 steps rather than every 100, at the cost of a WAL of up to 16 MiB.
            conn.execute(f"PRAGMA wal_autocheckpoint = {_CHECKPOINT_PAGES}")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the SQLite store at {str(path)!r}: {exc}") from None
        super().__init__(f"sqlite:///{path}", conn)
        self.synchronous = synchronous
        self._migrate()

    def _exec(self, query: str, params: tuple[Any, ...] = ()) -> Any:
        return self._conn.execute(query, params)  # SQLite's placeholders are the store's own: nothing to rewrite

    def _begin(self) -> None:
        # IMMEDIATE takes the write lock at once, so reading the audit head inside the
        # transaction and appending after it cannot race another process.
        self._conn.execute("BEGIN IMMEDIATE")

    def _migrate(self) -> None:
        with self.transaction():
            current = int(self._conn.execute("PRAGMA user_version").fetchone()[0])
            if current > len(MIGRATIONS):
                raise StoreError(
                    f"the store at {str(self.path)!r} has schema version {current}, newer than this plangate "
                    f"understands ({len(MIGRATIONS)}); upgrade plangate"
                )
            for number, statements in enumerate(MIGRATIONS[current:], start=current + 1):
                for statement in statements:
                    self._migrate_by(statement)
                self._conn.execute(f"PRAGMA user_version = {number}")
