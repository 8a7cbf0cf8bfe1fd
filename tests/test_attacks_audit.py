"""Rows the runtime acts on, changed in the database by someone without the audit key."""

from __future__ import annotations

import hashlib
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue, Policy, tool
from plangate.errors import GovernanceError
from plangate.ledger import verify
from plangate.runtime import Runtime
from tests.helpers import FixedClock, plan
from tests.test_attacks_escapes import CALLS, hold, release


@tool(effect="write")
def boom(cmd: str) -> str:
    """Fail."""
    raise RuntimeError("it failed")


RULES = Policy.from_data({"version": 1, "name": "rules", "approval": {"human": ["ops"]}})
CAT = Catalogue([hold, release, boom])
MODULE = "tests.test_attacks_audit"


def tamper(db: Path, query: str, params: tuple[Any, ...] = ()) -> None:
    with closing(sqlite3.connect(db)) as conn, conn:
        assert conn.execute(query, params).rowcount >= 1


def halted(tmp_path: Path) -> tuple[Runtime, str, Path]:
    CALLS.clear()
    db = tmp_path / "audit.db"
    rt = Runtime(CAT, RULES, db=f"sqlite:///{db}", clock=FixedClock(), tools=MODULE)
    record = rt.submit(
        plan(
            {"id": 1, "tool": "hold", "params": {"account": "acct-bob"}},
            {"id": 2, "tool": "boom", "params": {"cmd": "x"}},
        ),
        "ann",
    )
    rt.approve(record.id, "ben", record.hash)
    assert not rt.execute(record.id).ok
    assert CALLS == ["hold:acct-bob"]
    return rt, record.id, db


def test_the_parameters_a_step_was_called_with_are_held_against_its_events(tmp_path: Path) -> None:
    rt, plan_id, db = halted(tmp_path)
    tamper(db, "UPDATE steps SET params = ? WHERE plan_id = ? AND step_id = 1", ('{"account":"acct-eve"}', plan_id))
    report = verify(rt.store)
    assert not report.ok and any("params" in t for t in report.tables), report
    with pytest.raises(GovernanceError):
        rt.compensate(plan_id, actor="ben", reason="undo it")
    assert "release:acct-eve" not in CALLS


def test_a_requester_made_to_look_like_another_may_not_approve(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    rt = Runtime(CAT, RULES, db=f"sqlite:///{db}", clock=FixedClock(), tools=MODULE)
    record = rt.submit(plan({"id": 1, "tool": "hold", "params": {"account": "acct-bob"}}), "ann")
    tamper(db, "UPDATE plans SET requested_by = 'zed' WHERE id = ?", (record.id,))
    with pytest.raises(GovernanceError):
        rt.approve(record.id, "ann", record.hash)
    assert rt.store.get_plan(record.id).status == "pending_approval"  # type: ignore[union-attr]


def test_a_plan_text_changed_with_its_hash_is_not_approved(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    rt = Runtime(CAT, RULES, db=f"sqlite:///{db}", clock=FixedClock(), tools=MODULE)
    record = rt.submit(plan({"id": 1, "tool": "hold", "params": {"account": "acct-bob"}}), "ann")
    version = rt.store.get_version(record.id, 1)
    assert version is not None
    body = version.body.replace("acct-bob", "acct-eve")
    digest = hashlib.sha256(body.encode()).hexdigest()
    tamper(db, "UPDATE plan_versions SET body = ?, hash = ? WHERE plan_id = ?", (body, digest, record.id))
    tamper(db, "UPDATE plans SET hash = ? WHERE id = ?", (digest, record.id))
    with pytest.raises(GovernanceError):
        rt.approve(record.id, "ben", digest)
    assert rt.store.approvals(record.id) == []


@pytest.mark.parametrize("column", ["data", "kind", "actor", "plan_prev", "data_hash"])
def test_an_event_column_stored_as_bytes_is_named_not_crashed_on(tmp_path: Path, column: str) -> None:
    rt, plan_id, db = halted(tmp_path)
    tamper(db, f"UPDATE events SET {column} = CAST({column} AS BLOB) WHERE seq = 3")
    report = rt.store.verify_audit()
    assert not report.ok and report.bad_seq == 3, report
    with pytest.raises(GovernanceError):
        rt.compensate(plan_id, actor="ben", reason="undo it")
    assert "release:acct-bob" not in CALLS


def test_a_seal_stored_as_bytes_is_named_not_crashed_on(tmp_path: Path) -> None:
    rt, plan_id, db = halted(tmp_path)
    tamper(db, "UPDATE plans SET tail = CAST(tail AS BLOB) WHERE id = ?", (plan_id,))
    report = verify(rt.store)
    assert not report.ok and any("seal" in t for t in report.tables), report
    with pytest.raises(GovernanceError):
        rt.compensate(plan_id, actor="ben", reason="undo it")
