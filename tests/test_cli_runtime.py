"""The governed path on the command line: submit, approve, reject, execute, resume, list, show, trace, audit."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import get_args

import pytest
from click.testing import CliRunner

from plangate.cli import main
from plangate.lifecycle import TRANSITIONS
from plangate.store import PlanStatus
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


def test_list_takes_every_status_list_prints(db: str) -> None:
    statuses = get_args(PlanStatus)
    assert set(TRANSITIONS) == set(statuses), "every status has its row in the lifecycle's table"
    for status in statuses:
        code, out, err = run("list", "--status", status)
        assert (code, out) == (0, f"no plans with status {status}\n"), err


def halted_plan() -> dict[str, str]:
    plan = submit("halt")
    assert run("approve", plan["id"], "--as", "dave", "--hash", plan["hash"])[0] == 0
    assert run("execute", plan["id"])[0] == 3
    return plan


def test_close_a_halted_plan_for_good(db: str) -> None:
    plan = halted_plan()
    plan_id = plan["id"]
    code, _, err = run("close", plan_id, "--as", "dave")
    assert code == 2 and "--reason" in err
    code, _, err = run("close", plan_id, "--as", "dave", "--reason", " ")
    assert code == 2 and err == "plangate: say why the plan is closed\n"
    code, _, err = run("close", plan_id, "--as", "alice", "--reason", "not needed")
    assert code == 4 and "alice requested plan" in err and "may not close it" in err
    code, out, _ = run("close", plan_id[:8], "--as", "dave", "--reason", "refunded 200 by hand")
    assert (code, out) == (0, f"plan {plan_id} v1 {plan['hash'][:12]}: closed\n  closed: refunded 200 by hand\n")
    for command in (
        ("resume", plan_id),
        ("execute", plan_id),
        ("compensate", plan_id, "--as", "dave", "--reason", "undo"),
        ("settle", plan_id, "2", "--not-done", "--as", "dave"),
        ("close", plan_id, "--as", "dave", "--reason", "again"),
        ("approve", plan_id, "--as", "carol", "--hash", plan["hash"]),
    ):
        code, _, err = run(*command)
        assert code == 4 and "was closed by dave at " in err and ": 'refunded 200 by hand'; it cannot" in err, command
        assert err.count("\n") == 1
    code, out, _ = run("list", "--status", "closed")
    assert code == 0 and plan_id[:8] in out and "closed" in out
    code, out, _ = run("trace", plan_id)
    assert out.splitlines()[-1].endswith("CLOSED: 'refunded 200 by hand'; it will not be resumed")
    assert run("audit", "verify")[1].startswith("audit log intact:")


def test_edit_makes_a_new_version_and_diff_says_what_changed(db: str, tmp_path: Path) -> None:
    plan = submit("refund")
    code, _, err = run("diff", plan["id"])
    assert code == 2 and "has no version before v1 to compare it with" in err
    body = json.loads((PLANS / "refund.json").read_text())
    body["task"] = "Refund invoice 42 quietly"
    body["steps"][2]["params"]["invoice_id"] = "43"
    body["steps"] = [
        *body["steps"][:3],
        {"id": 5, "tool": "get_invoice", "params": {"invoice_id": "43"}, "rationale": "Check."},
    ]
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(body))
    code, out, _ = run("edit", plan["id"], str(edited), "--as", "alice", "--json")
    record = json.loads(out)
    assert code == 0 and (record["version"], record["status"]) == (2, "pending_approval")
    assert record["policy"]["policy"] == "example-business", "without --policy, the plan's own policy holds"
    assert record["needs"] == ["a person"], "no email any more: the privacy officer is not needed"
    code, out, _ = run("diff", plan["id"][:8])
    assert code == 0
    lines = out.splitlines()
    assert lines[1:5] == [
        '  task: "Refund invoice 42 and tell the customer" -> "Refund invoice 42 quietly"',
        "  step 3 issue_refund: changed",
        '    params.invoice_id: "42" -> "43"',
        "  step 4 send_email: removed",
    ]
    removed, added = (
        lines[5 : lines.index("  step 5 get_invoice: added")],
        lines[lines.index("  step 5 get_invoice: added") :],
    )
    assert '    rollback: "cannot be undone: irreversible"' in removed and '    tool: "send_email"' in removed
    assert {'    params: {"invoice_id": "43"}', '    rationale: "Check."', '    tool: "get_invoice"'} <= set(added)
    assert out.splitlines()[0] == f"plan {plan['id']} v1 -> v2 (hash {plan['hash'][:12]} -> {record['hash'][:12]})"
    code, out, _ = run("diff", plan["id"], "--from", "2", "--to", "1", "--json")
    back = json.loads(out)
    assert code == 0 and [(s["id"], s["kind"]) for s in back["steps"]] == [(3, "changed"), (4, "added"), (5, "removed")]
    code, _, err = run("diff", plan["id"], "--to", "7")
    assert code == 2 and "has no version 7 (its versions are 1 to 2)" in err
    code, _, err = run("diff", plan["id"], "--from", "0")
    assert code == 2 and "0 is not in the range" in err

    body["steps"][0]["tool"] = "get_invoce"
    edited.write_text(json.dumps(body))
    code, out, _ = run("edit", plan["id"], str(edited), "--as", "alice")
    assert code == 1 and "v3" in out and ": rejected (1 violation)" in out and "unknown-tool" in out
    code, _, err = run("edit", plan["id"], str(edited), "--as", "alice")
    assert code == 4 and "does not change plan" in err


def test_show_tells_effects_reasons_and_where_each_step_stands(db: str, tmp_path: Path) -> None:
    plan = halted_plan()
    code, out, _ = run("show", plan["id"])
    lines = out.splitlines()
    assert code == 0 and lines[0] == f"plan {plan['id']} v1 (halted), requested by alice"
    assert lines[2] == "  policy 'example-business': needs approval by a person"
    assert "    - category 'refunds' always needs a person" in lines
    assert "     effect: read  rollback: none given" in lines
    assert "     effect: irreversible, external  rollback: none given" in lines
    status = [line for line in lines if line.startswith("     status: ")]
    assert status[0].startswith('     status: succeeded: {"currency": "EUR"') and status[0].endswith("...")
    assert all(len(line) <= len("     status: succeeded: ") + 80 for line in status)
    assert status[1].startswith("     status: failed: ") and status[2:] == ["     status: waiting"]

    from plangate import Catalogue, Policy
    from plangate.runtime import Runtime

    runtime = Runtime(Catalogue.from_module(TOOLS), Policy.load(POLICY), db=db)  # no tools module on record
    bare = runtime.submit(json.loads((PLANS / "refund.json").read_text()), "alice")
    code, out, _ = run("show", bare.id)
    assert code == 0 and out.count("effect: unknown") == 4 and "status:" not in out
    code, out, _ = run("show", bare.id, "--tools", TOOLS)
    assert "effect: unknown" not in out and "effect: write  rollback: void_refund(refund_id=${3.refund_id})" in out


def test_show_tells_the_order_a_plan_asked_for(db: str, tmp_path: Path) -> None:
    body = json.loads((PLANS / "refund.json").read_text())
    body["order"] = "dataflow"
    body["steps"][0]["on_failure"] = "continue"
    body["steps"][-1]["after"] = [1, 2]
    path = tmp_path / "ordered.json"
    path.write_text(json.dumps(body))
    code, out, _ = run("submit", str(path), "--tools", TOOLS, "--policy", POLICY, "--as", "alice", "--json")
    plan_id = json.loads(out)["id"]
    code, out, _ = run("show", plan_id)
    assert code == 0 and "  order: dataflow: a step starts once the steps it reads or names in 'after' are done;" in out
    lines = out.splitlines()
    first = next(line for line in lines if line.startswith("  1. "))
    last = next(line for line in lines if line.startswith(f"  {body['steps'][-1]['id']}. "))
    assert first.endswith("[optional: if it fails, its output is null]") and last.endswith(" after 1, 2")
