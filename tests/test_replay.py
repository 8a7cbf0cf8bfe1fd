"""Replay: the engine's decisions made again over recorded outputs, held against the audit log, no tool called."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from plangate import Catalogue, Policy, tool
from plangate.cli import main
from plangate.errors import GovernanceError, NotFoundError, UsageError
from plangate.runtime import Runtime
from tests.helpers import FixedClock, plan

CALLS: list[str] = []
BROKEN: set[str] = set()


@tool
def get_invoice(invoice_id: str) -> dict[str, Any]:
    """An invoice: its total and its customer."""
    CALLS.append(f"get_invoice:{invoice_id}")
    if invoice_id in BROKEN:
        raise LookupError(f"no invoice {invoice_id}")
    return {"total": 20.0, "customer": f"c-{invoice_id}"}


@tool(effect="write", compensate="void_refund")
def refund(invoice_id: str, amount: float) -> dict[str, Any]:
    """Refund an invoice."""
    CALLS.append(f"refund:{invoice_id}:{amount}")
    if invoice_id in BROKEN:
        raise RuntimeError("the bank refused it")
    return {"refund_id": f"r-{invoice_id}", "amount": amount}


@tool(effect="write")
def void_refund(refund_id: str) -> str:
    """Undo a refund."""
    CALLS.append(f"void_refund:{refund_id}")
    return refund_id


@tool(effect="irreversible", external=True)
def notify(to: str, text: str) -> str:
    """Tell the customer."""
    CALLS.append(f"notify:{to}")
    return text


CAT = Catalogue([get_invoice, refund, void_refund, notify])
POLICY = Policy.from_yaml("version: 1\nname: p\napproval: {human: [ops]}\n")
TOOLS = "tests.test_replay"

REFUND = plan(
    {"id": 1, "tool": "get_invoice", "params": {"invoice_id": "42"}},
    {"id": 2, "tool": "refund", "params": {"invoice_id": "42", "amount": "${1.total}"}, "condition": "${1.total} > 10"},
    {"id": 3, "tool": "notify", "params": {"to": "${1.customer}", "text": "refunded ${2.amount}"}},
    {"id": 4, "tool": "notify", "params": {"to": "${1.customer}", "text": "small"}, "condition": "${1.total} < 10"},
)


@pytest.fixture
def rt(tmp_path: Path) -> Runtime:
    CALLS.clear()
    BROKEN.clear()
    return Runtime(CAT, POLICY, db=f"sqlite:///{tmp_path}/replay.db", clock=FixedClock(), tools=TOOLS)


def approved(rt: Runtime, body: dict[str, Any] = REFUND) -> str:
    record = rt.submit(body, "ann")
    return rt.approve(record.id, "ben", record.hash).id


def executed(rt: Runtime, body: dict[str, Any] = REFUND) -> str:
    plan_id = approved(rt, body)
    rt.execute(plan_id)
    return plan_id


def sql(rt: Runtime, statement: str, params: tuple[object, ...] = ()) -> None:
    with sqlite3.connect(rt.store.url.removeprefix("sqlite:///")) as conn:
        conn.execute(statement, params)


def cli(rt: Runtime, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, [*args, "--db", rt.store.url])
    return result.exit_code, result.stdout, result.stderr


def test_a_succeeded_run_replays_exactly_and_calls_no_tool(rt: Runtime) -> None:
    plan_id = executed(rt)
    CALLS.clear()
    result = rt.replay(plan_id)
    assert result.ok, result
    assert (result.runs, result.decisions) == (1, 4)  # three started, one skipped by its condition
    assert CALLS == []
    code, out, _ = cli(rt, "replay", plan_id[:8])
    assert code == 0 and "1 run(s), 4 decision(s) replayed: every one matches the record" in out
    assert CALLS == []


def test_a_halted_run_replays_with_its_halt(rt: Runtime) -> None:
    BROKEN.add("42")
    plan_id = executed(rt)
    assert rt.get(plan_id).status == "halted"
    result = rt.replay(plan_id)
    assert result.ok and result.runs == 1 and result.decisions == 1, result


def test_a_resumed_run_replays_each_run_over_the_outputs_before_it(rt: Runtime) -> None:
    body = plan(
        {"id": 1, "tool": "get_invoice", "params": {"invoice_id": "7"}},
        {"id": 2, "tool": "refund", "params": {"invoice_id": "42", "amount": "${1.total}"}},
        {"id": 3, "tool": "notify", "params": {"to": "${1.customer}", "text": "refunded ${2.refund_id}"}},
    )
    BROKEN.add("42")
    plan_id = executed(rt, body)
    assert rt.get(plan_id).status == "halted"
    BROKEN.clear()  # the cause is fixed
    assert rt.resume(plan_id).ok
    result = rt.replay(plan_id)
    assert result.ok and result.runs == 2 and result.decisions == 4, result


def test_an_optional_failure_is_read_as_null(rt: Runtime) -> None:
    body = plan(
        {"id": 1, "tool": "get_invoice", "params": {"invoice_id": "42"}, "on_failure": "continue"},
        {"id": 2, "tool": "notify", "params": {"to": "ops", "text": "total: ${1.total}"}, "condition": "${1} != null"},
        {"id": 3, "tool": "notify", "params": {"to": "ops", "text": "no invoice"}, "condition": "${1} == null"},
    )
    BROKEN.add("42")
    plan_id = executed(rt, body)
    assert rt.get(plan_id).status == "succeeded"
    result = rt.replay(plan_id)
    assert result.ok and result.decisions == 3, result  # 1 started, 2 skipped (null), 3 started


def test_a_rollback_replays_its_undo_parameters(rt: Runtime) -> None:
    body = plan(
        {"id": 1, "tool": "refund", "params": {"invoice_id": "41", "amount": 5.0}},
        {"id": 2, "tool": "refund", "params": {"invoice_id": "42", "amount": 6.0}},
    )
    BROKEN.add("42")
    plan_id = executed(rt, body)
    assert rt.compensate(plan_id, actor="ben", reason="the customer cancelled").status == "compensated"
    result = rt.replay(plan_id)
    assert result.ok and result.decisions == 3, result


def test_an_output_changed_in_the_database_is_a_divergence(rt: Runtime) -> None:
    plan_id = executed(rt)
    sql(rt, "UPDATE steps SET output = ? WHERE plan_id = ? AND step_id = 1", ('{"total": 900.0}', plan_id))
    result = rt.replay(plan_id)
    assert not result.ok
    assert "step 1: steps.output differs" in str(result.divergences[0]), result
    code, out, _ = cli(rt, "replay", plan_id)
    assert code == 1 and "first divergence: plan: stored rows" in out and "step 1: steps.output differs" in out


def test_a_changed_event_refuses_the_replay(rt: Runtime) -> None:
    plan_id = executed(rt)
    sql(rt, "UPDATE events SET data = replace(data, '20.0', '900.0') WHERE kind = 'step.succeeded'")
    with pytest.raises(GovernanceError, match="audit events do not verify"):
        rt.replay(plan_id)


def test_a_new_deny_rule_would_have_refused_the_refund(rt: Runtime, tmp_path: Path) -> None:
    plan_id = executed(rt)
    strict = tmp_path / "strict.yaml"
    strict.write_text(
        "version: 1\nname: strict\napproval: {human: [ops]}\n"
        "deny:\n  - name: no-c42\n    tools: [notify]\n    params: [to]\n    pattern: 'c-42'\n"
    )
    result = rt.replay(plan_id, policy=Policy.load(strict))
    policy = [d for d in result.divergences if d.what == "policy"]
    assert policy and policy[0].step == 3, result
    assert policy[0].detail == "would have been refused by deny:no-c42 at step 3"
    code, out, _ = cli(rt, "replay", plan_id, "--policy", str(strict), "--json")
    assert code == 1
    report = json.loads(out)
    assert report["against"] == [f"policy {strict}"] and not report["ok"]
    assert any("would have been refused by deny:no-c42 at step 3" in d["text"] for d in report["divergences"])
    code, out, _ = cli(rt, "replay", plan_id, "--policy", str(strict))
    assert code == 1 and "first divergence: step 3 (run 1): policy: recorded started" in out


def test_changed_tools_name_the_parameter_that_no_longer_validates_and_the_approval(
    rt: Runtime, tmp_path: Path
) -> None:
    plan_id = executed(rt)
    changed = tmp_path / "changed_tools.py"
    changed.write_text(
        "from typing import Any\nfrom plangate import tool\n\n"
        "@tool(effect='write')\ndef get_invoice(invoice_id: int) -> dict[str, Any]:\n"
        "    '''Now a number, and it writes.'''\n    return {}\n\n"
        "@tool(effect='write')\ndef refund(invoice_id: str, amount: float) -> dict[str, Any]:\n"
        "    '''Refund.'''\n    return {}\n\n"
        "@tool(effect='irreversible', external=True)\ndef notify(to: str, text: str) -> str:\n"
        "    '''Tell.'''\n    return text\n"
    )
    code, out, _ = cli(rt, "replay", plan_id, "--tools", str(changed), "--json")
    assert code == 1, out
    found = {(d["step"], d["what"]) for d in json.loads(out)["divergences"]}
    assert (1, "refusal") in found, found  # "42" is no longer a valid invoice_id
    assert (None, "check") in found


def test_bad_input_exits_2(rt: Runtime) -> None:
    plan_id = approved(rt)
    with pytest.raises(UsageError, match="never ran"):
        rt.replay(plan_id)
    with pytest.raises(NotFoundError):
        rt.replay("no-such-plan")
    code, _, err = cli(rt, "replay", plan_id)
    assert code == 2 and "never ran" in err
    code, _, err = cli(rt, "replay", "0000000000")
    assert code == 2 and "no plan" in err


def test_replay_help_says_what_it_does() -> None:
    out = CliRunner().invoke(main, ["replay", "--help"]).output
    assert "calling no tool" in out and "--policy" in out and "--tools" in out
