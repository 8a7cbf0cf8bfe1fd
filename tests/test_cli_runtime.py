"""The governed path on the command line: submit, approve, reject, execute, resume, list, show, trace, audit."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from plangate.cli import main
from tests.conftest import EXAMPLES

TOOLS = str(EXAMPLES / "business.py")
POLICY = str(EXAMPLES / "policy.yaml")
PLANS = EXAMPLES / "plans"


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path}/plangate.db"
    monkeypatch.setenv("PLANGATE_DB", url)
    return url


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def submit(name: str, user: str = "alice") -> dict[str, str]:
    code, out, _ = run(
        "submit", str(PLANS / f"{name}.json"), "--tools", TOOLS, "--policy", POLICY, "--as", user, "--json"
    )
    data: dict[str, str] = json.loads(out)
    assert code == (1 if data["status"] == "rejected" else 0)
    return data


def test_the_whole_path(db: str) -> None:
    plan = submit("refund")
    assert plan["status"] == "pending_approval" and plan["needs"] == ["a person", "privacy-officer"]
    code, out, _ = run("show", plan["id"][:8])
    assert code == 0 and "4. send_email" in out and "why: Tell the customer." in out

    code, _, err = run("approve", plan["id"], "--as", "alice", "--hash", plan["hash"])
    assert code == 4 and "may not approve it" in err
    code, _, err = run("execute", plan["id"])
    assert code == 4 and "not approved" in err
    code, out, _ = run("approve", plan["id"], "--as", "dave", "--hash", plan["hash"], "--comment", "ok")
    assert code == 0 and "needs approval by privacy-officer" in out
    code, out, _ = run("approve", plan["id"], "--as", "carol", "--hash", plan["hash"])
    assert code == 0 and out.strip().endswith(": approved")

    code, out, _ = run("execute", plan["id"], "--as", "ops")
    assert code == 0, out
    assert "[4/4] step 4 send_email: succeeded" in out and out.strip().endswith("0 skipped, 4 run now")
    code, out, _ = run("execute", plan["id"])
    assert code == 0 and "0 run now" in out

    code, out, _ = run("trace", plan["id"])
    assert code == 0 and "run SUCCEEDED (4 steps)" in out and "approved (approver)" in out
    code, out, _ = run("trace", plan["id"], "--json")
    events = json.loads(out)
    assert events[0]["kind"] == "plan.submitted" and events[-1]["kind"] == "run.succeeded"
    code, out, _ = run("audit", "verify")
    assert code == 0 and out.startswith("audit log intact:")
    code, out, _ = run("list", "--status", "succeeded")
    assert code == 0 and plan["id"][:8] in out


def test_rejections_halts_and_resume(db: str) -> None:
    rejected = submit("cleanup")
    assert rejected["status"] == "rejected" and len(rejected["violations"]) == 4

    halting = submit("halt")
    code, _, _ = run("approve", halting["id"], "--as", "dave", "--hash", halting["hash"])
    assert code == 0
    code, out, _ = run("execute", halting["id"])
    assert code == 3 and "halted at step 2 (issue_refund)" in out and "the step's rationale:" in out
    code, out, _ = run("resume", halting["id"])
    assert code == 3 and "step 1 get_invoice: already succeeded, kept" in out

    waiting = submit("refund")
    code, _, err = run("reject", waiting["id"], "--as", "dave")
    assert code == 2 and "--comment" in err
    code, out, _ = run("reject", waiting["id"], "--as", "dave", "--comment", "wrong customer")
    assert code == 0 and out.strip().endswith(": rejected")
    code, out, _ = run("list")
    assert code == 0 and len(out.splitlines()) == 3


def test_approve_needs_the_hash_when_not_at_a_terminal(db: str) -> None:
    plan = submit("refund")
    code, _, err = run("approve", plan["id"], "--as", "dave")
    assert code == 2 and f"give --hash with the hash you reviewed (current: {plan['hash']})" in err


def test_unknown_ids_and_bad_store_urls(db: str, tmp_path: Path) -> None:
    code, _, err = run("show", "nope")
    assert code == 2 and "no plan 'nope'" in err
    code, _, err = run("list", "--db", "mysql://x")
    assert code == 2 and "unknown store URL" in err


def test_a_tools_path_too_long_to_look_at_exits_2(db: str, tmp_path: Path) -> None:
    plan = submit("refund")
    code, out, err = run("execute", plan["id"], "--tools", str(tmp_path / ("t" * 300 + ".py")))
    assert (code, out) == (2, "") and err.startswith("plangate: cannot read tools file "), err


def test_audit_verify_names_the_tampered_event(db: str, tmp_path: Path) -> None:
    plan = submit("refund")
    run("approve", plan["id"], "--as", "dave", "--hash", plan["hash"])
    conn = sqlite3.connect(tmp_path / "plangate.db")
    conn.execute("UPDATE events SET actor = 'mallory' WHERE seq = 4")
    conn.commit()
    conn.close()
    code, out, _ = run("audit", "verify")
    assert code == 1 and out.startswith("audit log BROKEN at event 4: its content does not match its hash")
