"""Where plangate keeps plans, approvals, runs and the audit log.

``open_store(url)`` picks the backend from a URL: ``sqlite:///PATH`` (the default is
``./.plangate/plangate.db``, or ``$PLANGATE_DB``); ``postgresql://...`` comes with the
PostgreSQL backend.
"""

from __future__ import annotations

import os
from urllib.parse import parse_qs, urlsplit

from plangate._extras import need
from plangate.errors import StoreError
from plangate.store._base import Store
from plangate.store._records import (
    DONE,
    EVERY_PLAN,
    MAX_LISTED,
    ApprovalRow,
    CallRow,
    CheckRecord,
    Event,
    PlanQuery,
    PlanRow,
    PlanStatus,
    ReadScope,
    StepRow,
    StepStatus,
    TemplateRow,
    VersionRow,
)
from plangate.store.sqlite import SQLiteStore

DEFAULT_DB = "sqlite:///.plangate/plangate.db"

__all__ = [
    "DEFAULT_DB",
    "DONE",
    "EVERY_PLAN",
    "MAX_LISTED",
    "ApprovalRow",
    "CallRow",
    "CheckRecord",
    "Event",
    "PlanQuery",
    "PlanRow",
    "PlanStatus",
    "ReadScope",
    "SQLiteStore",
    "StepRow",
    "StepStatus",
    "Store",
    "TemplateRow",
    "VersionRow",
    "default_url",
    "open_store",
]


def default_url() -> str:
    return os.environ.get("PLANGATE_DB") or DEFAULT_DB


def open_store(url: str | None = None) -> Store:
    """Open (creating and migrating as needed) the store at ``url``."""
    url = url or default_url()
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        path = parts.path[1:] if parts.netloc == "" and parts.path.startswith("/") else parts.path
        if not path:
            raise StoreError(f"no file in {url!r}: write sqlite:///relative/path.db or sqlite:////absolute/path.db")
        options = parse_qs(parts.query)
        synchronous = options.get("synchronous", ["normal"])[0].lower()
        if synchronous not in ("normal", "full"):
            raise StoreError(f"synchronous must be normal or full, not {synchronous!r}")
        return SQLiteStore(path, synchronous="full" if synchronous == "full" else "normal")
    if parts.scheme in ("postgresql", "postgres"):
        need("postgres", "a PostgreSQL store")
        from plangate.store.postgres import PostgresStore

        return PostgresStore(url)
    raise StoreError(f"unknown store URL {url!r}: use sqlite:///PATH or postgresql://USER@HOST:PORT/DB")
