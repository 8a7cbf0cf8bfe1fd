"""Is this SQL one statement that only reads? SQLite's own parser decides, not a pattern.

A pattern over SQL text is a deny-list, and SQL has more ways to write than any list
names: ``UPDATE``, ``REPLACE INTO``, ``ALTER TABLE ... RENAME``, ``PRAGMA
writable_schema``, ``ATTACH``, ``VACUUM INTO``, comments and quoting between keywords.
So the statement is compiled, never run, by SQLite itself, against an empty in-memory
database that holds the policy's tables, and three things must hold:

1. it is one statement (``sqlite3`` refuses a second one);
2. everything SQLite's authorizer is asked about is a ``SELECT``, reading a column or
   calling a function (not ``load_extension``), and the first thing it is asked about is
   a ``SELECT``: inserts, updates, deletes, pragmas, attaching, schema changes and
   transactions are each refused by name;
3. its compiled program opens no write transaction and has no instruction that writes,
   vacuums or controls a transaction (``VACUUM`` asks the authorizer nothing at all).

A table the policy does not list cannot be read: SQLite cannot compile the statement.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import closing

_ACTION_CODES = (  # the authorizer's action codes, in SQLite's order
    "CREATE_INDEX CREATE_TABLE CREATE_TEMP_INDEX CREATE_TEMP_TABLE CREATE_TEMP_TRIGGER CREATE_TEMP_VIEW "
    "CREATE_TRIGGER CREATE_VIEW DELETE DROP_INDEX DROP_TABLE DROP_TEMP_INDEX DROP_TEMP_TABLE DROP_TEMP_TRIGGER "
    "DROP_TEMP_VIEW DROP_TRIGGER DROP_VIEW INSERT PRAGMA READ SELECT TRANSACTION UPDATE ATTACH DETACH "
    "ALTER_TABLE REINDEX ANALYZE CREATE_VTABLE DROP_VTABLE FUNCTION SAVEPOINT RECURSIVE"
)
_NAMES = {getattr(sqlite3, f"SQLITE_{name}"): name.replace("_", " ") for name in _ACTION_CODES.split()}
_READING = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION}
_DEFINING = {sqlite3.SQLITE_CREATE_TABLE, sqlite3.SQLITE_CREATE_INDEX, sqlite3.SQLITE_CREATE_VIEW}
_BOOKKEEPING = {sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_READ}  # on sqlite_master, by CREATE
_WRITING = "Vacuum IncrVacuum OpenWrite Savepoint AutoCommit VUpdate VBegin ParseSchema SetCookie CreateBtree Destroy"
_WRITING_OPCODES = frozenset([*_WRITING.split(), "Clear", "JournalMode"])
"""Instructions of a compiled program that write, vacuum or control a transaction."""
_Authorizer = Callable[[int, str | None, str | None, str | None, str | None], int]


class ReadOnlySQL:
    """The read-only check for statements run against a database whose tables ``tables`` defines."""

    def __init__(self, tables: str) -> None:
        """``tables``: the database's CREATE TABLE, CREATE INDEX and CREATE VIEW statements."""
        self.tables = tables
        with closing(sqlite3.connect(":memory:", isolation_level=None)) as conn:
            for statement in _statements(tables):
                seen: list[int] = []
                refused: list[str] = []
                conn.set_authorizer(_authorizer(_DEFINING | _BOOKKEEPING | _READING, seen, refused))
                try:
                    conn.execute(statement)
                except (sqlite3.Error, sqlite3.Warning) as exc:
                    raise ValueError(f"cannot create the tables: {refused[0] if refused else exc}") from None
                if not _DEFINING.intersection(seen):
                    raise ValueError(f"tables may only hold CREATE TABLE, INDEX and VIEW statements: {statement!r}")

    def problem(self, statement: str) -> str | None:
        """Why ``statement`` is not one read-only statement over these tables; None when it is."""
        with closing(sqlite3.connect(":memory:", isolation_level=None)) as conn:
            conn.executescript(self.tables)
            seen: list[int] = []
            refused: list[str] = []
            conn.set_authorizer(_authorizer(_READING, seen, refused))
            try:
                program = conn.execute(f"EXPLAIN {statement}").fetchall()
            except sqlite3.ProgrammingError:
                return "it is more than one statement"
            except (sqlite3.Error, sqlite3.Warning) as exc:
                if refused:
                    return f"it is not a read-only statement: {refused[0]}"
                return f"SQLite cannot compile it: {exc}"
        if not seen or seen[0] != sqlite3.SQLITE_SELECT:
            return "it is not a query: SQLite reports no SELECT"
        writes = sorted({row[1] for row in program if row[1] in _WRITING_OPCODES or _writes(row)})
        return f"it compiles to a program that writes ({', '.join(writes)})" if writes else None


def _statements(script: str) -> list[str]:
    """The statements of ``script``, each ending at a ``;`` that SQLite says completes it."""
    out: list[str] = []
    start = 0
    for end, char in enumerate(script):
        if char == ";" and sqlite3.complete_statement(script[start : end + 1]):
            out.append(script[start : end + 1])
            start = end + 1
    if script[start:].strip():
        out.append(script[start:])
    return out


def _writes(row: tuple[object, ...]) -> bool:
    """A ``Transaction`` instruction whose P2 is not 0 opens a write transaction."""
    return row[1] == "Transaction" and row[3] != 0


def _authorizer(allowed: set[int], seen: list[int], refused: list[str]) -> _Authorizer:
    """Allow only ``allowed`` actions (never ``load_extension``), noting each action and each refusal."""

    def authorize(action: int, first: str | None, second: str | None, db: str | None, trigger: str | None) -> int:
        seen.append(action)
        loads = action == sqlite3.SQLITE_FUNCTION and (second or "").lower() == "load_extension"
        if action in allowed and not loads:
            return sqlite3.SQLITE_OK
        refused.append(_describe(action, first, second))
        return sqlite3.SQLITE_DENY

    return authorize


def _describe(action: int, first: str | None, second: str | None) -> str:
    """What SQLite was asked to allow: ``UPDATE on invoices.status``, ``PRAGMA writable_schema 1``..."""
    if action == sqlite3.SQLITE_ALTER_TABLE:
        first, second = second, None  # (database, table)
    if action == sqlite3.SQLITE_FUNCTION:
        first = None
    joint = "." if action in (sqlite3.SQLITE_READ, sqlite3.SQLITE_UPDATE) else " "  # table.column
    target = joint.join(part for part in (first, second) if part)
    on = " on" if action in _ON_TABLES else ""
    return f"SQLite reports {_NAMES.get(action, f'action {action}')}{on}" + (f" {target}" if target else "")


_ON_TABLES = {sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE, sqlite3.SQLITE_ALTER_TABLE}
