"""Only what was approved runs, exactly once: each test is an attack, and asserts the refusal and no effect.

The store matters for most of them, so they run on SQLite and on a real PostgreSQL server.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest

from plangate import Catalogue, Policy, ledger, tool
from plangate.errors import (
    GovernanceError,
    LeaseLostError,
    PlangateError,
    SelfApprovalError,
    StateError,
    StoreError,
    UsageError,
)
from plangate.lifecycle import LeaseKeeper
from plangate.runtime import Runtime
from tests.helpers import FixedClock, died_during, dies_during, plan, until

_COUNTER = iter(range(10**6))
EFFECTS: list[str] = []


@tool(effect="write", scopes=["refunds:write"])
def pay(invoice_id: str, amount: float) -> str:
    """Pay money out (not idempotent: twice is twice)."""
    EFFECTS.append(f"pay {amount} on {invoice_id}")
    return f"paid {amount}"


@tool(scopes=["invoices:read"])
def look(invoice_id: str) -> str:
    return invoice_id


CAT = Catalogue([pay, look])
POLICY_TEXT = """
version: 1
name: attacks
roles:
  support: {tools: ["*"], scopes: ["*"]}
  operator: {tools: ["*"], scopes: ["*"]}
  approver: {tools: ["look"], scopes: ["invoices:read"]}
  privacy-officer: {tools: ["look"], scopes: ["invoices:read"]}
users: {alice: support, bob: operator, dave: approver, erin: approver, carol: privacy-officer}
deny:
  - name: no-big-payments
    tools: ["pay"]
    params: ["amount"]
    pattern: "^[0-9]{3,}"
    message: "is too much to pay without the finance team"
approval:
  default: human
"""
POLICY = Policy.from_yaml(POLICY_TEXT)
REFUND = plan(
    {"id": 1, "tool": "pay", "params": {"invoice_id": "42", "amount": 3.0}},
    category="refunds",
    task="Refund 3 EUR on invoice 42",
)


_OPEN: list[Runtime] = []


def open_rt(*args: Any, **kwargs: Any) -> Runtime:
    """A runtime (its own store connection) that is closed when the test ends."""
    rt = Runtime(*args, **kwargs)
    _OPEN.append(rt)
    return rt


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    EFFECTS.clear()
    yield
    while _OPEN:
        _OPEN.pop().close()


@pytest.fixture
def db(any_db: str) -> str:
    return any_db


def sql(db: str, statement: str, params: tuple[Any, ...] = ()) -> None:
    """What an operator with database access, and no plangate, can do."""
    if db.startswith("sqlite:///"):
        with sqlite3.connect(db.removeprefix("sqlite:///")) as conn:
            conn.execute(statement, params)
    else:
        with psycopg.connect(db, autocommit=True) as pg:
            pg.execute(statement.replace("?", "%s"), params)  # type: ignore[arg-type]


def approved(db: str, body: dict[str, Any] = REFUND) -> tuple[Runtime, str]:
    rt = open_rt(CAT, POLICY, db=db)
    record = rt.submit(body, "alice")
    rt.approve(record.id, "dave", record.hash)
    return rt, record.id


# -- 1. what runs is what was approved ------------------------------------------------------------
def test_a_changed_plan_text_does_not_run(db: str) -> None:
    rt, plan_id = approved(db)
    forged = plan(
        {"id": 1, "tool": "pay", "params": {"invoice_id": "44", "amount": 980.0}}, category="refunds", task="x"
    )
    from plangate.plan import Plan

    text = Plan.parse(forged).canonical_json()
    sql(db, "UPDATE plan_versions SET body = ? WHERE plan_id = ?", (text, plan_id))
    with pytest.raises(GovernanceError, match="the plan text was changed"):
        rt.execute(plan_id)
    # and with every hash column rewritten to match the forged text: the audit log still says otherwise
    new_hash = Plan.parse(forged).hash
    sql(db, "UPDATE plan_versions SET hash = ? WHERE plan_id = ?", (new_hash, plan_id))
    sql(db, "UPDATE plans SET hash = ? WHERE id = ?", (new_hash, plan_id))
    with pytest.raises(GovernanceError, match="may not run"):
        open_rt(CAT, POLICY, db=db).execute(plan_id)
    assert EFFECTS == []
    report = ledger.verify(rt.store)
    assert not report.ok and "plan_versions.hash is" in str(report), report


def test_what_changes_between_the_proof_and_the_claim_is_proved_again_under_the_lock(db: str) -> None:
    """The right to run is proved before the log's lock is taken; a plan changed meanwhile is proved again."""
    from plangate.plan import Plan

    forged = plan({"id": 1, "tool": "pay", "params": {"invoice_id": "44", "amount": 980.0}}, category="refunds")

    class ChangedMeanwhile(Runtime):
        def _proved_before(self, plan_id: str) -> Any:
            proof = super()._proved_before(plan_id)
            assert proof is not None  # the plan may run as it stood
            sql(
                db,
                "UPDATE plan_versions SET body = ? WHERE plan_id = ?",
                (Plan.parse(forged).canonical_json(), plan_id),
            )
            return proof

    _, plan_id = approved(db)
    rt = ChangedMeanwhile(CAT, POLICY, db=db)
    _OPEN.append(rt)
    with pytest.raises(GovernanceError, match="the plan text was changed"):
        rt.start(plan_id, actor="bob")
    assert rt.get(plan_id).status == "approved" and EFFECTS == []


TRIES: list[str] = []


@tool(scopes=["invoices:read"])
def flaky(invoice_id: str) -> str:
    """Fails the first time it is called, then answers."""
    TRIES.append(invoice_id)
    if len(TRIES) == 1:
        raise RuntimeError("the service is down")
    return invoice_id


def test_a_step_row_deleted_between_the_proof_and_the_claim_does_not_pay_again(db: str) -> None:
    """The run takes its step rows from the proof that held them against the audit log. An operator who
    deletes a paid step's row after the proof and before the claim (nothing in the plan's row, version or
    events changes, so the claim keeps the proof) does not make the resumed run pay again: the run used
    to read the rows afresh there, unchecked, and found the payment not made."""
    TRIES.clear()
    body = plan(
        {"id": 1, "tool": "pay", "params": {"invoice_id": "42", "amount": 3.0}},
        {"id": 2, "tool": "flaky", "params": {"invoice_id": "42"}},
        category="refunds",
    )
    rt = open_rt(Catalogue([pay, flaky]), POLICY, db=db)
    record = rt.submit(body, "alice")
    rt.approve(record.id, "dave", record.hash)
    assert rt.execute(record.id).status == "halted" and EFFECTS == ["pay 3.0 on 42"]

    class DeletedMeanwhile(Runtime):
        def _proved_before(self, plan_id: str) -> Any:
            proof = super()._proved_before(plan_id)
            assert proof is not None  # the plan may resume as it stood
            sql(db, "DELETE FROM steps WHERE plan_id = ? AND step_id = 1", (plan_id,))
            return proof

    again = DeletedMeanwhile(Catalogue([pay, flaky]), POLICY, db=db)
    _OPEN.append(again)
    result = again.resume(record.id)
    assert result.status == "succeeded" and result.ran == (2,)
    assert EFFECTS == ["pay 3.0 on 42"]  # paid once


TAKEN: dict[str, str] = {}


@tool(effect="write", scopes=["refunds:write"])
def pay_while_taken(invoice_id: str, amount: float) -> str:
    """Pays, while another runner takes the plan over (its runner looked dead)."""
    sql(TAKEN["db"], "UPDATE plans SET lease_owner = 'intruder' WHERE id = ?", (TAKEN["plan"],))
    EFFECTS.append(f"pay {amount} on {invoice_id}")
    return f"paid {amount}"


def test_a_run_whose_plan_was_taken_over_does_not_end_it(db: str) -> None:
    """The run's end moves the plan on from the row it claimed, without reading it again: only while
    its owner still holds it. Taken over meanwhile, the run stops and neither its end nor the step's
    outcome is recorded: the plan is the new runner's to carry on."""
    rt = open_rt(Catalogue([pay_while_taken]), POLICY, db=db)
    record = rt.submit(
        plan({"id": 1, "tool": "pay_while_taken", "params": {"invoice_id": "42", "amount": 3.0}}), "alice"
    )
    rt.approve(record.id, "dave", record.hash)
    TAKEN.update(db=db, plan=record.id)
    with pytest.raises(LeaseLostError, match=f"lost its lease on plan {record.id} to intruder: the run stops here"):
        rt.execute(record.id)
    row = rt.store.get_plan(record.id)
    assert row is not None and (row.status, row.lease_owner) == ("running", "intruder")
    assert [e.kind for e in rt.trace(record.id)][-1] == "step.started"
    assert EFFECTS == ["pay 3.0 on 42"] and rt.store.verify_audit().ok


def test_a_pending_plan_set_to_approved_does_not_run(db: str) -> None:
    rt = open_rt(CAT, POLICY, db=db)
    record = rt.submit(REFUND, "alice")
    sql(db, "UPDATE plans SET status = 'approved' WHERE id = ?", (record.id,))
    with pytest.raises(GovernanceError, match="status"):
        rt.execute(record.id)
    assert EFFECTS == []


def test_an_approval_row_inserted_by_hand_does_not_count(db: str) -> None:
    rt = open_rt(CAT, POLICY, db=db)
    record = rt.submit(REFUND, "alice")
    sql(
        db,
        "INSERT INTO approvals (plan_id, version, plan_hash, decision, actor, role, kind, at, void)"
        " VALUES (?, 1, ?, 'approved', 'dave', 'approver', 'person', '2026-01-01', 0)",
        (record.id, record.hash),
    )
    sql(db, "UPDATE plans SET status = 'approved' WHERE id = ?", (record.id,))
    with pytest.raises(GovernanceError, match="may not run"):
        rt.execute(record.id)
    assert EFFECTS == []


def test_deny_rules_deleted_from_the_stored_policy_do_not_run(db: str) -> None:
    rt, plan_id = approved(db)
    weaker = Policy.from_yaml(POLICY_TEXT.split("deny:", maxsplit=1)[0] + "approval:\n  default: human\n")
    sql(db, "UPDATE policies SET body = ? WHERE hash = ?", (weaker.canonical_json(), POLICY.hash))
    with pytest.raises(GovernanceError, match=r"policy .* was changed"):
        rt.execute(plan_id)
    assert EFFECTS == []


def submitted_with_tools(tmp_path: Path) -> tuple[str, str, Path, Path, Path]:
    """A plan submitted on the command line with a tools module, and approved; and a module
    that marks it was imported (code that must never run)."""
    from click.testing import CliRunner

    from plangate.cli import main

    db = f"sqlite:///{tmp_path}/plangate.db"
    tools = tmp_path / "tools.py"
    tools.write_text(
        "from plangate import tool\n\n@tool(effect='write')\ndef pay(amount: float) -> str:\n    return 'ok'\n"
    )
    evil, marker = tmp_path / "evil.py", tmp_path / "imported"
    evil.write_text(f"open({str(marker)!r}, 'w').write('code ran')\n")
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan({"id": 1, "tool": "pay", "params": {"amount": 3.0}})))
    done = CliRunner().invoke(main, ["submit", str(plan_file), "--tools", str(tools), "--as", "alice", "--db", db])
    plan_id = done.stdout.split()[1]
    rt = open_rt(db=db)
    rt.approve(plan_id, "dave", rt.get(plan_id).hash)
    return db, plan_id, tools, evil, marker


def test_a_tools_module_repointed_in_the_store_is_never_imported(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from plangate.cli import main

    db, plan_id, _, evil, marker = submitted_with_tools(tmp_path)
    sql(db, "UPDATE plans SET tools = ? WHERE id = ?", (str(evil), plan_id))
    result = CliRunner().invoke(main, ["execute", plan_id, "--db", db])
    assert result.exit_code == 4, result.output
    assert "not the one its audit log names" in result.output
    assert not marker.exists()


# -- 2. roles come from the policy, never from a claim -------------------------------------------
def test_a_claimed_role_is_refused(db: str) -> None:
    rt = open_rt(CAT, POLICY, db=db)
    with pytest.raises(GovernanceError, match=r"alice holds role 'support'.*not 'operator'"):
        rt.submit(REFUND, "alice", role="operator")
    needs_officer = Policy.from_yaml(
        POLICY_TEXT.replace("default: human", "default: human\n  human: ['*']")
        + "sequences:\n  - {name: officer, after: {tools: [look]}, forbid: {tools: [pay]},"
        + " unless_approved_by: privacy-officer}\n"
    )
    rt = open_rt(CAT, needs_officer, db=db)
    record = rt.submit(
        plan(
            {"id": 1, "tool": "look", "params": {"invoice_id": "42"}},
            {"id": 2, "tool": "pay", "params": {"invoice_id": "42", "amount": 3.0}},
        ),
        "alice",
    )
    assert "privacy-officer" in record.needs
    with pytest.raises(GovernanceError, match="mallory holds no role"):
        rt.approve(record.id, "mallory", record.hash, role="privacy-officer")
    with pytest.raises(GovernanceError, match="dave holds role 'approver'"):
        rt.approve(record.id, "dave", record.hash, role="privacy-officer")
    rt.approve(record.id, "dave", record.hash)
    assert rt.get(record.id).needs == ("privacy-officer",)
    assert rt.approve(record.id, "carol", record.hash).status == "approved"


# -- 3. four eyes on every version, and a hash on every approval ----------------------------------
def test_an_author_of_any_version_never_approves(db: str) -> None:
    rt = open_rt(CAT, POLICY, db=db)
    record = rt.submit(REFUND, "alice")
    bigger = {**REFUND, "steps": [{**REFUND["steps"][0], "params": {"invoice_id": "42", "amount": 30.0}}]}
    rt.edit(record.id, bigger, "bob")  # bob changes the amount
    touched = {**bigger, "task": bigger["task"] + "."}
    record = rt.edit(record.id, touched, "erin")  # someone makes a one-character edit
    with pytest.raises(SelfApprovalError, match="bob wrote a version"):
        rt.approve(record.id, "bob", record.hash)
    with pytest.raises(SelfApprovalError, match="erin wrote a version"):
        rt.approve(record.id, "erin", record.hash)
    with pytest.raises(UsageError, match="hash"):
        rt.approve(record.id, "dave", None)  # type: ignore[arg-type]
    assert rt.approve(record.id, "dave", record.hash).status == "approved"


# -- 4. compare-and-set: races ----------------------------------------------------------------------
def race(*jobs: Callable[[], Any]) -> list[Any]:
    """Run the jobs at the same moment, each in its own thread; their results or exceptions."""
    gate = threading.Barrier(len(jobs))
    results: list[Any] = [None] * len(jobs)

    def run(i: int) -> None:
        gate.wait()
        try:
            results[i] = jobs[i]()
        except PlangateError as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


TRIALS = 20


def test_two_executions_of_one_plan_call_the_tool_once(db: str) -> None:
    for _ in range(TRIALS):
        EFFECTS.clear()
        _, plan_id = approved(db)
        first, second = open_rt(CAT, POLICY, db=db), open_rt(CAT, POLICY, db=db)
        results = race(partial(first.execute, plan_id), partial(second.execute, plan_id))
        assert EFFECTS == ["pay 3.0 on 42"], results
        refused = [r for r in results if isinstance(r, StateError)]
        assert len(refused) <= 1, results
        assert all("already running" in str(r) or "has already run" in str(r) for r in refused), results


def test_two_runs_given_one_owner_name_never_pass_one_fence(db: str) -> None:
    """An owner name given twice (a script that names its runner, two copies of it) is a name, not a claim:
    while the first run holds the plan the second is refused; once the first looks dead and the second
    takes over, the first, waking, starts nothing, for its fence is its own claim's, not the name's."""
    rt, plan_id = approved(db)
    other = open_rt(CAT, POLICY, db=db)
    first = rt.start(plan_id, actor="bob", owner="nightly")
    with pytest.raises(StateError, match="already running under nightly"):
        other.start(plan_id, actor="bob", owner="nightly")
    sql(db, "UPDATE plans SET lease_until = '2000-01-01T00:00:00.000000Z' WHERE id = ?", (plan_id,))
    second = other.start(plan_id, actor="bob", owner="nightly")  # the first run looked dead: taken over
    assert first.owner != second.owner and first.owner.startswith("nightly") and second.owner.startswith("nightly")
    with pytest.raises(LeaseLostError):
        rt.drive(first)
    assert EFFECTS == []
    assert other.drive(second).status == "succeeded" and EFFECTS == ["pay 3.0 on 42"]


def test_a_workers_claim_starts_one_run_only(db: str) -> None:
    """A plan leased to a runner (a worker's claim) is started once under that lease: a second start
    that names the same lease is refused, and its run never passes the first run's fence."""
    rt, plan_id = approved(db)
    owner = "worker-1#0@elsewhere:1"
    assert rt.store.claim_batch(owner, "2026-01-01T00:00:00.000000Z", "2999-01-01T00:00:00.000000Z", 1, []) == [plan_id]
    claim = rt.start(plan_id, actor="worker", owner=owner, leased=True)
    with pytest.raises(LeaseLostError, match="no longer holds its claim"):
        open_rt(CAT, POLICY, db=db).start(plan_id, actor="worker", owner=owner, leased=True)
    assert rt.drive(claim).status == "succeeded" and EFFECTS == ["pay 3.0 on 42"]


def test_a_reject_and_an_execute_never_both_win(db: str) -> None:
    for _ in range(TRIALS):
        EFFECTS.clear()
        rt, plan_id = approved(db)
        runner, rejecter = open_rt(CAT, POLICY, db=db), open_rt(CAT, POLICY, db=db)
        ran, rejected = race(partial(runner.execute, plan_id), partial(rejecter.reject, plan_id, "erin", "no"))
        if isinstance(rejected, PlangateError):
            assert EFFECTS == ["pay 3.0 on 42"] and not isinstance(ran, PlangateError)
        else:
            assert isinstance(ran, StateError) and EFFECTS == [], (ran, rejected)
            assert rt.get(plan_id).status == "rejected"


def test_an_edit_that_commits_first_means_the_old_version_never_runs(db: str) -> None:
    for _ in range(TRIALS):
        EFFECTS.clear()
        _, plan_id = approved(db)
        runner, editor = open_rt(CAT, POLICY, db=db), open_rt(CAT, POLICY, db=db)
        bigger = {**REFUND, "steps": [{**REFUND["steps"][0], "params": {"invoice_id": "42", "amount": 30.0}}]}
        ran, edited = race(partial(runner.execute, plan_id), partial(editor.edit, plan_id, bigger, "bob"))
        if isinstance(edited, PlangateError):
            assert EFFECTS == ["pay 3.0 on 42"], (ran, edited)
        else:
            assert isinstance(ran, PlangateError) and EFFECTS == [], (ran, edited)


# -- 5. drift after approval -----------------------------------------------------------------------
def test_tools_whose_effect_changed_after_approval_send_the_plan_back(db: str) -> None:
    @tool(scopes=["invoices:read"])
    def lookup(invoice_id: str) -> str:
        EFFECTS.append(f"look {invoice_id}")
        return invoice_id

    @tool(effect="irreversible", external=True, scopes=["invoices:read"], name="lookup")
    def lookup_now(invoice_id: str) -> str:
        EFFECTS.append(f"send {invoice_id}")
        return invoice_id

    lenient = Policy.from_yaml(POLICY_TEXT.replace("default: human", "default: auto"))
    rt = open_rt(Catalogue([lookup]), lenient, db=db)
    record = rt.submit(plan({"id": 1, "tool": "lookup", "params": {"invoice_id": "42"}}), "alice")
    assert record.status == "approved"  # read-only: cleared automatically
    changed = open_rt(Catalogue([lookup_now]), lenient, db=db)
    with pytest.raises(GovernanceError, match=r"the tools changed .* needs approval by a person"):
        changed.execute(record.id)
    assert EFFECTS == [] and changed.get(record.id).status == "pending_approval"
    assert [e.kind for e in changed.trace(record.id)][-2:] == ["plan.checked", "plan.pending_approval"]


def test_a_policy_tightened_after_approval_reaches_the_approved_plan(db: str) -> None:
    rt, plan_id = approved(db)
    tighter = Policy.from_yaml(
        POLICY_TEXT.replace('params: ["amount"]', 'params: ["invoice_id"]').replace('"^[0-9]{3,}"', '"^42$"')
    )
    with pytest.raises(GovernanceError, match=r"the policy changed .* no longer passes: .*no-big-payments"):
        open_rt(CAT, tighter, db=db).execute(plan_id)
    assert EFFECTS == [] and rt.get(plan_id).status == "approved"
    with pytest.raises(GovernanceError, match="no-big-payments"):  # the tighter policy is now the plan's own
        open_rt(CAT, None, db=db).execute(plan_id)


def test_a_policy_that_now_wants_a_person_sends_an_auto_approved_plan_back(db: str) -> None:
    lenient = Policy.from_yaml(POLICY_TEXT.replace("default: human", "default: auto"))
    rt = open_rt(CAT, lenient, db=db)
    record = rt.submit(plan({"id": 1, "tool": "look", "params": {"invoice_id": "42"}}), "alice")
    assert record.status == "approved"
    now = open_rt(CAT, POLICY, db=db)
    with pytest.raises(GovernanceError, match=r"the policy changed .* now needs approval by a person; it is back"):
        now.execute(record.id)
    assert now.get(record.id).status == "pending_approval"
    now.approve(record.id, "dave", record.hash)
    assert now.execute(record.id).ok


def test_tools_from_another_module_with_another_contract_are_refused(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/plangate.db"
    rt = open_rt(CAT, POLICY, db=db, tools="tools_a")
    record = rt.submit(REFUND, "alice")
    rt.approve(record.id, "dave", record.hash)

    @tool(effect="irreversible", scopes=["refunds:write"], name="pay")
    def pay_other(invoice_id: str, amount: float) -> str:
        EFFECTS.append("other")
        return "x"

    other = open_rt(Catalogue([pay_other, look]), POLICY, db=db, tools="tools_b")
    with pytest.raises(GovernanceError, match="submitted with the tools of tools_a"):
        other.execute(record.id)
    assert EFFECTS == []
    same = open_rt(CAT, POLICY, db=db, tools="tools_c")  # same contract, another module: allowed
    assert same.execute(record.id).ok and EFFECTS == ["pay 3.0 on 42"]


# -- 6. settle and compensate are decisions --------------------------------------------------------
def test_only_an_approver_settles_and_never_during_a_run(db: str) -> None:
    rt, plan_id = approved(db)

    died_during(rt.store, plan_id, 1)
    result = rt.execute(plan_id)
    assert result.status == "halted" and "outcome unknown" in (result.error or "") and EFFECTS == []
    with pytest.raises(SelfApprovalError, match="alice requested plan"):
        rt.settle(plan_id, 1, done=True, actor="alice", output="paid 3.0")
    with pytest.raises(GovernanceError, match="mallory holds no role"):
        rt.settle(plan_id, 1, done=True, actor="mallory", output="IBAN-OF-ATTACKER")
    # a run holds the plan: nobody settles under it
    live = open_rt(CAT, POLICY, db=db, clock=FixedClock())
    taken = "UPDATE plans SET status = ?, lease_owner = ?, lease_until = ? WHERE id = ?"
    sql(db, taken, ("running", "worker@elsewhere:1", "2999-01-01", plan_id))
    with pytest.raises(StateError, match="under worker@elsewhere"):
        live.settle(plan_id, 1, done=True, actor="dave", output="paid 3.0")
    sql(db, taken, ("halted", None, None, plan_id))
    settled = rt.settle(plan_id, 1, done=False, actor="dave", note="the bank shows no payment")
    assert settled.status == "halted"
    assert rt.resume(plan_id).ok and EFFECTS == ["pay 3.0 on 42"]


def test_two_resumes_of_one_approved_react_action_pay_once(db: str) -> None:
    from plangate.models.test import ScriptedModel
    from plangate.react import ReActAgent

    for _ in range(TRIALS):
        EFFECTS.clear()
        rt = open_rt(CAT, POLICY, db=db)

        def agent() -> ReActAgent:
            script = ['Action: pay {"invoice_id": "42", "amount": 3.0}', "Final Answer: paid"]
            return ReActAgent(ScriptedModel(script), CAT, open_rt(db=db).store, policy=POLICY, user="alice")

        paused = agent().run("Refund 3 EUR on invoice 42")
        assert paused.status == "paused" and EFFECTS == []
        rt.approve(paused.run_id, "dave", paused.pending_hash or "")
        results = race(partial(agent().resume, paused.run_id), partial(agent().resume, paused.run_id))
        assert EFFECTS == ["pay 3.0 on 42"], results
        assert sum(isinstance(r, StateError) for r in results) == 1, results


def test_a_second_click_on_execute_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from plangate.accounts import Accounts
    from plangate.server import create_app

    db = f"sqlite:///{tmp_path}/server.db"
    accounts = Accounts(open_rt(db=db).store)
    accounts.add("dave", "approver", password="correct horse battery", categories=("*",))
    token = accounts.issue_token("dave")
    rt, plan_id = approved(db)
    claim = rt.start(plan_id, actor="first click")  # the first click has claimed the run; it is still going
    client = TestClient(create_app(CAT, POLICY, db=db, secure_cookies=False))
    client.headers["Authorization"] = f"Bearer {token}"
    second = client.post(f"/api/plans/{plan_id}/execute")
    assert second.status_code == 409 and "already running under first click" in second.json()["error"]
    assert EFFECTS == []
    assert rt.drive(claim).ok and EFFECTS == ["pay 3.0 on 42"]


def test_a_plan_held_by_a_runner_on_another_machine_is_refused_with_when_it_may_run(db: str) -> None:
    """A runner on another machine claimed the plan and died (a pod killed): its lease is live until it runs out,
    for nobody here can tell that runner is gone. A person's execute or resume is refused, and is told until when
    the lease holds and what then: execute said only "already running under ...", and neither said what to do."""
    rt, plan_id = approved(db)
    rt.start(plan_id, actor="bob")
    gone = "worker:w#0a1b2c3d@elsewhere/1/2:77"
    sql(
        db,
        "UPDATE plans SET lease_owner = ?, lease_until = '2999-01-01T00:00:00.000000Z' WHERE id = ?",
        (gone, plan_id),
    )
    for attempt in (rt.execute, rt.resume):
        with pytest.raises(StateError) as refused:
            attempt(plan_id)
        said = str(refused.value)
        assert f"already running under {gone} (lease until 2999-01-01T00:00:00.000000Z)" in said, said
        assert "if its runner stopped, it may be resumed once that lease has run out" in said, said
    assert EFFECTS == []


def test_the_loser_of_two_runs_exits_4_on_the_command_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from plangate.cli import main

    db = f"sqlite:///{tmp_path}/plangate.db"
    rt, plan_id = approved(db)
    rt.start(plan_id, actor="worker")
    out = CliRunner().invoke(main, ["execute", plan_id, "--db", db, "--tools", "tests.test_lifecycle"])
    assert out.exit_code == 4 and "is already running under worker" in out.output, out.output
    assert EFFECTS == []


def test_audit_verify_names_each_row_changed_outside_plangate(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from plangate.cli import main

    db = f"sqlite:///{tmp_path}/plangate.db"
    rt, plan_id = approved(db)
    assert rt.execute(plan_id).ok
    sql(db, "UPDATE steps SET output = '\"paid 980\"' WHERE plan_id = ?", (plan_id,))
    sql(db, "DELETE FROM approvals WHERE plan_id = ?", (plan_id,))
    out = CliRunner().invoke(main, ["audit", "verify", "--db", db])
    assert out.exit_code == 1, out.output
    assert "audit log intact, but 2 stored row(s) disagree with it" in out.output
    assert f"plan {plan_id} step 1: steps.output differs" in out.output
    assert "the approvals table does not match the audit log (an event with no row: dave approved v1)" in out.output


def test_a_plan_whose_events_were_changed_or_deleted_does_not_run(db: str) -> None:
    rt, plan_id = approved(db)
    events = {e.kind: e.seq for e in rt.trace(plan_id)}
    sql(db, "UPDATE events SET actor = 'carol' WHERE seq = ?", (events["plan.approval"],))
    with pytest.raises(GovernanceError, match=r"its audit events do not verify: event \d+: .* it was edited"):
        rt.execute(plan_id)
    rt2, other = approved(db)
    events = {e.kind: e.seq for e in rt2.trace(other)}
    sql(db, "DELETE FROM events WHERE seq = ?", (events["plan.checked"],))
    with pytest.raises(GovernanceError, match="events of the plan were deleted"):
        rt2.execute(other)
    assert EFFECTS == []


def paused_react(db: str, policy: Policy = POLICY) -> tuple[Runtime, Any, Any]:
    from plangate.models.test import ScriptedModel
    from plangate.react import ReActAgent

    script = ['Action: pay {"invoice_id": "42", "amount": 3.0}', "Final Answer: paid"]
    agent = ReActAgent(ScriptedModel(script), CAT, open_rt(db=db).store, policy=policy, user="alice")
    return open_rt(CAT, policy, db=db), agent, agent.run("Refund 3 EUR on invoice 42")


def test_a_react_action_that_ran_never_runs_again(db: str) -> None:
    rt, agent, paused = paused_react(db)
    rt.approve(paused.run_id, "dave", paused.pending_hash or "")
    assert agent.resume(paused.run_id).status == "answered" and EFFECTS == ["pay 3.0 on 42"]
    sql(db, "UPDATE plans SET status = 'approved' WHERE id = ?", (paused.run_id,))
    with pytest.raises(GovernanceError, match=r"plans\.status is 'approved', but the audit log says 'succeeded'"):
        agent.resume(paused.run_id)
    assert EFFECTS == ["pay 3.0 on 42"]


def test_a_react_action_runs_only_with_every_approval_it_needs(db: str) -> None:
    needs_officer = Policy.from_yaml(
        POLICY_TEXT + "sequences:\n  - {name: officer, after: {tools: ['*']}, forbid: {tools: [pay]},"
        " unless_approved_by: privacy-officer}\n"
    )
    from plangate.models.test import ScriptedModel
    from plangate.react import ReActAgent

    script = [
        'Action: look {"invoice_id": "42"}',
        'Action: pay {"invoice_id": "42", "amount": 3.0}',
        "Final Answer: ok",
    ]
    agent = ReActAgent(ScriptedModel(script), CAT, open_rt(db=db).store, policy=needs_officer, user="alice")
    paused = agent.run("Refund 3 EUR on invoice 42")
    assert paused.status == "paused" and "privacy-officer" in (paused.reason or "")
    rt = open_rt(CAT, needs_officer, db=db)
    rt.approve(paused.run_id, "dave", paused.pending_hash or "")
    sql(db, "UPDATE plans SET status = 'approved' WHERE id = ?", (paused.run_id,))
    with pytest.raises(GovernanceError, match="may not go on"):
        agent.resume(paused.run_id)
    assert EFFECTS == []


def test_audit_verify_is_not_blinded_by_a_changed_kind(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/plangate.db"
    rt, plan_id = approved(db)
    sql(db, "UPDATE plan_versions SET author = 'mallory' WHERE plan_id = ?", (plan_id,))
    sql(db, "UPDATE plans SET kind = 'react' WHERE id = ?", (plan_id,))
    report = ledger.verify(rt.store)
    assert not report.ok and "plans.kind is 'react', but the audit log says 'plan'" in str(report)


def test_settle_and_compensate_act_only_on_a_plan_whose_rows_agree_with_the_log(db: str) -> None:
    rt, plan_id = approved(db)
    died_during(rt.store, plan_id, 1)
    assert rt.execute(plan_id).status == "halted"
    sql(db, "UPDATE plans SET requested_by = 'erin' WHERE id = ?", (plan_id,))
    with pytest.raises(GovernanceError, match=r"may not settle: .*plans.requested_by is 'erin'"):
        rt.settle(plan_id, 1, done=True, actor="dave", output="paid 3.0")
    with pytest.raises(GovernanceError, match=r"may not be rolled back: .*plans.requested_by"):
        rt.compensate(plan_id, actor="dave", reason="undo")
    assert EFFECTS == []


def test_a_run_cut_out_of_the_log_does_not_run_again(db: str) -> None:
    rt, plan_id = approved(db)
    assert rt.execute(plan_id).ok and EFFECTS == ["pay 3.0 on 42"]
    approved(db)  # another plan's events come after the run
    run = [e.seq for e in rt.trace(plan_id) if e.kind.startswith(("run.", "step."))]
    sql(db, f"DELETE FROM events WHERE seq IN ({', '.join(map(str, run))})")
    sql(db, "DELETE FROM steps WHERE plan_id = ?", (plan_id,))
    sql(db, "UPDATE plans SET status = 'approved' WHERE id = ?", (plan_id,))
    with pytest.raises(GovernanceError, match="events of the plan were deleted"):
        open_rt(CAT, POLICY, db=db).execute(plan_id)
    assert EFFECTS == ["pay 3.0 on 42"]
    assert not ledger.verify(rt.store).ok


def test_a_run_cut_out_with_the_plans_earlier_seal_put_back_does_not_run_again(db: str) -> None:
    rt, plan_id = approved(db)
    before = rt.store.query("SELECT tail FROM plans WHERE id = ?", (plan_id,))[0][0]  # copied while approved
    assert rt.execute(plan_id).ok
    approved(db)  # the log goes on with another plan
    run = [e.seq for e in rt.trace(plan_id) if e.kind.startswith(("run.", "step."))]
    sql(db, f"DELETE FROM events WHERE seq IN ({', '.join(map(str, run))})")
    sql(db, "DELETE FROM steps WHERE plan_id = ?", (plan_id,))
    sql(db, "UPDATE plans SET status = 'approved', tail = ? WHERE id = ?", (before, plan_id))
    with pytest.raises(GovernanceError, match="events after it were cut out"):
        open_rt(CAT, POLICY, db=db).execute(plan_id)
    assert EFFECTS == ["pay 3.0 on 42"]


def test_a_settled_output_is_shown_beside_the_settlers_name(tmp_path: Path) -> None:
    from plangate.server.views import progress
    from plangate.story import tell

    db = f"sqlite:///{tmp_path}/plangate.db"
    rt, plan_id = approved(db)
    died_during(rt.store, plan_id, 1)
    assert rt.execute(plan_id).status == "halted"
    rt.settle(plan_id, 1, done=True, actor="dave", output="paid 3.0", note="the bank shows it")
    story = "\n".join(tell(rt.trace(plan_id)))
    assert 'dave             step 1 (pay) SETTLED by a person as done, with the output they saw: "paid 3.0"' in story
    assert progress(rt, rt.get(plan_id))["steps"]["1"]["detail"] == 'settled as done by dave: "paid 3.0"'


def test_a_react_run_whose_process_died_mid_action_is_stopped_not_run_again(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from plangate.models.test import ScriptedModel
    from plangate.react import ReActAgent

    @tool(effect="write", scopes=["refunds:write"], name="pay")
    def dying_pay(invoice_id: str, amount: float) -> str:
        EFFECTS.append(f"pay {amount} on {invoice_id}")
        return "paid"

    script = ['Action: pay {"invoice_id": "42", "amount": 3.0}', "Final Answer: paid"]
    store = open_rt(db=db).store
    agent = ReActAgent(ScriptedModel(script), Catalogue([dying_pay, look]), store, policy=POLICY, user="alice")
    paused = agent.run("Refund 3 EUR on invoice 42")
    open_rt(CAT, POLICY, db=db).approve(paused.run_id, "dave", paused.pending_hash or "")
    dies_during(monkeypatch, "pay")  # the process goes down during the call
    with pytest.raises(KeyboardInterrupt):
        agent.resume(paused.run_id)
    monkeypatch.undo()
    gone = "UPDATE plans SET lease_owner = 'gone#0@elsewhere:1', lease_until = '2000-01-01' WHERE id = ?"
    sql(db, gone, (paused.run_id,))
    stopped = agent.resume(paused.run_id)
    assert stopped.status == "stopped" and "may or may not have happened" in (stopped.reason or "")
    assert EFFECTS == ["pay 3.0 on 42"], "never run again on its own"
    assert open_rt(db=db).get(paused.run_id).status == "halted"


def test_a_tools_module_named_in_a_rewritten_event_is_never_imported(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from plangate.cli import main

    db, plan_id, tools, evil, marker = submitted_with_tools(tmp_path)
    sql(db, "UPDATE plans SET tools = ? WHERE id = ?", (str(evil), plan_id))
    sql(db, "UPDATE events SET data = replace(data, ?, ?) WHERE plan_id = ?", (str(tools), str(evil), plan_id))
    result = CliRunner().invoke(main, ["execute", plan_id, "--db", db])
    assert result.exit_code == 4 and "do not verify" in result.output, result.output
    assert not marker.exists()


def test_a_status_plangate_does_not_know_is_a_plain_refusal(db: str) -> None:
    rt = open_rt(CAT, POLICY, db=db)
    record = rt.submit(REFUND, "alice")
    sql(db, "UPDATE plans SET status = 'bogus' WHERE id = ?", (record.id,))
    with pytest.raises(StateError, match="is bogus; it cannot become approved"):
        rt.approve(record.id, "dave", record.hash)


class _FlakyRenewals:
    """A store whose lease renewals fail ``failures`` times (None: always), then succeed."""

    def __init__(self, failures: int | None) -> None:
        self.failures, self.calls = failures, 0

    def renew(self, plan_id: str, worker: str, until: str) -> bool:
        self.calls += 1
        if self.failures is None or self.calls <= self.failures:
            raise StoreError("the store cannot be reached")
        return True


def test_a_renewal_that_fails_once_is_tried_again_and_the_lease_kept() -> None:
    """A renewal that raised used to end the keeper's thread: no renewal after it, so a long step
    lost its lease to the next worker. It is tried again, and the run goes on."""
    store = _FlakyRenewals(failures=1)
    keeper = LeaseKeeper(store, "p", "me", 0.3, lambda: "later")  # type: ignore[arg-type]
    with keeper:
        until("renewed after the failure", lambda: store.calls >= 3, limit=10)
    assert not keeper.lost.is_set()


def test_renewals_that_keep_failing_stop_the_run_while_the_lease_still_holds() -> None:
    store = _FlakyRenewals(failures=None)
    keeper = LeaseKeeper(store, "p", "me", 0.3, lambda: "later")  # type: ignore[arg-type]
    with keeper:
        until("the run told to stop", keeper.lost.is_set, limit=10)
        began = store.calls
    # failing from the first renewal (a third of the lease in), given up after half the lease more:
    # before the lease, renewed last at the start, runs out
    assert began >= 2


class _HangingRenewals(_FlakyRenewals):
    """A store whose one renewal hangs for ``seconds`` before it fails."""

    def __init__(self, seconds: float) -> None:
        super().__init__(failures=None)
        self.seconds = seconds

    def renew(self, plan_id: str, worker: str, until: str) -> bool:
        import time

        time.sleep(self.seconds)
        return super().renew(plan_id, worker, until)


def test_a_renewal_that_hangs_then_fails_counts_from_the_last_renewal() -> None:
    """Two thirds of the lease are counted from the last renewal that held, not from the first failure
    seen: a try that hung before it failed used up the time the run had left."""
    store = _HangingRenewals(0.25)
    keeper = LeaseKeeper(store, "p", "me", 0.3, lambda: "later")  # type: ignore[arg-type]
    with keeper:
        until("the run told to stop", keeper.lost.is_set, limit=10)
    assert store.calls == 1  # the first failure came 0.35 s after the lease was taken: stop at once
