"""Tools for the crash tests: they count every call and every effect in a ledger of their own.

A tool pauses forever (until the test kills the process) when the file ``block-N`` exists
in ``$CRASH_DIR``, after applying its effect and after touching ``reached-N``: the worst
moment to die, with the effect done and its outcome not yet recorded.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from plangate import RunContext, tool


def ledger() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ["CRASH_LEDGER"], timeout=30, isolation_level=None)
    conn.execute("CREATE TABLE IF NOT EXISTS calls (step INTEGER NOT NULL, key TEXT NOT NULL)")
    conn.execute("CREATE TABLE IF NOT EXISTS effects (key TEXT PRIMARY KEY, step INTEGER NOT NULL)")
    conn.execute("CREATE TABLE IF NOT EXISTS sends (step INTEGER NOT NULL)")
    return conn


def _pause_if_asked(n: int) -> None:
    folder = Path(os.environ["CRASH_DIR"])
    if (folder / f"block-{n}").exists():
        (folder / f"reached-{n}").touch()
        while True:
            time.sleep(0.05)


@tool(effect="write", idempotent=True)
def apply_once(n: int, ctx: RunContext) -> int:
    """An idempotent effect: applied once per idempotency key, however often it is called."""
    conn = ledger()
    conn.execute("INSERT INTO calls VALUES (?, ?)", (n, ctx.idempotency_key))
    conn.execute("INSERT OR IGNORE INTO effects VALUES (?, ?)", (ctx.idempotency_key, n))
    conn.close()
    _pause_if_asked(n)
    return n


@tool(effect="irreversible")
def send(n: int, ctx: RunContext) -> int:
    """A non-idempotent effect: every call sends again."""
    conn = ledger()
    conn.execute("INSERT INTO calls VALUES (?, ?)", (n, ctx.idempotency_key))
    conn.execute("INSERT INTO sends VALUES (?)", (n,))
    conn.close()
    _pause_if_asked(n)
    return n
