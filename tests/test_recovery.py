"""After a halt: a person settles an unknown outcome, corrects a failed step, or rolls the plan back."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from plangate import Catalogue, Policy
from plangate.cli import main
from plangate.errors import GovernanceError, StateError, UsageError
from plangate.runtime import Runtime
from plangate.store import PlanQuery
from plangate.story import tell
from tests.conftest import EXAMPLES
from tests.helpers import FixedClock, plan

REFUND_THEN_FAIL = plan(
    {"id": 1, "tool": "get_invoice", "params": {"invoice_id": "42"}},
    {"id": 2, "tool": "issue_refund", "params": {"invoice_id": "42", "amount": 20.0}},
    {"id": 3, "tool": "issue_refund", "params": {"invoice_id": "43", "amount": 5000.0}},
    category="refunds",
)


@pytest.fixture
def rt(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> Runtime:
    return Runtime(
        catalogue, policy, db=f"sqlite:///{tmp_path}/r.db", clock=FixedClock(), tools=str(EXAMPLES / "business.py")
    )


def halted(rt: Runtime, data: dict[str, Any]) -> str:
    record = rt.submit(data, "bob")
    rt.approve(record.id, "dave", record.hash)
    result = rt.execute(record.id)
    assert result.status == "halted"
    return record.id


def test_correct_one_failed_step_and_resume_without_rerunning(rt: Runtime) -> None:
    from examples import business

    plan_id = halted(rt, REFUND_THEN_FAIL)
    assert business.effect_counts() == {"refund": 1}
    changed_done = dict(REFUND_THEN_FAIL, steps=[dict(s) for s in REFUND_THEN_FAIL["steps"]])
    changed_done["steps"][1]["params"] = {"invoice_id": "42", "amount": 21.0}
    with pytest.raises(StateError, match="step 2 already ran"):
        rt.edit(plan_id, changed_done, "carol")
    corrected = dict(REFUND_THEN_FAIL, steps=[dict(s) for s in REFUND_THEN_FAIL["steps"]])
    corrected["steps"][2]["params"] = {"invoice_id": "43", "amount": 50.0}
    record = rt.edit(plan_id, corrected, "carol")
    assert (record.version, record.status) == (2, "pending_approval")
    rt.approve(plan_id, "dave", record.hash)
    result = rt.execute(plan_id)
    assert result.ok and result.ran == (3,), "what succeeded is kept, only the corrected step runs"
    assert business.effect_counts() == {"refund": 2}


def test_compensation_undoes_completed_steps_in_reverse(rt: Runtime) -> None:
    from examples import business

    plan_id = halted(rt, REFUND_THEN_FAIL)
    with pytest.raises(Exception, match="say why"):
        rt.compensate(plan_id, actor="dave", reason=" ")
    result = rt.compensate(plan_id, actor="dave", reason="the customer cancelled")
    assert result.status == "compensated" and result.undone == (2,)
    assert business.effect_counts() == {"refund": 1, "void": 1}
    assert rt.get(plan_id).status == "compensated"
    undo = rt.store.steps(plan_id)[-2]
    assert undo.idempotency_key == f"{plan_id}:undo:2" and undo.params["refund_id"].startswith("r-42-2-")
    with pytest.raises(StateError, match="only a halted plan"):
        rt.compensate(plan_id, actor="dave", reason="again")
    kinds = [e.kind for e in rt.trace(plan_id)]
    assert kinds[-3:] == ["compensation.step_started", "compensation.step_succeeded", "compensation.finished"]


def test_steps_that_cannot_be_undone_are_listed(rt: Runtime) -> None:
    from examples import business

    data = plan(
        {"id": 1, "tool": "issue_refund", "params": {"invoice_id": "42", "amount": 20.0}},
        {
            "id": 2,
            "tool": "send_email",
            "params": {"to": "ada@example.com", "subject": "s", "body": "b"},
            "condition": "${1.amount} > 0",
        },
        {"id": 3, "tool": "issue_refund", "params": {"invoice_id": "43", "amount": 5000.0}, "condition": "${2} != ''"},
        category="refunds",
    )
    plan_id = halted(rt, data)
    result = rt.compensate(plan_id, actor="dave", reason="wrong customer")
    assert result.status == "compensation_incomplete" and result.undone == (1,)
    assert result.not_undoable == ((2, "send_email (irreversible) declares no compensating tool"),)
    assert business.effect_counts() == {"refund": 1, "email": 1, "void": 1}
    assert "cannot be undone by plangate" in str(result)


def test_the_policy_can_roll_back_on_halt(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> None:
    from examples import business

    rolling = policy.model_copy(update={"compensation": policy.compensation.model_copy(update={"on_halt": "auto"})})
    rt = Runtime(catalogue, rolling, db=f"sqlite:///{tmp_path}/a.db", clock=FixedClock())
    plan_id = halted(rt, REFUND_THEN_FAIL)
    assert rt.get(plan_id).status == "compensated"
    assert business.effect_counts() == {"refund": 1, "void": 1}


def test_settling_an_unknown_outcome_on_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_crash import approved_plan, kill_during_step, ledger

    monkeypatch.setenv("CRASH_DIR", str(tmp_path))
    monkeypatch.setenv("CRASH_LEDGER", str(tmp_path / "ledger.db"))
    monkeypatch.setenv("PLANGATE_DB", f"sqlite:///{tmp_path}/plangate.db")
    rt, plan_id = approved_plan(tmp_path)
    kill_during_step(tmp_path, plan_id, 4)
    assert rt.resume(plan_id).failed_step == 4
    runner = CliRunner()
    done = runner.invoke(
        main,
        ["settle", plan_id, "4", "--done", "--output", "4", "--as", "dave", "--note", "the message is in the outbox"],
    )
    assert done.exit_code == 0, done.output
    result = rt.resume(plan_id)
    assert result.ok and result.ran == (5,)
    calls, _, sends = ledger()
    assert calls[4] == 1 and sends == {4: 1}, "settled as done: never sent again"
    settled = next(e for e in rt.trace(plan_id) if e.kind == "step.settled")
    assert settled.actor == "dave" and settled.data["note"] == "the message is in the outbox"


def test_settled_as_not_done_runs_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_crash import approved_plan, kill_during_step, ledger

    monkeypatch.setenv("CRASH_DIR", str(tmp_path))
    monkeypatch.setenv("CRASH_LEDGER", str(tmp_path / "ledger.db"))
    rt, plan_id = approved_plan(tmp_path)
    kill_during_step(tmp_path, plan_id, 4)
    rt.resume(plan_id)
    with pytest.raises(StateError, match="outcome is unknown: settle it first"):
        rt.edit(
            plan_id,
            {
                "task": "t",
                "category": "ops",
                "steps": [{"id": 1, "tool": "apply_once", "params": {"n": 1}, "rationale": "r"}],
            },
            "carol",
        )
    rt.settle(plan_id, 4, done=False, actor="dave", note="nothing arrived")
    result = rt.resume(plan_id)
    assert result.ok and result.ran == (4, 5)
    assert ledger()[2] == {4: 2}, "the person said it did not happen, so it ran again"


def test_a_halted_plan_is_closed_for_good_with_who_and_why(rt: Runtime) -> None:
    from examples import business

    plan_id = halted(rt, REFUND_THEN_FAIL)
    with pytest.raises(UsageError, match="say why"):
        rt.close_plan(plan_id, actor="dave", reason=" ")
    with pytest.raises(GovernanceError, match=r"bob requested plan .* and may not close it"):
        rt.close_plan(plan_id, actor="bob", reason="not needed")
    record = rt.close_plan(plan_id, actor="dave", reason="the customer was refunded by hand")
    assert record.status == "closed" and rt.get(plan_id).status == "closed"
    assert business.effect_counts() == {"refund": 1}, "closing undoes nothing and runs nothing"
    closing = rt.trace(plan_id)[-1]
    assert (closing.kind, closing.actor) == ("plan.closed", "dave")
    assert closing.data == {
        "reason": "the customer was refunded by hand",
        "transition": {"from": "halted", "to": "closed"},
    }
    said = "was closed by dave at .*: 'the customer was refunded by hand'; it cannot"
    for attempt in (
        lambda: rt.resume(plan_id),
        lambda: rt.execute(plan_id),
        lambda: rt.approve(plan_id, "carol", rt.get(plan_id).hash),
        lambda: rt.reject(plan_id, "carol", "no"),
        lambda: rt.edit(plan_id, REFUND_THEN_FAIL | {"task": "again"}, "carol"),
        lambda: rt.compensate(plan_id, actor="dave", reason="undo after all"),
        lambda: rt.settle(plan_id, 3, done=False, actor="dave"),
        lambda: rt.close_plan(plan_id, actor="dave", reason="twice"),
        lambda: rt.start(plan_id, actor="engine"),
    ):
        with pytest.raises(StateError, match=said):
            attempt()
    assert business.effect_counts() == {"refund": 1}
    from plangate import ledger

    assert ledger.verify(rt.store).ok


def test_only_a_halted_plan_with_known_outcomes_is_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_crash import approved_plan, kill_during_step

    monkeypatch.setenv("CRASH_DIR", str(tmp_path))
    monkeypatch.setenv("CRASH_LEDGER", str(tmp_path / "ledger.db"))
    rt, plan_id = approved_plan(tmp_path)
    with pytest.raises(StateError, match="is approved; only a halted plan can be closed"):
        rt.close_plan(plan_id, actor="dave", reason="r")
    kill_during_step(tmp_path, plan_id, 4)
    rt.resume(plan_id)
    with pytest.raises(StateError, match="step 4's outcome is unknown: settle it first"):
        rt.close_plan(plan_id, actor="dave", reason="r")
    rt.settle(plan_id, 4, done=True, output=4, actor="dave", note="sent")
    assert rt.close_plan(plan_id, actor="dave", reason="step 5 is not needed").status == "closed"


def test_a_rollback_that_could_not_undo_everything_may_be_closed(rt: Runtime) -> None:
    data = plan(
        {"id": 1, "tool": "issue_refund", "params": {"invoice_id": "42", "amount": 20.0}},
        {"id": 2, "tool": "send_email", "params": {"to": "ada@example.com", "subject": "s", "body": "b"}},
        {"id": 3, "tool": "issue_refund", "params": {"invoice_id": "43", "amount": 5000.0}},
        category="refunds",
    )
    plan_id = halted(rt, data)
    assert rt.compensate(plan_id, actor="dave", reason="wrong customer").status == "compensation_incomplete"
    record = rt.close_plan(plan_id, actor="dave", reason="apologised to the customer for the email")
    assert record.status == "closed"
    assert "CLOSED: 'apologised to the customer for the email'" in "\n".join(tell(rt.trace(plan_id)))


def test_an_edit_is_held_against_the_policy_the_plan_was_under(
    tmp_path: Path, catalogue: Catalogue, policy: Policy
) -> None:
    """An edit through a runtime given no policy (a command line without --policy) keeps the plan's policy."""
    db = f"sqlite:///{tmp_path}/p.db"
    record = Runtime(catalogue, policy, db=db, clock=FixedClock()).submit(REFUND_THEN_FAIL, "bob")
    edited = dict(REFUND_THEN_FAIL, task="refund a little less")
    again = Runtime(catalogue, None, db=db, clock=FixedClock()).edit(record.id, edited, "bob")
    assert again.decision is not None and again.decision["policy"] == policy.name
    assert again.decision["policy_hash"] == policy.hash


def test_a_closed_plan_is_stored_and_listed_on_every_store(any_db: str, catalogue: Catalogue, policy: Policy) -> None:
    """The status is text with no constraint in SQLite and PostgreSQL alike: closing needs no migration."""
    from plangate import ledger

    rt = Runtime(catalogue, policy, db=any_db, clock=FixedClock())
    plan_id = halted(rt, REFUND_THEN_FAIL)
    rt.close_plan(plan_id, actor="dave", reason="done by hand")
    assert [row.id for row in rt.list_plans(PlanQuery(status="closed"))] == [plan_id]
    assert ledger.verify(rt.store).ok
    rt.close()


# -- an undo cut off with no outcome ------------------------------------------------------------
_CHARGE_TOOLS = """
from contextlib import closing
from pathlib import Path
from plangate import tool

CALLS = Path(__file__).with_name("calls.txt")


def _said(line):
    with CALLS.open("a") as f:
        f.write(line + "\\n")


@tool(effect="write", compensate="refund_charge")
def charge(amount: int) -> dict:
    _said(f"charge {amount}")
    return {"charge_id": f"c{amount}"}


@tool(effect="write")  # not idempotent: a cut-off call is a person's to check
def refund_charge(charge_id: str) -> str:
    _said(f"refund {charge_id}")
    return f"refunded {charge_id}"


@tool(effect="write")
def fail(n: int) -> int:
    raise RuntimeError("the second call fails")
"""


def _calls(folder: Path) -> list[str]:
    return (folder / "calls.txt").read_text().splitlines()


def _undo_cut_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str = "u.db", *, again: bool = True
) -> tuple[Runtime, str, str]:
    """A halted plan whose rollback called the undo of step 1 and died before recording its outcome,
    then was run again: the undo (not idempotent) left for a person. The runtime, the plan, the store."""
    import sqlite3

    tmp_path.mkdir(parents=True, exist_ok=True)
    tools = tmp_path / "charges.py"
    tools.write_text(_CHARGE_TOOLS)
    db = f"sqlite:///{tmp_path}/{name}"
    rt = Runtime(Catalogue.from_module(tools), db=db, clock=FixedClock(), tools=str(tools))
    record = rt.submit(
        plan({"id": 1, "tool": "charge", "params": {"amount": 5}}, {"id": 2, "tool": "fail", "params": {"n": 1}}),
        "bob",
    )
    rt.approve(record.id, "dave", record.hash)
    assert rt.execute(record.id).status == "halted"
    put_step = rt.store.put_step

    def cut_off(row: Any) -> None:  # the undo's call returns, and the process dies before its outcome
        if row.step_id < 0 and row.status == "succeeded":
            raise SystemExit("killed")
        put_step(row)

    with monkeypatch.context() as patched:
        patched.setattr(rt.store, "put_step", cut_off)
        with pytest.raises(SystemExit):
            rt.compensate(record.id, actor="dave", reason="the customer cancelled")
    assert _calls(tmp_path) == ["charge 5", "refund c5"]
    with sqlite3.connect(f"{tmp_path}/{name}") as conn:  # the dead rollback's lease runs out
        conn.execute("UPDATE plans SET lease_until = '2000-01-01T00:00:00.000000Z' WHERE id = ?", (record.id,))
    if not again:
        return rt, record.id, db
    second = rt.compensate(record.id, actor="dave", reason="again")
    assert second.status == "compensation_incomplete" and "--undo" in second.failed[0][1]
    assert _calls(tmp_path) == ["charge 5", "refund c5"], "the undo is not called again on its own"
    return rt, record.id, db


def test_an_undo_cut_off_with_no_outcome_is_settled_as_done_then_the_rollback_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rollback's call that stopped before its outcome was recorded (its undo tool not idempotent)
    left the rollback incomplete for good: the undo could not be settled (a raw KeyError), and
    closing waited for its outcome for ever. A person now settles it, on the command line too."""
    rt, plan_id, db = _undo_cut_off(tmp_path, monkeypatch)
    with closing(rt):
        with pytest.raises(StateError, match="outcome is unknown"):
            rt.close_plan(plan_id, actor="dave", reason="done with it")
        with pytest.raises(StateError, match=r"the undo of step 2 .* no unknown outcome"):
            rt.settle(plan_id, -2, done=True, actor="dave")
        args = ["settle", plan_id, "1", "--undo", "--done", "--output", '"refunded c5"', "--as", "dave", "--db", db]
        args += ["--tools", str(tmp_path / "charges.py")]
        out = CliRunner().invoke(main, args, catch_exceptions=False)
        assert out.exit_code == 0, out.output
        assert "the undo of step 1 settled as done" in out.output
        assert rt.store.steps(plan_id)[-1].status == "succeeded"
        assert any("the undo of step 1 (refund_charge) SETTLED" in line for line in tell(rt.trace(plan_id)))
        assert rt.compensate(plan_id, actor="dave", reason="finish it").status == "compensated"
        assert _calls(tmp_path) == ["charge 5", "refund c5"], "undone once"
        assert rt.store.verify_audit().ok


def test_an_undo_settled_as_not_done_is_called_again_and_a_settled_rollback_may_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt, plan_id, _ = _undo_cut_off(tmp_path, monkeypatch)
    with closing(rt):
        rt.settle(plan_id, -1, done=False, actor="dave", note="the bank shows no refund")
        assert rt.compensate(plan_id, actor="dave", reason="once more").status == "compensated"
        assert _calls(tmp_path) == ["charge 5", "refund c5", "refund c5"], "called again: it did not happen"
        assert rt.store.verify_audit().ok
    rt, plan_id, _ = _undo_cut_off(tmp_path / "second", monkeypatch)
    with closing(rt):
        rt.settle(plan_id, -1, done=True, actor="dave", output="refunded c5")
        assert rt.close_plan(plan_id, actor="dave", reason="checked by hand").status == "closed"


def _rolled_back(tmp_path: Path, undo_source: str) -> tuple[Runtime, str, Any]:
    """A halted plan whose step 1 (``charge``) is undone by the ``undo`` tool written in ``undo_source``,
    rolled back once: the runtime, the plan, and the rollback's result."""
    tools = tmp_path / "undo_tools.py"
    tools.write_text(
        "import asyncio, time\nfrom plangate import tool\n\n"
        "@tool(effect='write', compensate='undo')\ndef charge(amount: int) -> dict:\n"
        "    return {'charge_id': f'c{amount}'}\n\n"
        "@tool(effect='write')\ndef fail(n: int) -> int:\n    raise RuntimeError('no')\n\n" + undo_source
    )
    rt = Runtime(Catalogue.from_module(tools), db=f"sqlite:///{tmp_path}/c.db", clock=FixedClock(), tools=str(tools))
    record = rt.submit(
        plan({"id": 1, "tool": "charge", "params": {"amount": 3}}, {"id": 2, "tool": "fail", "params": {"n": 1}}),
        "bob",
    )
    rt.approve(record.id, "dave", record.hash)
    assert rt.execute(record.id).status == "halted"
    return rt, record.id, rt.compensate(record.id, actor="dave", reason="cancelled")


def test_an_async_compensating_tool_is_awaited(tmp_path: Path) -> None:
    """A compensating tool written async (as an MCP server's tools are) was called and never awaited:
    its coroutine failed the output's type, and the step was never undone."""
    rt, plan_id, result = _rolled_back(
        tmp_path,
        "@tool(effect='write')\nasync def undo(charge_id: str) -> str:\n"
        "    await asyncio.sleep(0)\n    return f'refunded {charge_id}'\n",
    )
    with closing(rt):
        assert result.status == "compensated" and result.undone == (1,)
        assert rt.store.steps(plan_id)[-1].output == "refunded c3"


def test_a_compensating_tool_that_raises_system_exit_fails_its_undo_and_ends_nothing_else(tmp_path: Path) -> None:
    rt, plan_id, result = _rolled_back(
        tmp_path, "@tool(effect='write')\ndef undo(charge_id: str) -> str:\n    raise SystemExit(3)\n"
    )
    with closing(rt):
        assert result.status == "compensation_incomplete" and "SystemExit" in result.failed[0][1]
        assert rt.store.steps(plan_id)[-1].status == "failed"
        assert rt.store.verify_audit().ok


def test_a_compensating_call_that_overruns_its_limit_is_left_for_a_person_to_settle(tmp_path: Path) -> None:
    """Not idempotent: it may have happened. Its outcome is left unknown, and a person settles it."""
    rt, plan_id, result = _rolled_back(
        tmp_path,
        "@tool(effect='write', timeout=0.2)\ndef undo(charge_id: str) -> str:\n    time.sleep(5)\n    return 'late'\n",
    )
    with closing(rt):
        assert result.status == "compensation_incomplete"
        assert "timed out after 0.2 s" in result.failed[0][1] and "--undo" in result.failed[0][1]
        assert rt.store.steps(plan_id)[-1].status == "started"
        rt.settle(plan_id, -1, done=False, actor="dave", note="the bank shows nothing")
        assert rt.store.steps(plan_id)[-1].status == "failed"


def test_a_worker_carries_on_a_rollback_the_policy_began_once_its_runner_stopped(
    tmp_path: Path, catalogue: Catalogue, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``compensation.on_halt: auto``: the policy's rollback was cut off (its process stopped after an
    undo's call, before its outcome) and stayed ``compensating`` until a person ran it again. A worker
    now carries it on once its lease ran out: the undo, idempotent, again under the same key."""
    import sqlite3

    from examples import business

    from plangate.worker import Worker

    rolling = policy.model_copy(update={"compensation": policy.compensation.model_copy(update={"on_halt": "auto"})})
    db = f"sqlite:///{tmp_path}/w.db"
    rt = Runtime(catalogue, rolling, db=db, clock=FixedClock())
    put_step = rt.store.put_step

    def cut_off(row: Any) -> None:
        if row.step_id < 0 and row.status == "succeeded":
            raise SystemExit("killed")
        put_step(row)

    with closing(rt), monkeypatch.context() as patched:
        patched.setattr(rt.store, "put_step", cut_off)
        record = rt.submit(REFUND_THEN_FAIL, "bob")
        rt.approve(record.id, "dave", record.hash)
        with pytest.raises(SystemExit):
            rt.execute(record.id)
    with sqlite3.connect(f"{tmp_path}/w.db") as conn:
        status, owner = conn.execute("SELECT status, lease_owner FROM plans WHERE id = ?", (record.id,)).fetchone()
        assert status == "compensating" and owner.startswith(f"policy:{rolling.name}#")
        conn.execute("UPDATE plans SET lease_until = '2000-01-01T00:00:00.000000Z' WHERE id = ?", (record.id,))
    assert business.effect_counts() == {"refund": 1, "void": 1}
    worker = Worker(catalogue, db=db, policy=rolling)
    try:
        worker.serve(drain=True, poll=0.05)
    finally:
        worker.close()
    check = Runtime(catalogue, rolling, db=db, clock=FixedClock())
    with closing(check):
        assert check.get(record.id).status == "compensated"
        assert business.effect_counts() == {"refund": 1, "void": 1}, "called again under the same key: voided once"
        starts = [e for e in check.trace(record.id) if e.kind == "compensation.started"]
        assert [e.actor for e in starts] == [f"policy:{rolling.name}"] * 2
        assert check.store.verify_audit().ok


def test_a_worker_leaves_a_rollback_a_person_began_to_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rollback a person began and whose runner stopped is theirs to run again: the policy does not
    carry it on, and a worker does not touch it."""
    from plangate.worker import Worker

    rt, plan_id, db = _undo_cut_off(tmp_path, monkeypatch, again=False)  # dave's rollback, cut off
    with closing(rt):
        assert rt.get(plan_id).status == "compensating"
        with pytest.raises(GovernanceError, match="begun by dave"):
            rt.carry_on_rollback(plan_id)
    worker = Worker(Catalogue.from_module(tmp_path / "charges.py"), db=db)
    try:
        worker.serve(drain=True, poll=0.05)
    finally:
        worker.close()
    check = Runtime(Catalogue.from_module(tmp_path / "charges.py"), db=db, clock=FixedClock())
    with closing(check):
        assert check.get(plan_id).status == "compensating"
    assert _calls(tmp_path) == ["charge 5", "refund c5"], "the undo is not called again"
