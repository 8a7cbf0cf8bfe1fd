"""The example business: customers, invoices, refunds and an outbox, in one SQLite file.

Its tools are what ``make demo`` plans over. Emails are written to the ``outbox`` table
instead of being sent, and every effect is counted in ``effects``, so a test can tell
exactly what happened (and that nothing happened twice).

The database lives at ``$PLANGATE_EXAMPLE_DB`` (default ``.plangate/business.db``) and
is created and seeded on first use.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from typing_extensions import TypedDict

from plangate import RunContext, tool

SCHEMA = """
CREATE TABLE IF NOT EXISTS customers (id TEXT PRIMARY KEY, name TEXT NOT NULL, email TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS invoices (
    id TEXT PRIMARY KEY, customer_id TEXT NOT NULL REFERENCES customers(id),
    total REAL NOT NULL, currency TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'paid');
CREATE TABLE IF NOT EXISTS refunds (
    id TEXT PRIMARY KEY, invoice_id TEXT NOT NULL, amount REAL NOT NULL,
    idempotency_key TEXT UNIQUE, voided INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS outbox (id INTEGER PRIMARY KEY, recipient TEXT, subject TEXT, body TEXT);
CREATE TABLE IF NOT EXISTS effects (kind TEXT PRIMARY KEY, count INTEGER NOT NULL);
"""
SEED_CUSTOMERS = [("c-7", "Ada Lovelace", "ada@example.com"), ("c-9", "Alan Turing", "alan@example.com")]
SEED_INVOICES = [("42", "c-7", 120.0, "EUR"), ("43", "c-9", 75.5, "EUR"), ("44", "c-7", 980.0, "EUR")]


class Invoice(BaseModel):
    id: str
    customer_id: str
    total: float
    currency: str
    status: str


class Customer(TypedDict):
    id: str
    name: str
    email: str


class Refund(BaseModel):
    refund_id: str
    invoice_id: str
    amount: float
    voided: bool = False


def db_path() -> Path:
    return Path(os.environ.get("PLANGATE_EXAMPLE_DB", ".plangate/business.db"))


@contextmanager
def connect() -> Iterator[sqlite3.Connection]:
    path = db_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=30)
    conn.row_factory = sqlite3.Row
    try:
        conn.executescript(SCHEMA)
        conn.executemany("INSERT OR IGNORE INTO customers VALUES (?, ?, ?)", SEED_CUSTOMERS)
        conn.executemany(
            "INSERT OR IGNORE INTO invoices (id, customer_id, total, currency) VALUES (?, ?, ?, ?)", SEED_INVOICES
        )
        yield conn
        conn.commit()
    finally:
        conn.close()


def _count(conn: sqlite3.Connection, kind: str) -> None:
    conn.execute("INSERT INTO effects VALUES (?, 1) ON CONFLICT(kind) DO UPDATE SET count = count + 1", (kind,))


def effect_counts() -> dict[str, int]:
    """How many times each kind of effect was applied (for tests and the demo)."""
    with connect() as conn:
        return {row["kind"]: row["count"] for row in conn.execute("SELECT kind, count FROM effects")}


@tool(scopes=["invoices:read"], resource="invoice:{invoice_id}")
def get_invoice(invoice_id: str) -> Invoice:
    """Fetch one invoice.

    Args:
        invoice_id: The invoice number, e.g. "42".
    """
    with connect() as conn:
        row = conn.execute("SELECT * FROM invoices WHERE id = ?", (invoice_id,)).fetchone()
    if row is None:
        raise LookupError(f"no invoice {invoice_id!r}")
    return Invoice(**dict(row))


@tool(scopes=["customers:read"], tags=["pii"])
def lookup_customer(customer_id: str) -> Customer:
    """Fetch a customer's name and email address (personal data).

    Args:
        customer_id: The customer's id, e.g. "c-7".
    """
    with connect() as conn:
        row = conn.execute("SELECT * FROM customers WHERE id = ?", (customer_id,)).fetchone()
    if row is None:
        raise LookupError(f"no customer {customer_id!r}")
    return Customer(id=row["id"], name=row["name"], email=row["email"])


@tool(
    effect="write", scopes=["refunds:write"], resource="invoice:{invoice_id}", idempotent=True, compensate="void_refund"
)
def issue_refund(invoice_id: str, amount: float, ctx: RunContext) -> Refund:
    """Refund part or all of a paid invoice. Repeating it with the same idempotency key is safe.

    Args:
        invoice_id: The invoice to refund.
        amount: How much to refund, at most the invoice total.
    """
    with connect() as conn:
        done = conn.execute("SELECT * FROM refunds WHERE idempotency_key = ?", (ctx.idempotency_key,)).fetchone()
        if done is not None:
            return Refund(refund_id=done["id"], invoice_id=done["invoice_id"], amount=done["amount"])
        invoice = conn.execute("SELECT total FROM invoices WHERE id = ?", (invoice_id,)).fetchone()
        if invoice is None:
            raise LookupError(f"no invoice {invoice_id!r}")
        if not 0 < amount <= invoice["total"]:
            raise ValueError(f"refund of {amount} is not between 0 and the invoice total {invoice['total']}")
        refund_id = f"r-{invoice_id}-{ctx.step_id}-{ctx.plan_id[:8]}"
        conn.execute(
            "INSERT INTO refunds (id, invoice_id, amount, idempotency_key) VALUES (?, ?, ?, ?)",
            (refund_id, invoice_id, amount, ctx.idempotency_key),
        )
        _count(conn, "refund")
    return Refund(refund_id=refund_id, invoice_id=invoice_id, amount=amount)


@tool(effect="write", scopes=["refunds:write"], idempotent=True)
def void_refund(refund_id: str) -> Refund:
    """Cancel a refund (the compensation for issue_refund). Voiding twice changes nothing.

    Args:
        refund_id: The refund to cancel.
    """
    with connect() as conn:
        row = conn.execute("SELECT * FROM refunds WHERE id = ?", (refund_id,)).fetchone()
        if row is None:
            raise LookupError(f"no refund {refund_id!r}")
        if not row["voided"]:
            conn.execute("UPDATE refunds SET voided = 1 WHERE id = ?", (refund_id,))
            _count(conn, "void")
    return Refund(refund_id=refund_id, invoice_id=row["invoice_id"], amount=row["amount"], voided=True)


@tool(effect="irreversible", external=True, scopes=["email:send"], resource="outbox")
def send_email(to: str, subject: str, body: str) -> str:
    """Send an email to a customer (here: write it to the outbox). Cannot be unsent.

    Args:
        to: Recipient address.
        subject: Subject line.
        body: Plain-text body.
    """
    with connect() as conn:
        cursor = conn.execute("INSERT INTO outbox (recipient, subject, body) VALUES (?, ?, ?)", (to, subject, body))
        _count(conn, "email")
    return f"message-{cursor.lastrowid}"


@tool(effect="write", scopes=["db:admin"], resource="db:production")
def run_sql(query: str) -> list[dict[str, Any]]:
    """Run one SQL statement against the production database and return the rows.

    Args:
        query: The SQL statement.
    """
    with connect() as conn:
        rows = [dict(row) for row in conn.execute(query)]
        _count(conn, "sql")
    return rows
