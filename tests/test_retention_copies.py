"""Retention: once a plan's payloads are purged, no copy of them stays anywhere in the database."""

from __future__ import annotations

from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from plangate import Catalogue, Policy, Runtime
from plangate._clock import SystemClock
from plangate.cli import main
from plangate.store import CallRow, open_store
from tests.conftest import load_plan
from tests.helpers import FixedClock

OLD = datetime(2020, 1, 1, 9, 0, tzinfo=UTC)
MARKER = "zq-marker-7f3a"
"""A value only the purged plan's payloads hold (never its task, which a purge keeps as the plan's title)."""


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout + result.stderr


def survivors(url: str, *values: str) -> list[str]:
    """Each table and row in which one of ``values`` is still written, however the row stores it."""
    found: list[str] = []
    with closing(open_store(url)) as store:
        tables = [row[0] for row in store.query("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            for row in store.query(f"SELECT * FROM {table}"):
                found += [f"{table}: {row}" for value in values if value in repr(row)]
    return found


def marked_plan() -> dict[str, Any]:
    """The refund plan, its email telling the customer a reference only its payloads hold."""
    plan = load_plan("refund")
    plan["steps"][3]["params"]["subject"] = f"Refund {MARKER}"
    return plan


def finished(url: str, catalogue: Catalogue, policy: Policy) -> str:
    """A plan run to success long ago, whose outputs name the customer."""
    with closing(Runtime(catalogue, policy, db=url, clock=FixedClock(OLD))) as rt:
        record = rt.submit(marked_plan(), "alice")
        rt.approve(record.id, "ben", record.hash)
        rt.approve(record.id, "carol", record.hash)
        assert rt.execute(record.id).status == "succeeded"
        return record.id


def test_a_template_made_from_a_purged_plan_goes_with_its_payloads(
    tmp_path: Path, catalogue: Catalogue, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path}/plangate.db"
    plan_id = finished(url, catalogue, policy)
    with monkeypatch.context() as patch:  # the template is added long ago too, so the plan is old enough to purge
        patch.setattr(SystemClock, "now", lambda self: OLD + timedelta(hours=1))
        code, out = cli("library", "add", plan_id, "--name", "refund-and-tell", "--as", "dave", "--db", url)
    assert code == 0, out
    assert survivors(url, MARKER, "ada@example.com")

    code, out = cli("retention", "purge", "--older-than", "365", "--dry-run", "--db", url)
    assert code == 0 and "would purge 1 plan(s)" in out and "would remove template 'refund-and-tell'" in out, out
    code, out = cli("retention", "purge", "--older-than", "365", "--yes", "--as", "gina", "--db", url)
    assert code == 0 and "purged 1 plan(s)" in out and "removed template 'refund-and-tell'" in out, out
    assert survivors(url, MARKER, "ada@example.com", "Ada Lovelace") == []
    with closing(open_store(url)) as store:
        (event,) = [e for e in store.events() if e.kind == "retention.purged"]
        assert event.actor == "gina" and event.data["templates"] == ["refund-and-tell"]
    code, out = cli("library", "list", "--db", url)
    assert code == 0 and "the library is empty" in out
    assert cli("audit", "verify", "--db", url)[0] == 0


def test_the_cost_ledger_keeps_no_step_payload_of_a_purged_plan(
    tmp_path: Path, catalogue: Catalogue, policy: Policy
) -> None:
    """An extraction step's model call is in the ledger under its instructions (a step parameter), and may fail."""
    url = f"sqlite:///{tmp_path}/plangate.db"
    plan_id = finished(url, catalogue, policy)
    with closing(open_store(url)) as store, store.transaction():
        for number, error in enumerate((None, f"model: cannot reach the server: {MARKER}")):
            store.record_call(
                CallRow(
                    id=f"call-{number}",
                    at="2020-01-01T09:00:01.000000Z",
                    plan_id=plan_id,
                    task=f"step 2: extract the reference {MARKER}",
                    model="scripted:test",
                    purpose="extract",
                    expected_steps=None,
                    budget=100,
                    effort=None,
                    ok=error is None,
                    error=error,
                )
            )
    code, out = cli("retention", "purge", "--older-than", "365", "--yes", "--db", url)
    assert code == 0 and "purged 1 plan(s)" in out, out
    assert survivors(url, MARKER) == []
    with closing(open_store(url)) as store:
        calls = store.calls(plan_id=plan_id)
        assert [(c.ok, c.input_tokens, c.error) for c in calls] == [(True, 0, None), (False, 0, "(purged)")]
