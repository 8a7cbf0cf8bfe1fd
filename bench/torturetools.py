"""Tools for the crash torture: every call and every effect is counted in a ledger of their own.

``idem`` is idempotent (its effect is keyed by the idempotency key: check, then apply);
``once`` is not (every call sends again), and writes down, as its last act, that it returned
(with the process it ran in: the bench knows which ones it killed); ``flaky`` fails for some
inputs; ``slow`` only reads, slowly. The ledger is a SQLite file at ``$TORTURE_LEDGER``.
"""

from __future__ import annotations

import os
import sqlite3
import time

from plangate import RunContext, tool


def ledger() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ["TORTURE_LEDGER"], timeout=60, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS calls (plan TEXT, step INTEGER, tool TEXT)")
    conn.execute("CREATE TABLE IF NOT EXISTS effects (key TEXT, plan TEXT, step INTEGER)")
    conn.execute("CREATE TABLE IF NOT EXISTS sends (plan TEXT, step INTEGER)")
    conn.execute("CREATE TABLE IF NOT EXISTS returns (plan TEXT, step INTEGER, pid INTEGER)")
    return conn


def _call(conn: sqlite3.Connection, ctx: RunContext, name: str) -> None:
    conn.execute("INSERT INTO calls VALUES (?, ?, ?)", (ctx.plan_id, ctx.step_id, name))


@tool(effect="write", idempotent=True)
def idem(n: int, ctx: RunContext) -> int:
    """Apply an effect once per idempotency key."""
    conn = ledger()
    _call(conn, ctx, "idem")
    conn.execute("BEGIN IMMEDIATE")
    if conn.execute("SELECT 1 FROM effects WHERE key = ?", (ctx.idempotency_key,)).fetchone() is None:
        conn.execute("INSERT INTO effects VALUES (?, ?, ?)", (ctx.idempotency_key, ctx.plan_id, ctx.step_id))
    conn.execute("COMMIT")
    conn.close()
    time.sleep(0.005 * (n % 4))
    return n


@tool(effect="irreversible")
def once(n: int, ctx: RunContext) -> int:
    """Send something: not idempotent, every call sends again."""
    conn = ledger()
    _call(conn, ctx, "once")
    conn.execute("INSERT INTO sends VALUES (?, ?)", (ctx.plan_id, ctx.step_id))
    time.sleep(0.01)
    # Its worker knows the outcome from here on: only the worker's death may leave it unknown.
    conn.execute("INSERT INTO returns VALUES (?, ?, ?)", (ctx.plan_id, ctx.step_id, os.getpid()))
    conn.close()
    return n


@tool
def flaky(n: int) -> int:
    """Fail for every seventh input."""
    if n % 7 == 0:
        raise RuntimeError(f"flaky failed on {n}")
    return n


@tool
def slow(n: int) -> int:
    """Read slowly."""
    time.sleep(0.02 + 0.01 * (n % 5))
    return n
