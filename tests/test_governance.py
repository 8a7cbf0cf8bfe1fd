"""The governance export: every artefact from the store alone, under a manifest that `governance verify` checks."""

from __future__ import annotations

import csv
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from plangate import Catalogue, Policy
from plangate.accounts import Accounts
from plangate.cli import main
from plangate.governance import APPROVAL_COLUMNS, export
from plangate.register import Register
from plangate.runtime import Runtime
from tests.conftest import EXAMPLES
from tests.helpers import FixedClock, died_during, plan

REFUND_THEN_FAIL = plan(
    {"id": 1, "tool": "get_invoice", "params": {"invoice_id": "42"}},
    {"id": 2, "tool": "issue_refund", "params": {"invoice_id": "42", "amount": 20.0}},
    {"id": 3, "tool": "issue_refund", "params": {"invoice_id": "43", "amount": 5000.0}},
    category="refunds",
    task="refund then fail",
)
EMAIL = plan(
    {"id": 1, "tool": "send_email", "params": {"to": "ada@example.com", "subject": "s", "body": "b"}},
    category="refunds",
    task="tell the customer",
)
REFUND = plan({"id": 1, "tool": "issue_refund", "params": {"invoice_id": "42", "amount": 10.0}}, category="refunds")
LOOKUP = plan({"id": 1, "tool": "get_invoice", "params": {"invoice_id": "42"}}, category="lookups", task="look")
OPEN = plan(  # another invoice: the example's refund ids repeat across plans whose ids start alike
    {"id": 1, "tool": "get_invoice", "params": {"invoice_id": "43"}},
    {"id": 2, "tool": "issue_refund", "params": {"invoice_id": "43", "amount": 20.0}},
    {"id": 3, "tool": "issue_refund", "params": {"invoice_id": "42", "amount": 5000.0}},
    category="refunds",
    task="refund then fail, left open",
)
LATER = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)


def run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def halted(rt: Runtime, data: dict[str, Any]) -> str:
    record = rt.submit(data, "bob")
    rt.approve(record.id, "dave", record.hash)
    assert rt.execute(record.id).status == "halted"
    return record.id


@pytest.fixture
def store(any_db: str, catalogue: Catalogue, policy: Policy) -> tuple[str, dict[str, str]]:
    """A store with a plan of every kind: succeeded, halted after an effect (then compensated; settled and
    closed; left open), rejected, edited; and register entries. Plans from ``LATER`` on: rejected, edited.
    Once on SQLite, once on PostgreSQL."""
    db = any_db
    clock = FixedClock()
    rt = Runtime(catalogue, policy, db=db, clock=clock, tools=str(EXAMPLES / "business.py"))
    ids = {"lookup": rt.submit(LOOKUP, "alice").id}
    assert rt.execute(ids["lookup"]).ok
    ids["compensated"] = halted(rt, REFUND_THEN_FAIL)
    assert rt.compensate(ids["compensated"], actor="dave", reason="customer cancelled").status == "compensated"
    ids["open"] = halted(rt, OPEN)
    email = rt.submit(EMAIL, "bob")
    rt.approve(email.id, "dave", email.hash)
    died_during(rt.store, email.id, 1)
    assert rt.execute(email.id).status == "halted"
    rt.settle(email.id, 1, done=True, output="sent", actor="dave", note="in the outbox")
    rt.close_plan(email.id, actor="dave", reason="the customer has the email")
    ids["settled"] = email.id
    clock.start = LATER
    ids["rejected"] = rt.submit(REFUND, "alice").id
    rt.reject(ids["rejected"], "dave", "wrong invoice")
    edited = rt.submit(REFUND, "alice")
    changed = dict(REFUND, steps=[{**REFUND["steps"][0], "params": {"invoice_id": "42", "amount": 12.5}}])
    new = rt.edit(edited.id, changed, "carol")
    rt.approve(edited.id, "dave", new.hash, comment="checked the amount")
    assert rt.execute(edited.id).ok
    ids["edited"] = edited.id
    Accounts(rt.store).add("gina", "governance")
    Register(rt.store, clock).set("lookups", True, by="gina", reason="read-only, reviewed")
    rt.close()
    return db, ids


def exported(tmp_path: Path, db: str, *more: str) -> Path:
    out = tmp_path / "export"
    done = run("governance", "export", "--out", str(out), "--db", db, *more)
    assert done.exit_code == 0, done.output
    return out


def test_export_then_verify_passes_with_and_without_the_store(
    tmp_path: Path, store: tuple[str, dict[str, str]]
) -> None:
    db, ids = store
    out = tmp_path / "export"
    done = run("governance", "export", "--out", str(out), "--db", db)
    assert done.exit_code == 0, done.output
    assert f"[1/6] plan {ids['lookup']}" in done.output and "exported 6 plans (3 incidents)" in done.output
    names = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    for name in ("plan-schema.json", "plan-schema.md", "policy.md", "policy-history.json", "approvals.csv"):
        assert name in names
    for name in ("approvals.jsonl", "register.md", "register.json", "incidents.md", "incident-runbook.md"):
        assert name in names
    assert {f"traces/{i}.jsonl" for i in ids.values()} | {f"traces/{i}.txt" for i in ids.values()} <= names
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["files"]) == names - {"manifest.json"}
    assert manifest["since"] is None and manifest["plans"] == 6 and manifest["plangate_version"]
    head = run("audit", "head", "--db", db, "--json")
    assert manifest["audit_head"] == json.loads(head.output)
    ok = run("governance", "verify", str(out))
    assert ok.exit_code == 0 and ok.output.startswith(f"ok: {len(names) - 1} files match"), ok.output
    assert run("governance", "verify", str(out), "--db", db).exit_code == 0
    assert (out / "incident-runbook.md").read_text() == (EXAMPLES.parent / "docs" / "incidents.md").read_text()


def test_a_changed_byte_an_extra_and_a_missing_file_are_named(
    tmp_path: Path, store: tuple[str, dict[str, str]]
) -> None:
    db, ids = store
    out = exported(tmp_path, db)
    trace = out / "traces" / f"{ids['open']}.jsonl"
    original = trace.read_bytes()
    trace.write_bytes(original[:10] + bytes([original[10] ^ 1]) + original[11:])
    done = run("governance", "verify", str(out))
    assert done.exit_code == 1 and f"traces/{ids['open']}.jsonl: changed (sha256" in done.output
    trace.write_bytes(original)
    (out / "traces" / "extra.txt").write_text("slipped in")
    done = run("governance", "verify", str(out))
    assert done.exit_code == 1 and "traces/extra.txt: extra file" in done.output
    (out / "traces" / "extra.txt").unlink()
    (out / "approvals.csv").unlink()
    done = run("governance", "verify", str(out))
    assert done.exit_code == 1 and "approvals.csv: missing" in done.output
    assert run("governance", "verify", str(tmp_path / "nowhere")).exit_code == 2
    assert run("governance", "verify", str(tmp_path)).exit_code == 2, "a folder with no manifest"


def test_a_manifest_rewritten_to_match_a_changed_file_is_caught_by_its_kept_digest(
    tmp_path: Path, store: tuple[str, dict[str, str]]
) -> None:
    """Whoever edits a file and its line in the manifest fools the manifest, not the digest kept elsewhere."""
    import hashlib
    import re

    db, ids = store
    out = tmp_path / "export"
    done = run("governance", "export", "--out", str(out), "--db", db)
    kept = re.search(r"manifest sha256 ([0-9a-f]{64})", done.output)
    assert kept, done.output
    assert run("governance", "verify", str(out), "--manifest-sha256", kept[1]).exit_code == 0
    trace = out / "traces" / f"{ids['open']}.txt"
    trace.write_text(trace.read_text().replace("halted", "finished"))
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["files"][f"traces/{ids['open']}.txt"] = hashlib.sha256(trace.read_bytes()).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    assert run("governance", "verify", str(out)).exit_code == 0, "the manifest alone vouches for the edit"
    done = run("governance", "verify", str(out), "--manifest-sha256", kept[1])
    assert done.exit_code == 1 and "manifest.json: its SHA-256 is" in done.output and kept[1] in done.output


def test_the_audit_head_must_be_in_the_store_given(
    tmp_path: Path, store: tuple[str, dict[str, str]], catalogue: Catalogue, policy: Policy
) -> None:
    db, _ = store
    out = exported(tmp_path, db)
    other = f"sqlite:///{tmp_path}/other.db"
    Runtime(catalogue, policy, db=other, clock=FixedClock()).submit(LOOKUP, "alice")
    done = run("governance", "verify", str(out), "--db", other)
    assert done.exit_code == 1 and "manifest.json: audit head" in done.output


def test_the_approval_log_has_its_columns_decisions_and_edits(
    tmp_path: Path, store: tuple[str, dict[str, str]]
) -> None:
    db, ids = store
    out = exported(tmp_path, db)
    with (out / "approvals.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == APPROVAL_COLUMNS
    assert APPROVAL_COLUMNS[:3] == ("plan_id", "category", "version")
    rejected = next(r for r in rows if r["plan_id"] == ids["rejected"])
    assert (rejected["decision"], rejected["actor"], rejected["role"], rejected["comment"]) == (
        "rejected",
        "dave",
        "approver",
        "wrong invoice",
    )
    edited = next(r for r in rows if r["plan_id"] == ids["edited"])
    assert (edited["version"], edited["edited_by"], edited["comment"]) == ("2", "carol", "checked the amount")
    assert "params.amount: 10.0 -> 12.5" in edited["edits"]
    auto = next(r for r in rows if r["plan_id"] == ids["lookup"])
    assert (auto["kind"], auto["decision"]) == ("auto", "approved")
    lines = [json.loads(line) for line in (out / "approvals.jsonl").read_text().splitlines()]
    assert len(lines) == len(rows) and {d["plan_id"] for d in lines} == {r["plan_id"] for r in rows}


def test_incidents_say_what_ran_what_was_done_and_what_is_open(
    tmp_path: Path, store: tuple[str, dict[str, str]]
) -> None:
    db, ids = store
    text = (exported(tmp_path, db) / "incidents.md").read_text()
    assert "3 incident(s), 1 still open." in text
    sections = {s.split(":", 1)[0].removeprefix("Plan "): s for s in text.split("\n## ")[1:]}
    assert set(sections) == {ids["compensated"], ids["open"], ids["settled"]}, "no incident without an effect"
    compensated = sections[ids["compensated"]]
    assert "step 2 issue_refund (write): succeeded" in compensated
    assert "dave: ROLLBACK started: 'customer cancelled'" in compensated and "step 2 UNDONE" in compensated
    assert "nothing: every effect was undone" in compensated
    settled = sections[ids["settled"]]
    assert "step 1 send_email (irreversible): outcome UNKNOWN" in settled
    assert "dave: step 1 (send_email) SETTLED by a person as done" in settled
    assert "nothing: closed by dave" in settled
    still = sections[ids["open"]]
    assert "step 2 issue_refund ran and is not undone" in still
    assert "plan is halted: a person decides: compensate, correct and resume, or close" in still


def test_since_keeps_only_the_later_plans(tmp_path: Path, store: tuple[str, dict[str, str]]) -> None:
    db, ids = store
    out = exported(tmp_path, db, "--since", "2026-12-01")
    traces = {p.stem for p in (out / "traces").glob("*.jsonl")}
    assert traces == {ids["rejected"], ids["edited"]}
    with (out / "approvals.csv").open() as handle:
        assert {r["plan_id"] for r in csv.DictReader(handle)} == {ids["rejected"], ids["edited"]}
    assert "0 incident(s)" in (out / "incidents.md").read_text()
    assert json.loads((out / "manifest.json").read_text())["since"] == "2026-12-01T00:00:00.000000Z"
    assert run("governance", "verify", str(out)).exit_code == 0
    assert run("governance", "export", "--out", str(tmp_path / "x"), "--db", db, "--since", "soon").exit_code == 2


def test_a_folder_that_is_not_empty_is_refused_unless_forced(tmp_path: Path, store: tuple[str, dict[str, str]]) -> None:
    db, _ = store
    out = exported(tmp_path, db)
    again = run("governance", "export", "--out", str(out), "--db", db)
    assert again.exit_code == 2 and "is not empty" in again.output
    assert run("governance", "export", "--out", str(out), "--db", db, "--force").exit_code == 0
    assert run("governance", "verify", str(out)).exit_code == 0
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert run("governance", "export", "--out", str(mine), "--db", db, "--force").exit_code == 2
    assert (mine / "notes.txt").read_text() == "keep"


def test_the_policy_document_gives_each_rule_its_justification_and_the_history(
    tmp_path: Path, store: tuple[str, dict[str, str]], policy: Policy
) -> None:
    db, ids = store
    out = exported(tmp_path, db)
    text = (out / "policy.md").read_text()
    assert "- **no-external-send-after-pii**" in text and "compliance: GDPR Art. 5(1)(f), Art. 32" in text
    assert "justification: A person looks at every refund" in text
    assert f"`{policy.hash[:16]}`" in text
    history = json.loads((out / "policy-history.json").read_text())
    assert [(h["hash"], h["name"], h["revision"]) for h in history] == [(policy.hash, policy.name, policy.revision)]
    assert set(history[0]["plans"]) == set(ids.values())
    assert json.loads((out / f"policies/{policy.hash}.json").read_text())["name"] == policy.name


def test_justification_and_compliance_change_no_decision(catalogue: Catalogue, policy: Policy) -> None:
    bare = policy.model_dump(mode="json")
    for rule in (*bare["require"], *bare["sequences"], bare["approval"], bare["categories"]["refunds"]):
        rule.pop("justification", None)
        rule.pop("compliance", None)
    plain = Policy.from_data(bare)
    assert "justification" not in plain.canonical_json(), "absent, they are not hashed: older hashes stand"
    from plangate.plan import Plan

    for data in (REFUND_THEN_FAIL, EMAIL, LOOKUP):
        ours, theirs = (p.evaluate(Plan.parse(data), catalogue, user="bob") for p in (policy, plain))
        assert (ours.violations, ours.approval, ours.reasons) == (theirs.violations, theirs.approval, theirs.reasons)


def test_the_schema_document_lists_every_field_of_the_schema(tmp_path: Path, store: tuple[str, dict[str, str]]) -> None:
    from plangate.plan import SCHEMA_VERSION, plan_json_schema

    out = exported(tmp_path, store[0])
    text = (out / "plan-schema.md").read_text()
    schema = plan_json_schema()
    assert f"# Plan schema, version {SCHEMA_VERSION}" in text
    for fields in (schema["properties"], schema["$defs"]["Step"]["properties"]):
        assert all(f"| `{name}` |" in text for name in fields)
    assert json.loads((out / "plan-schema.json").read_text()) == {"schema_version": SCHEMA_VERSION, "schema": schema}


def test_every_governance_command_has_help() -> None:
    for args in (["governance"], ["governance", "export"], ["governance", "verify"]):
        done = run(*args, "--help")
        assert done.exit_code == 0 and "Usage:" in done.output


def test_export_from_python_names_the_files_it_wrote(tmp_path: Path, store: tuple[str, dict[str, str]]) -> None:
    from contextlib import closing

    from plangate.store import open_store

    seen: list[str] = []
    with closing(open_store(store[0])) as opened:
        done = export(opened, tmp_path / "py", clock=FixedClock(LATER), progress=seen.append)
    assert len(seen) == 6 and done.plans == 6 and done.incidents == 3
    manifest = json.loads((tmp_path / "py" / "manifest.json").read_text())
    assert manifest["exported_at"].startswith("2026-12-05T09:00") and done.files == len(manifest["files"])


def test_the_approval_log_and_incidents_are_the_audit_logs(tmp_path: Path, store: tuple[str, dict[str, str]]) -> None:
    """Someone with the database but not the audit key rewrites a rejection's reason and time, and inserts an
    approval of a plan left open after a halt: the approval log says what the log says, and the plan whose rows
    disagree with its events is left out of the approval log and the incidents, and named."""
    from contextlib import closing

    from plangate.store import open_store

    db, ids = store
    with closing(open_store(db)) as opened, opened.transaction():
        opened.command(
            "UPDATE approvals SET comment = 'fine by me', at = '2026-12-05T10:00:00.000000Z' WHERE plan_id = ?",
            (ids["rejected"],),
        )
        opened.command(
            "INSERT INTO approvals (plan_id, version, plan_hash, decision, actor, role, kind, at) SELECT plan_id,"
            " version, plan_hash, 'approved', 'mallory', role, 'person', at FROM approvals WHERE plan_id = ?",
            (ids["open"],),
        )
    out = exported(tmp_path, db)
    with (out / "approvals.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    rejected = next(r for r in rows if r["plan_id"] == ids["rejected"])
    assert (rejected["comment"], rejected["at"][:16]) == ("wrong invoice", "2026-12-05T09:00")
    assert not [r for r in rows if r["plan_id"] == ids["open"]], "a plan whose rows disagree with its events"
    assert f"Plan {ids['open']}" not in (out / "incidents.md").read_text()
    index = (out / "README.md").read_text()
    assert f"- plan {ids['open']}: the approvals table does not match the audit log (a row with no event: " in index
    assert json.loads((out / "manifest.json").read_text())["left_out"] == [ids["open"]]
    assert run("governance", "verify", str(out)).exit_code == 0
