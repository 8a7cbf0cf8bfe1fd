from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from plangate import Catalogue, Policy, ledger, tool
from plangate.accounts import Accounts
from plangate.cli import main
from plangate.errors import GovernanceError, StoreError, UsageError
from plangate.register import Register, report
from plangate.runtime import Runtime
from tests.helpers import FixedClock, plan


@tool
def look(key: str) -> str:
    return key


POLICY = Policy.from_yaml("version: 1\nname: reg\napproval: {auto: [lookups]}\n")


@pytest.fixture
def runtime(tmp_path: Path) -> Runtime:
    rt = Runtime(Catalogue([look]), POLICY, db=f"sqlite:///{tmp_path}/r.db", clock=FixedClock())
    accounts = Accounts(rt.store)
    accounts.add("gina", "governance")
    accounts.add("dave", "approver", categories=("*",))
    return rt


def test_the_register_holds_or_clears_a_category(runtime: Runtime) -> None:
    lookup = plan({"id": 1, "tool": "look", "params": {"key": "a"}}, category="lookups")
    assert runtime.submit(lookup, "ann").status == "approved", "no entry: the policy decides"
    register = Register(runtime.store, runtime.clock)
    with pytest.raises(GovernanceError, match="only governance"):
        register.set("lookups", False, by="dave", reason="no")
    with pytest.raises(UsageError, match="say why"):
        register.set("lookups", False, by="gina", reason=" ")
    register.set("lookups", False, by="gina", reason="until the audit in March")
    held = runtime.submit(lookup, "ann")
    assert held.status == "pending_approval" and held.needs == ("a person",)
    assert any(
        "register holds category 'lookups' for people (until the audit in March)" in r for r in held.decision["reasons"]
    )  # type: ignore[index]
    register.set("lookups", True, by="gina", reason="cleared after review")
    assert runtime.submit(lookup, "ann").status == "approved"
    register.set("refunds", True, by="gina", reason="wants it")
    refund = plan({"id": 1, "tool": "look", "params": {"key": "a"}}, category="refunds")
    assert runtime.submit(refund, "ann").status == "pending_approval", "never beyond what the policy allows"
    changes = [e for e in runtime.store.events() if e.kind == "register.changed"]
    assert [(e.actor, e.data["category"], e.data["auto"]) for e in changes] == [
        ("gina", "lookups", False),
        ("gina", "lookups", True),
        ("gina", "refunds", True),
    ]


@tool(effect="write")
def pay(key: str) -> str:
    return key


@pytest.mark.parametrize("defined", [True, False])
def test_a_hold_is_not_sidestepped_by_a_look_alike_category(tmp_path: Path, defined: bool) -> None:
    """A hold names a category exactly. Where the policy defines its categories, a look-alike of a held one is
    rejected as unknown; where it does not, a category is the requester's own label, and a look-alike gets what
    any other label gets: never a write without a person (with no envelope, automatic approval only reads)."""
    categories = "categories: {payments: {tools: ['*']}}\n" if defined else ""
    policy = Policy.from_yaml(f"version: 1\nname: reg\n{categories}approval: {{default: auto}}\n")
    rt = Runtime(Catalogue([look, pay]), policy, db=f"sqlite:///{tmp_path}/r.db", clock=FixedClock())
    Accounts(rt.store).add("gina", "governance")
    Register(rt.store, rt.clock).set("payments", False, by="gina", reason="until the audit")
    for category in ("Payments", " payments", "payments/eu", "misc"):
        for name, alone in (("look", "approved"), ("pay", "pending_approval")):
            record = rt.submit(plan({"id": 1, "tool": name, "params": {"key": "a"}}, category=category), "ann")
            assert record.status == ("rejected" if defined else alone), (category, name, record.status)
    held = rt.submit(plan({"id": 1, "tool": "look", "params": {"key": "a"}}, category="payments"), "ann")
    assert held.status == "pending_approval"


def test_the_report_finds_categories_approved_without_changes(runtime: Runtime) -> None:
    for n in range(5):
        record = runtime.submit(plan({"id": 1, "tool": "look", "params": {"key": str(n)}}, category="reports"), "ann")
        runtime.approve(record.id, "dave", record.hash)
    edited = runtime.submit(plan({"id": 1, "tool": "look", "params": {"key": "x"}}, category="refunds"), "ann")
    edited = runtime.edit(
        edited.id, plan({"id": 1, "tool": "look", "params": {"key": "y"}}, category="refunds"), "dave"
    )
    runtime.approve(edited.id, "erin", edited.hash)
    rejected = runtime.submit(plan({"id": 1, "tool": "look", "params": {"key": "z"}}, category="refunds"), "ann")
    runtime.reject(rejected.id, "dave", "no")
    rows = {r.category: r for r in report(runtime.store, clock=runtime.clock).categories}
    assert rows["reports"].candidate and rows["reports"].approval_rate == 1.0 and rows["reports"].edit_rate == 0
    assert rows["reports"].median_minutes is not None and rows["reports"].median_minutes < 1
    refunds = rows["refunds"]
    assert (refunds.plans, refunds.approved, refunds.rejected, refunds.edited) == (2, 1, 1, 1)
    assert not refunds.candidate


def test_the_register_and_report_on_the_command_line(
    runtime: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLANGATE_DB", f"sqlite:///{tmp_path}/r.db")
    runner = CliRunner()
    assert runner.invoke(main, ["register", "list"]).stdout.startswith("the register is empty")
    tokens = {name: Accounts(runtime.store).issue_token(name) for name in ("dave", "gina")}
    unsigned = runner.invoke(main, ["register", "set", "lookups", "off", "--as", "gina", "--reason", "x"])
    assert unsigned.exit_code == 4 and "sign in" in unsigned.stderr, "a name typed with --as proves nothing"
    denied = runner.invoke(main, ["register", "set", "lookups", "off", "--token", tokens["dave"], "--reason", "x"])
    assert denied.exit_code == 4 and "governance does that" in denied.stderr
    done = runner.invoke(main, ["register", "set", "lookups", "off", "--token", tokens["gina"], "--reason", "audit"])
    assert done.exit_code == 0 and "automatic approval off (by gina: audit)" in done.stdout
    assert "lookups" in runner.invoke(main, ["register", "list"]).stdout
    out = runner.invoke(main, ["approvals", "report"]).stdout
    assert out.splitlines()[0].split()[:3] == ["CATEGORY", "PLANS", "APPROVED"]


def test_a_hold_changed_or_deleted_in_the_database_still_holds(runtime: Runtime) -> None:
    lookup = plan({"id": 1, "tool": "look", "params": {"key": "a"}}, category="lookups")
    Register(runtime.store, runtime.clock).set("lookups", False, by="gina", reason="until the audit")
    for lift in ("UPDATE register SET auto = 1 WHERE category = 'lookups'", "DELETE FROM register"):
        with runtime.store.transaction():  # someone with database access lifts the hold
            runtime.store.command(lift)
        held = runtime.submit(lookup, "ann")
        assert held.status == "pending_approval"
        assert any("holds category 'lookups' for people" in r for r in held.decision["reasons"])  # type: ignore[index]
    with runtime.store.transaction():  # or rewrites the event that set it
        runtime.store.command("UPDATE events SET data = replace(data, 'false', 'true') WHERE kind = 'register.changed'")
    with pytest.raises(StoreError, match="changed outside plangate"):
        runtime.submit(lookup, "ann")


def test_a_hold_whose_event_was_cut_out_of_the_log_still_stops_plangate(runtime: Runtime) -> None:
    lookup = plan({"id": 1, "tool": "look", "params": {"key": "a"}}, category="lookups")
    register = Register(runtime.store, runtime.clock)
    register.set("lookups", True, by="gina", reason="cleared after review")
    register.set("lookups", False, by="gina", reason="until the audit")
    with runtime.store.transaction():  # the hold's event and its mirror row deleted
        runtime.store.command(
            "DELETE FROM events WHERE seq = (SELECT MAX(seq) FROM events WHERE kind = 'register.changed')"
        )
        runtime.store.command("DELETE FROM register")
    with pytest.raises(StoreError, match=r"register\.changed events were changed outside plangate"):
        runtime.submit(lookup, "ann")


def test_turning_on_a_category_the_policy_never_approves_automatically_is_refused_unless_forced(
    runtime: Runtime,
) -> None:
    register = Register(runtime.store, runtime.clock)
    strict = Policy.from_yaml(
        "version: 1\nname: strict\ncategories:\n  lookups: {effects: [read]}\n  refunds: {tools: [look]}\n"
        "  notes: {tools: [look]}\napproval: {auto: [lookups, 'note*'], human: [notes]}\n"
    )
    for category, why in [
        ("refunds", "policy 'strict' does not clear category 'refunds' (not in approval.auto; default human)"),
        ("notes", "policy 'strict' sends category 'notes' to a person (approval.human)"),
        ("misc", "category 'misc' is not defined in policy 'strict', so its plans are rejected"),
    ]:
        with pytest.raises(GovernanceError) as refused:
            register.set(category, True, by="gina", reason="r", policy=strict)
        assert str(refused.value) == (
            f"{why}: turning it on would change nothing and mislead whoever reads the register; "
            "change the policy first, or force it"
        )
    assert register.all() == [], "nothing was recorded"
    register.set("lookups", True, by="gina", reason="cleared", policy=strict)
    register.set("refunds", False, by="gina", reason="held", policy=strict)  # holding is never misleading
    assert register.set("notes", True, by="gina", reason="ahead of a policy change", policy=strict, force=True).auto
    assert [(e.category, e.auto) for e in register.all()] == [("lookups", True), ("notes", True), ("refunds", False)]


def test_the_command_line_refuses_a_misleading_register_entry_with_exit_4_unless_forced(
    runtime: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLANGATE_DB", f"sqlite:///{tmp_path}/r.db")
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\nname: reg\napproval: {auto: [lookups]}\n")
    token = Accounts(runtime.store).issue_token("gina")
    turn_on = ["register", "set", "refunds", "on", "--token", token, "--reason", "x", "--policy", str(policy)]
    refused = CliRunner().invoke(main, turn_on)
    assert refused.exit_code == 4 and refused.stdout == ""
    assert refused.stderr == (
        "plangate: refused: policy 'reg' does not clear category 'refunds' (not in approval.auto; default human): "
        "turning it on would change nothing and mislead whoever reads the register; change the policy first, "
        "or force it\n"
    )
    forced = CliRunner().invoke(main, [*turn_on, "--force"])
    assert forced.exit_code == 0 and "refunds: automatic approval on (by gina: x)" in forced.stdout


def decided(runtime: Runtime) -> dict[str, str]:
    """Five plans in 'reports' approved as they were, one rejected and one edited before its approval; one waiting."""

    def look_up(key: str) -> dict[str, Any]:
        return plan({"id": 1, "tool": "look", "params": {"key": key}}, category="reports")

    ids = {}
    for n in range(5):
        record = runtime.submit(look_up(str(n)), "ann")
        ids[f"approved{n}"] = runtime.approve(record.id, "dave", record.hash).id
    rejected = runtime.submit(look_up("r"), "ann")
    ids["rejected"] = runtime.reject(rejected.id, "dave", "not this one").id
    edited = runtime.edit(runtime.submit(look_up("e"), "ann").id, look_up("f"), "dave")
    ids["edited"] = runtime.approve(edited.id, "erin", edited.hash).id
    ids["waiting"] = runtime.submit(look_up("w"), "ann").id
    return ids


def test_the_report_is_read_from_the_audit_log_not_from_rows_the_database_can_change(any_db: str) -> None:
    """The evidence that clears a category for automatic approval: a rejection made an approval, an edit undone,
    a decision inserted for a plan still waiting, all in the tables, change none of it."""
    with closing(Runtime(Catalogue([look]), POLICY, db=any_db, clock=FixedClock())) as runtime:
        Accounts(runtime.store).add("dave", "approver", categories=("*",))
        ids = decided(runtime)
        before = report(runtime.store, clock=runtime.clock)
        reports = next(r for r in before.categories if r.category == "reports")
        counts = (reports.plans, reports.approved, reports.rejected, reports.edited, reports.candidate)
        assert counts == (8, 6, 1, 1, False)
        with runtime.store.transaction():  # someone with the database, without the audit key
            runtime.store.command("UPDATE approvals SET decision = 'approved' WHERE plan_id = ?", (ids["rejected"],))
            runtime.store.command("UPDATE plans SET status = 'approved' WHERE id = ?", (ids["rejected"],))
            runtime.store.command("UPDATE plans SET version = 1 WHERE id = ?", (ids["edited"],))
            runtime.store.command("DELETE FROM plan_versions WHERE plan_id = ? AND version = 2", (ids["edited"],))
            runtime.store.command(
                "INSERT INTO approvals (plan_id, version, plan_hash, decision, actor, role, kind, at) SELECT ?,"
                " version, plan_hash, 'approved', 'dave', role, 'person', at FROM approvals WHERE plan_id = ?",
                (ids["waiting"], ids["approved0"]),
            )
        assert report(runtime.store, clock=runtime.clock) == before
        assert not ledger.verify(runtime.store).ok, "the rows disagree with the log, as audit verify says"


def test_a_plan_whose_events_do_not_verify_is_named_and_no_category_is_a_candidate(
    runtime: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rejection's event rewritten, or a plan's events cut out with only its row left: the plan is left out of
    the evidence and named, and while one is, no category is a candidate (its own cannot be known)."""
    ids = decided(runtime)
    for n in range(5, 10):
        record = runtime.submit(plan({"id": 1, "tool": "look", "params": {"key": str(n)}}, category="notes"), "ann")
        runtime.approve(record.id, "dave", record.hash)
    assert [r.category for r in report(runtime.store, clock=runtime.clock).categories if r.candidate] == ["notes"]
    with runtime.store.transaction():
        runtime.store.command(
            "UPDATE events SET data = replace(data, '\"rejected\"', '\"approved\"') WHERE plan_id = ?",
            (ids["rejected"],),
        )
    evidence = report(runtime.store, clock=runtime.clock)
    assert [r.category for r in evidence.categories if r.candidate] == []
    reports = next(r for r in evidence.categories if r.category == "reports")
    assert (reports.plans, reports.approved, reports.rejected) == (7, 6, 0), "the rewritten plan is left out"
    assert len(evidence.left_out) == 1
    assert evidence.named[0].startswith(f"plan {ids['rejected']}: its audit events do not verify (event ")
    monkeypatch.setenv("PLANGATE_DB", f"sqlite:///{tmp_path}/r.db")
    out = CliRunner().invoke(main, ["approvals", "report", "--days", "36500"]).stdout
    assert f"1 plan(s) left out, so no category is a candidate:\n  plan {ids['rejected']}: its audit events" in out
    with runtime.store.transaction():
        runtime.store.command("DELETE FROM events WHERE plan_id = ?", (ids["edited"],))
    evidence = report(runtime.store, clock=runtime.clock)
    assert any(line.startswith(f"plan {ids['edited']}: ") for line in evidence.named), evidence.left_out
