"""The store's tables, as migrations: migration N brings the schema from version N-1 to N."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from plangate.names import canonical
from plangate.store._base import Store

Migration = Sequence[str | Callable[[Store], None]]
"""Statements, and functions of the store for data SQL cannot compute, in order."""

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
]
SCHEMA_V8 = [
    "ALTER TABLE users ADD COLUMN slack_id TEXT",
    "ALTER TABLE users ADD COLUMN disabled_at TEXT",
    "ALTER TABLE api_tokens ADD COLUMN id TEXT",
    "ALTER TABLE api_tokens ADD COLUMN expires_at TEXT",
    "ALTER TABLE api_tokens ADD COLUMN revoked_at TEXT",
    "CREATE INDEX events_plan_prev ON events (plan_prev)",  # a chain that goes on under another name is found
    "DELETE FROM settings WHERE key = 'secret'",  # the signing secret now lives outside the database
]
SCHEMA_V9 = [
    # An event's hash covers the digest of its data from here on, so its data can be purged and the
    # chain still verified. Events written before keep NULL and their hash over the data itself.
    "ALTER TABLE events ADD COLUMN data_hash TEXT",
    "ALTER TABLE plans ADD COLUMN purged_at TEXT",
]
SCHEMA_V10 = [
    # The plans a worker may claim, oldest first: a claim reads the first few of them in order,
    # rather than every approved plan sorted, however long the queue (3.7 ms a claim with a
    # thousand waiting, 0.1 ms through this index).
    "CREATE INDEX plans_runnable ON plans (created_at, id) WHERE kind = 'plan' AND status IN ('approved', 'running')",
]


def _fill_requesters(store: Store) -> None:
    """Each plan's requester in canonical form (:mod:`plangate.names`), which listings filter by."""
    for (name,) in store.query("SELECT DISTINCT requested_by FROM plans"):
        store.command("UPDATE plans SET requester = ? WHERE requested_by = ?", (canonical(name), name))


SCHEMA_V11: Migration = [
    # Listings, newest or oldest first, read the first plans of an index in order and stop at
    # the page's end, however many plans there are: by status, by requester, or all of them.
    "ALTER TABLE plans ADD COLUMN requester TEXT",
    _fill_requesters,
    "CREATE INDEX plans_requester ON plans (requester, created_at, id)",
    "CREATE INDEX plans_created ON plans (created_at, id)",
    "DROP INDEX plans_status",
    "CREATE INDEX plans_status ON plans (status, created_at, id)",
]
MIGRATIONS: list[Migration] = [
    SCHEMA_V1,
    SCHEMA_V2,
    SCHEMA_V3,
    SCHEMA_V4,
    SCHEMA_V5,
    SCHEMA_V6,
    SCHEMA_V7,
    SCHEMA_V8,
    SCHEMA_V9,
    SCHEMA_V10,
    SCHEMA_V11,
]
"""Schema migrations, in order: migration N brings the schema from version N-1 to N."""
