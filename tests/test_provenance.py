"""Provenance of values: where each parameter comes from, the policy's sink rules, the trace and the review."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from typing_extensions import TypedDict

from plangate import Catalogue, Plan, Policy, check, tool
from plangate._decide import decide
from plangate.cli import main
from plangate.provenance import analyse
from plangate.runtime import Runtime
from tests.helpers import FixedClock, plan
from tests.serverkit import api, browser, setup


class Bill(TypedDict):
    payee: str
    iban: str
    amount: float


@tool(untrusted_output=True)
def read_bill(path: str) -> Bill:
    """A bill as its sender wrote it."""
    return {"payee": "City Power", "iban": "XX00 ATTACKER", "amount": 84.2}


@tool
def payee_iban(payee: str) -> str:
    """The IBAN on file."""
    return "XX00 ONFILE"


@tool(inherits_provenance=True)
def extract_iban(text: str) -> str:
    """Pull an IBAN out of text (its output is its input's)."""
    return text.rsplit(maxsplit=1)[-1]


@tool
def summarise(text: str) -> str:
    """A trusted tool that does not pass provenance on."""
    return text[:10]


@tool(effect="irreversible", external=True)
def pay_bill(iban: str, amount: float, reference: str = "") -> str:
    """Pay a bill."""
    return f"paid {amount} to {iban}"


@tool(effect="write", external=True)
def send_email(to: str, body: str) -> str:
    """Send an email."""
    return "sent"


@tool(effect="write")
def file_note(text: str) -> str:
    """An internal note."""
    return "noted"


CAT = Catalogue([read_bill, payee_iban, extract_iban, summarise, pay_bill, send_email, file_note])
READ = {"id": 1, "tool": "read_bill", "params": {"path": "march.txt"}}
PAY = plan(READ, {"id": 2, "tool": "pay_bill", "params": {"iban": "${1.iban}", "amount": 10, "reference": "r"}})


def policy(sinks: str = "", extra: str = "") -> Policy:
    return Policy.from_yaml(f"version: 1\nname: p\n{extra}" + (f"sinks:\n{sinks}" if sinks else ""))


def flows(body: dict[str, Any]) -> Any:
    return analyse(Plan.parse(body), CAT)


# -- where values come from -------------------------------------------------------------------


def test_a_whole_reference_and_a_field_path_keep_the_steps_sources() -> None:
    found = flows(plan(READ, {"id": 2, "tool": "pay_bill", "params": {"iban": "${1.iban}", "amount": "${1}"}}))
    step = found.of(2)
    assert step.params["iban"].sources == ("step:1",) and step.params["iban"].refs == ("${1.iban}",)
    assert step.params["amount"].sources == ("step:1",)
    assert step.untrusted_params == ("iban", "amount")
    assert step.params["iban"].untrusted[0].describe() == "step 1 (untrusted: read_bill)"


def test_interpolated_text_comes_from_the_plan_and_the_step() -> None:
    body = plan(READ, {"id": 2, "tool": "send_email", "params": {"to": "ops@x", "body": "Pay ${1.iban} now"}})
    step = flows(body).of(2)
    assert step.params["body"].sources == ("plan", "step:1")
    assert "to" not in step.params  # plain plan text is not listed
    nested = plan(READ, {"id": 2, "tool": "summarise", "params": {"text": "${1.payee}"}})
    assert flows(nested).of(2).params["text"].sources == ("step:1",)


def test_a_trusted_tool_gives_trusted_data() -> None:
    body = plan(
        {"id": 1, "tool": "payee_iban", "params": {"payee": "City Power"}},
        {"id": 2, "tool": "pay_bill", "params": {"iban": "${1}", "amount": 1}},
    )
    step = flows(body).of(2)
    assert step.params["iban"].sources == ("step:1",) and step.untrusted_params == ()


def test_a_condition_over_untrusted_data_makes_the_step_control_dependent() -> None:
    guarded = {"id": 2, "tool": "file_note", "params": {"text": "big bill"}, "condition": "${1.amount} > 50"}
    step = flows(plan(READ, guarded)).of(2)
    assert step.params == {} and [o.source for o in step.untrusted_control] == ["step:1"]
    assert step.data() == {"provenance": {}, "control": ["step:1"]}


def test_a_tool_that_inherits_provenance_passes_its_inputs_sources_on() -> None:
    body = plan(
        READ,
        {"id": 2, "tool": "extract_iban", "params": {"text": "${1.iban}"}},
        {"id": 3, "tool": "pay_bill", "params": {"iban": "${2}", "amount": 1}},
    )
    iban = flows(body).of(3).params["iban"]
    assert iban.sources == ("step:1", "step:2")
    assert [o.describe() for o in iban.untrusted] == [
        "step 1 (untrusted: read_bill)",
        "step 2 (untrusted: extract_iban)",
    ]
    trusted = plan(
        {"id": 1, "tool": "payee_iban", "params": {"payee": "p"}},
        {"id": 2, "tool": "extract_iban", "params": {"text": "${1}"}},
        {"id": 3, "tool": "pay_bill", "params": {"iban": "${2}", "amount": 1}},
    )
    assert flows(trusted).of(3).untrusted_params == ()  # an extractor over trusted text gives trusted data
    laundered = plan(
        READ,
        {"id": 2, "tool": "summarise", "params": {"text": "${1.iban}"}},
        {"id": 3, "tool": "pay_bill", "params": {"iban": "${2}", "amount": 1}},
    )
    assert flows(laundered).of(3).untrusted_params == ()  # without the flag a tool's output is its own


# -- sink rules --------------------------------------------------------------------------------


def test_deny_refuses_the_plan_with_its_own_rule_name() -> None:
    rule = "  - {name: payee, tools: [pay_bill], params: [iban], untrusted: deny, message: never from a bill}\n"
    result = check(PAY, CAT, policy(rule))
    assert [str(v) for v in result.violations] == [
        "step 2: sink:payee: step 2 (pay_bill) parameter 'iban' takes data from step 1 (untrusted: read_bill) "
        "through ${1.iban}: never from a bill"
    ]


def test_deny_is_held_again_just_before_the_call() -> None:
    body = Plan.parse(PAY)
    strict = policy("  - {name: payee, tools: [pay_bill], untrusted: deny}\n")
    flow = analyse(body, CAT).of(2)
    outputs = {1: {"payee": "p", "iban": "XX00 ATTACKER", "amount": 1.0}}
    made = decide(body.step(2), pay_bill, strict, outputs, (), flow=flow)
    assert made.action == "fail" and made.violation is not None and made.violation.rule == "sink:payee"
    assert made.reason.startswith("refused by the policy: step 2: sink:payee:")
    allowed = decide(body.step(2), pay_bill, policy(), outputs, (), flow=flow)
    assert allowed.action == "start" and allowed.provenance == {
        "provenance": {"iban": ["step:1"]},
        "untrusted": ["iban"],
    }


def test_a_named_approval_is_required() -> None:
    decision = check(
        PAY, CAT, policy("  - {name: pay, tools: [pay_bill], params: [iban], approve: finance}\n")
    ).decision
    assert decision is not None and decision.required_approvals == ("finance",)
    assert decision.step_approvals == ((2, "finance"),)
    assert any(r.endswith("needs approval by 'finance' (sink:pay)") for r in decision.reasons)


def test_trusted_data_passes_every_sink() -> None:
    body = plan(
        {"id": 1, "tool": "payee_iban", "params": {"payee": "p"}},
        {"id": 2, "tool": "pay_bill", "params": {"iban": "${1}", "amount": 1}},
    )
    result = check(body, CAT, policy("  - {name: payee, tools: [pay_bill], untrusted: deny}\n"))
    assert result.ok and not any("sink:" in r for r in result.decision.reasons)  # type: ignore[union-attr]


def test_the_default_holds_external_writes_and_irreversible_tools_for_a_person() -> None:
    cleared = "approval: {auto: [ops]}\ncategories: {ops: {tools: [read_bill, send_email, file_note]}}\n"
    mail = plan(READ, {"id": 2, "tool": "send_email", "params": {"to": "${1.payee}", "body": "hi"}})
    decision = check(mail, CAT, policy(extra=cleared)).decision
    assert decision is not None and decision.approval == "human"
    assert decision.reasons == (
        "step 2 (send_email) parameter 'to' takes data from step 1 (untrusted: read_bill) through ${1.payee}: "
        "a person must approve (sink:default)",
    )
    internal = plan(READ, {"id": 2, "tool": "file_note", "params": {"text": "${1.payee}"}})
    assert check(internal, CAT, policy(extra=cleared)).decision.approval == "auto"  # type: ignore[union-attr]


def test_a_policy_relaxes_the_default_per_parameter() -> None:
    cleared = "approval: {auto: [ops]}\ncategories: {ops: {tools: [read_bill, send_email]}}\n"
    body = plan(READ, {"id": 2, "tool": "send_email", "params": {"to": "ops@x", "body": "bill from ${1.payee}"}})
    relaxed = policy("  - {name: quote, tools: [send_email], params: [body], untrusted: allow}\n", cleared)
    assert check(body, CAT, relaxed).decision.approval == "auto"  # type: ignore[union-attr]
    body["steps"][1]["params"]["to"] = "${1.payee}"  # the address is still held
    assert check(body, CAT, relaxed).decision.approval == "human"  # type: ignore[union-attr]


def test_control_dependence_counts_where_a_rule_asks() -> None:
    guarded = plan(READ, {"id": 2, "tool": "file_note", "params": {"text": "pay"}, "condition": "${1.amount} > 5"})
    assert check(guarded, CAT, policy("  - {name: n, tools: [file_note], untrusted: deny}\n")).ok
    strict = check(guarded, CAT, policy("  - {name: n, tools: [file_note], untrusted: deny, control: true}\n"))
    assert [v.rule for v in strict.violations] == ["sink:n"]
    assert "through its condition" in strict.violations[0].message


def test_sinks_keep_the_hash_of_a_policy_without_them_and_refuse_mixed_outcomes() -> None:
    plain = Policy.from_yaml("version: 1\nname: p\n")
    assert "sinks" not in plain.canonical_json()
    assert "sinks" in policy("  - {name: n, untrusted: deny}\n").canonical_json()
    with pytest.raises(Exception, match="goes with 'untrusted: approve' only"):
        policy("  - {name: n, untrusted: deny, approve: finance}\n")


def test_the_check_result_gives_provenance() -> None:
    data = check(PAY, CAT).to_dict()
    assert data["provenance"]["2"]["params"]["iban"] == {
        "sources": ["step:1"],
        "refs": ["${1.iban}"],
        "untrusted": [{"step": 1, "tool": "read_bill", "untrusted": True}],
    }
    assert "provenance" not in check(plan(READ), CAT).to_dict()


# -- trace, export, review ------------------------------------------------------------------------


@pytest.fixture
def rt(tmp_path: Path) -> Runtime:
    return Runtime(CAT, policy(), db=f"sqlite:///{tmp_path}/prov.db", clock=FixedClock(), tools="tests.test_provenance")


def test_the_run_records_provenance_and_the_trace_and_export_show_it(rt: Runtime, tmp_path: Path) -> None:
    record = rt.submit(PAY, "ann")
    rt.approve(record.id, "ben", record.hash)
    assert rt.execute(record.id).ok
    started = [e for e in rt.store.events(record.id) if e.kind == "step.started"]
    assert "provenance" not in started[0].data
    assert started[1].data["provenance"] == {"iban": ["step:1"]} and started[1].data["untrusted"] == ["iban"]
    assert rt.replay(record.id).ok
    db = rt.store.url
    rt.close()
    told = CliRunner().invoke(main, ["trace", record.id[:8], "--db", db])
    assert told.exit_code == 0 and "; iban from step:1 (UNTRUSTED)" in told.stdout
    out = tmp_path / "export"
    assert CliRunner().invoke(main, ["governance", "export", "--out", str(out), "--db", db]).exit_code == 0
    lines = [json.loads(line) for line in (out / "traces" / f"{record.id}.jsonl").read_text().splitlines()]
    exported = [e["data"] for e in lines if e["kind"] == "step.started" and e["data"]["tool"] == "pay_bill"]
    assert exported[0]["untrusted"] == ["iban"]


def test_show_and_the_plan_page_mark_each_parameter_fed_by_untrusted_data(tmp_path: Path) -> None:
    server = setup(tmp_path, CAT, policy())
    created = api(server, "alice").post("/api/plans", json={**PAY, "category": "refunds"}).json()
    client, _ = browser(server, "dave")
    page = client.get(f"/plans/{created['id']}").text
    assert 'id="fed-2-iban"' in page and "from step 1 (untrusted: read_bill)" in page and "${1.iban}" in page
    review = api(server, "dave").get(f"/api/plans/{created['id']}/review").json()
    assert review["steps"][1]["sources"][0]["param"] == "iban" and review["steps"][1]["sources"][0]["untrusted"]
