"""Rows the runtime acts on, changed in the database by someone without the audit key."""

from __future__ import annotations

import hashlib
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue, Policy, RunContext, tool
from plangate.errors import GovernanceError
from plangate.ledger import verify
from plangate.models.test import ScriptedModel
from plangate.react import ReActAgent
from plangate.runtime import Runtime
from plangate.store import open_store
from tests.helpers import FixedClock, died_during, plan
from tests.test_attacks_escapes import CALLS, hold, release
from tests.test_react import CAT as REACT_CAT
from tests.test_react import POLICY as REACT_POLICY
from tests.test_react import SENT


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


@tool(effect="write", idempotent=True)
def charge(order: str, ctx: RunContext) -> str:
    """Charge an order once per idempotency key: a payment service keyed by the key it is given."""
    CALLS.append(f"charge:{order}:{ctx.attempt}:{ctx.idempotency_key}")
    return "charged"


def cut_off(
    tmp_path: Path, tools: Catalogue | None = None, step: dict[str, Any] | None = None
) -> tuple[Runtime, str, Path]:
    """A run that died during its one step's call: by default an idempotent one, which a resume calls again
    under the same key."""
    CALLS.clear()
    db = tmp_path / "audit.db"
    rt = Runtime(tools or Catalogue([charge]), RULES, db=f"sqlite:///{db}", clock=FixedClock(), tools=MODULE)
    record = rt.submit(plan(step or {"id": 1, "tool": "charge", "params": {"order": "o-1"}}), "ann")
    rt.approve(record.id, "ben", record.hash)
    died_during(rt.store, record.id, 1)
    return rt, record.id, db


@pytest.mark.parametrize(
    ("column", "value"),
    [("idempotency_key", "o-1:elsewhere"), ("attempt", 0), ("version", 2), ("started_at", "2020-01-01T00:00:00Z")],
)
def test_a_started_steps_record_is_held_against_its_started_event(tmp_path: Path, column: str, value: object) -> None:
    """The key a resumed step runs again under, the attempt its tool is told and the version it ran under are the
    log's, never an edit's: verify names the column, and the run refuses before it calls anything."""
    rt, plan_id, db = cut_off(tmp_path)
    tamper(db, f"UPDATE steps SET {column} = ? WHERE plan_id = ? AND step_id = 1", (value, plan_id))
    report = verify(rt.store)
    assert not report.ok and any(f"steps.{column}" in t for t in report.tables), report
    with pytest.raises(GovernanceError, match=rf"steps\.{column}"):
        rt.execute(plan_id)
    assert CALLS == []
    assert not any(e.kind == "step.retrying" for e in rt.store.events(plan_id))


@pytest.mark.parametrize("column", ["started_at", "finished_at"])
def test_when_a_step_ran_is_held_against_its_events(tmp_path: Path, column: str) -> None:
    """When a step started and finished is shown by the dashboard and exports, and a resumed call's tool is told
    its start: the row's times are the log's, never an edit's; verify and the next act name the column."""
    rt, plan_id, db = halted(tmp_path)
    tamper(db, f"UPDATE steps SET {column} = ? WHERE plan_id = ? AND step_id = 1", ("2020-01-01T00:00:00Z", plan_id))
    kind = "step.started" if column == "started_at" else "step.succeeded"
    logged = next(e.at for e in rt.store.events(plan_id) if e.step_id == 1 and e.kind == kind)
    said = f"step 1: steps.{column} is '2020-01-01T00:00:00Z', but the audit log says {logged!r}"
    report = verify(rt.store)
    assert not report.ok and any(said in t for t in report.tables), report
    with pytest.raises(GovernanceError, match=rf"plan {plan_id} may not .* step 1: steps\.{column} is"):
        rt.compensate(plan_id, actor="ben", reason="undo it")
    assert "release:acct-bob" not in CALLS


def test_a_done_step_made_to_look_from_a_later_version_is_not_run_again(tmp_path: Path) -> None:
    """A resume reuses what a version up to its own recorded: a succeeded step's steps.version raised past the
    plan's would have it called again (a second hold on the account)."""
    rt, plan_id, db = halted(tmp_path)
    tamper(db, "UPDATE steps SET version = 2 WHERE plan_id = ? AND step_id = 1", (plan_id,))
    report = verify(rt.store)
    assert not report.ok and any("steps.version" in t for t in report.tables), report
    with pytest.raises(GovernanceError, match=r"steps\.version"):
        rt.resume(plan_id)
    assert CALLS == ["hold:acct-bob"]


def test_the_task_an_approver_reads_is_the_one_submitted(tmp_path: Path) -> None:
    """``plans.task`` is the line a reviewer reads above the plan: it is held against the submission's."""
    db = tmp_path / "audit.db"
    rt = Runtime(CAT, RULES, db=f"sqlite:///{db}", clock=FixedClock(), tools=MODULE)
    record = rt.submit(plan({"id": 1, "tool": "hold", "params": {"account": "acct-bob"}}, task="hold bob"), "ann")
    tamper(db, "UPDATE plans SET task = 'a routine check' WHERE id = ?", (record.id,))
    report = verify(rt.store)
    assert not report.ok and any("plans.task is 'a routine check'" in t for t in report.tables), report
    with pytest.raises(GovernanceError, match=r"plans\.task"):
        rt.approve(record.id, "ben", record.hash)
    edited = rt.submit(plan({"id": 1, "tool": "hold", "params": {"account": "acct-bob"}}, task="hold bob"), "ann")
    rt.edit(edited.id, plan({"id": 1, "tool": "hold", "params": {"account": "acct-bo"}}, task="hold bo"), "ann")
    assert verify(rt.store).tables == report.tables  # an edit's task is the edit's


def paused_react(tmp_path: Path, *then: str) -> tuple[ReActAgent, ScriptedModel, str, Path]:
    """A ReAct run paused for a person's approval of a note, and approved; ``then``: the model's next replies."""
    SENT.clear()
    db = tmp_path / "react.db"
    note = 'Thought: tell her.\nAction: send_note {"to": "ada@example.com", "text": "hello"}'
    model = ScriptedModel([note, *then, "Thought: sent.\nFinal Answer: done"])
    react = ReActAgent(model, REACT_CAT, open_store(f"sqlite:///{db}"), policy=REACT_POLICY, user="ann")
    paused = react.run("Tell Ada hello")
    runtime = Runtime(REACT_CAT, REACT_POLICY, db=react.store, clock=FixedClock())
    runtime.approve(paused.run_id, "ben", paused.pending_hash or "")
    return react, model, paused.run_id, db


def test_a_paused_react_runs_question_is_the_one_it_was_asked(tmp_path: Path) -> None:
    """A ReAct run resumes with its question from ``plans.task``: an edit there would set the model a new task."""
    react, model, run_id, db = paused_react(tmp_path)
    tamper(db, "UPDATE plans SET task = 'Mail the whole list' WHERE id = ?", (run_id,))
    report = verify(react.store)
    assert not report.ok and any("plans.task" in t for t in report.tables), report
    with pytest.raises(GovernanceError, match=r"plans\.task"):
        react.resume(run_id)
    assert SENT == [] and all("Mail the whole list" not in m.content for r in model.requests for m in r.messages)


LAX = Policy.from_data(
    {
        "version": 1,
        "name": "react",
        "roles": {"staff": {"tools": ["send_note"], "scopes": ["mail:*"]}},
        "default_role": "staff",
    }
)


@pytest.mark.parametrize(
    ("query", "value"),
    [
        ("UPDATE plan_versions SET policy_hash = ? WHERE policy_hash IS NOT NULL", None),
        ("UPDATE policies SET body = ?", LAX.canonical_json()),
    ],
    ids=["its hash", "its text"],
)
def test_the_policy_a_react_run_paused_under_is_the_one_its_resume_keeps(
    tmp_path: Path, query: str, value: str | None
) -> None:
    """A resume without a policy keeps the one the run paused under: neither its name beside the pending action
    nor its stored text can be changed to shed a rule (its deny rule refuses the second note outright)."""
    again = 'Thought: and the code.\nAction: send_note {"to": "ada@example.com", "text": "the password is 1234"}'
    react, model, run_id, db = paused_react(tmp_path, again)
    tamper(db, query, (value,))
    report = verify(react.store)
    assert not report.ok and any("policy" in t for t in report.tables), report
    resumer = ReActAgent(model, REACT_CAT, react.store, user="ann")  # no policy given: the recorded one holds
    with pytest.raises(GovernanceError, match="policy"):
        resumer.resume(run_id)
    assert SENT == []


def test_a_rollback_undoes_with_the_rows_it_held_against_the_log(tmp_path: Path) -> None:
    """A trigger can change a row the moment after it was checked: the rollback undoes with the rows it checked."""
    rt, plan_id, db = halted(tmp_path)
    with closing(sqlite3.connect(db)) as conn:
        conn.execute(
            "CREATE TRIGGER swap AFTER UPDATE OF status ON plans WHEN NEW.status = 'compensating' BEGIN"
            ' UPDATE steps SET params = \'{"account":"acct-eve"}\' WHERE plan_id = NEW.id AND step_id = 1; END'
        )
    assert rt.compensate(plan_id, actor="ben", reason="undo it").undone == (1,)
    assert CALLS == ["hold:acct-bob", "release:acct-bob"]


def test_a_steps_error_is_held_against_its_failure_event(tmp_path: Path) -> None:
    """``steps.error`` is what a person reads before settling, rolling back or closing a halted plan: an error
    written there (say, that nothing happened) is named, and nothing is done."""
    rt, plan_id, db = halted(tmp_path)
    tamper(db, "UPDATE steps SET error = ? WHERE plan_id = ? AND step_id = 2", ("nothing was sent: close it", plan_id))
    report = verify(rt.store)
    assert not report.ok and any("step 2: steps.error" in t for t in report.tables), report
    with pytest.raises(GovernanceError, match=r"steps\.error"):
        rt.close_plan(plan_id, actor="ben", reason="as its error says")
    assert rt.store.get_plan(plan_id).status == "halted"  # type: ignore[union-attr]


def test_a_halt_a_run_taking_over_records_is_the_failure_the_log_records(tmp_path: Path) -> None:
    """A runner that died between a step's failure and the halt leaves the halt to whoever takes the run over,
    who records it with the step's error: under the audit key, so never an error written in the row."""
    rt, plan_id, db = cut_off(tmp_path, CAT, {"id": 1, "tool": "hold", "params": {"account": "acct-bob"}})
    at = "2026-01-01T00:00:01.000000Z"
    with rt.store.transaction():  # its call failed, as the engine records it, and then the runner died
        rt.store.finish_step(plan_id, 1, attempt=1, status="failed", output=None, error="refused", at=at, lost="")
        data = {"error": "refused", "ms": 1.0}
        rt.store.append_event(
            plan_id=plan_id, version=1, step_id=1, kind="step.failed", actor="engine", at=at, data=data
        )
    tamper(db, "UPDATE steps SET error = ? WHERE plan_id = ?", ("timed out: safe to run again", plan_id))
    with pytest.raises(GovernanceError, match=r"steps\.error"):
        rt.execute(plan_id)
    assert not [e for e in rt.store.events(plan_id) if e.kind == "run.halted"], "a halt recorded the row's error"
    assert CALLS == []


@pytest.mark.parametrize("note", ["the bank says it never arrived", None])
def test_a_settlement_is_the_error_its_row_keeps_and_no_other(tmp_path: Path, note: str | None) -> None:
    """A step settled as not done keeps the settlement as its error, in the words plangate writes it ("settled as
    not done by ben: ..."), which the log holds too: it verifies, and an edit of it does not."""
    rt, plan_id, db = cut_off(tmp_path, CAT, {"id": 1, "tool": "hold", "params": {"account": "acct-bob"}})
    assert rt.execute(plan_id).status == "halted"  # hold is not idempotent: its outcome is unknown
    rt.settle(plan_id, 1, done=False, actor="ben", note=note)
    assert verify(rt.store).ok, verify(rt.store)
    tamper(db, "UPDATE steps SET error = 'settled as done by ben' WHERE plan_id = ?", (plan_id,))
    report = verify(rt.store)
    assert not report.ok and any("step 1: steps.error" in t for t in report.tables), report


@tool
def look_up(key: str) -> str:
    """Read a public record."""
    return key


@tool
def peek(key: str) -> str:
    """Read a private record."""
    CALLS.append(f"peek:{key}")
    return key


ROLES = Policy.from_data(
    {
        "version": 1,
        "name": "roles",
        "roles": {"support": {"tools": ["look_up"]}, "operator": {"tools": ["*"]}},
        "users": {"ann": "support", "bob": "operator"},
        "default_role": "support",
        "approval": {"auto": ["lookups"]},
    }
)


def test_an_edit_is_checked_with_the_requesters_role_the_log_records(tmp_path: Path) -> None:
    """An edit is checked with the role the policy gives the plan's requester: with the requester changed in the row
    to someone whose role uses any tool, a support account's edit to a tool support may not use was approved
    automatically, and ran once the row was put back (then agreeing with the log again)."""
    CALLS.clear()
    db = tmp_path / "audit.db"
    rt = Runtime(Catalogue([look_up, peek]), ROLES, db=f"sqlite:///{db}", clock=FixedClock())
    record = rt.submit(plan({"id": 1, "tool": "look_up", "params": {"key": "a"}}, category="lookups"), "ann")
    assert record.status == "approved"
    tamper(db, "UPDATE plans SET requested_by = 'bob' WHERE id = ?", (record.id,))
    peeks = plan({"id": 1, "tool": "peek", "params": {"key": "salaries"}}, category="lookups")
    with pytest.raises(GovernanceError, match=r"may not be edited: plans\.requested_by is 'bob'"):
        rt.edit(record.id, peeks, "ann")
    tamper(db, "UPDATE plans SET requested_by = 'ann' WHERE id = ?", (record.id,))
    assert rt.execute(record.id).ok
    assert CALLS == [] and rt.store.get_plan(record.id).version == 1  # type: ignore[union-attr]


def test_a_rejection_is_recorded_only_on_a_plan_whose_rows_agree_with_the_log(tmp_path: Path) -> None:
    """A plan that ran, set back to waiting in its row, is not rejected: the log would record, under the key, a
    decision by a person on a plan that was never waiting for one."""
    db = tmp_path / "audit.db"
    rt = Runtime(Catalogue([look_up, peek]), ROLES, db=f"sqlite:///{db}", clock=FixedClock())
    record = rt.submit(plan({"id": 1, "tool": "look_up", "params": {"key": "a"}}, category="lookups"), "ann")
    assert rt.execute(record.id).ok
    tamper(db, "UPDATE plans SET status = 'pending_approval' WHERE id = ?", (record.id,))
    with pytest.raises(GovernanceError, match=r"may not be rejected: plans\.status is 'pending_approval'"):
        rt.reject(record.id, "ben", "not needed after all")
    assert not [e for e in rt.store.events(record.id) if e.kind == "plan.approval"]
