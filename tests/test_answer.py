"""A plan's answer: rendering, provenance, the checker, the answer sink rule, the record and replay."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from plangate import Plan, Policy, check
from plangate.answer import render
from plangate.cli import main
from plangate.provenance import analyse
from plangate.runtime import Runtime
from tests.helpers import FixedClock, plan
from tests.test_provenance import CAT

TOOLS = "tests.test_provenance"
READ = {"id": 1, "tool": "read_bill", "params": {"path": "march.txt"}}
ONFILE = {"id": 2, "tool": "payee_iban", "params": {"payee": "City Power"}}


def with_answer(text: str, *steps: dict[str, Any]) -> dict[str, Any]:
    return {**plan(*(steps or (READ, ONFILE))), "answer": text}


def rendered(text: str, outputs: dict[int, Any], skipped: tuple[int, ...] = ()) -> Any:
    body = Plan.parse(with_answer(text))
    return render(body, outputs, (), skipped, analyse(body, CAT))


BILL = {"payee": "City Power", "iban": "XX00 ATTACKER", "amount": 84.2}


def test_a_whole_reference_reads_as_text_and_a_field_path_reads_into_the_output() -> None:
    assert rendered("${1}", {1: BILL, 2: "XX00 ONFILE"}).text == json.dumps(BILL, separators=(",", ":"), sort_keys=True)
    said = rendered("Pay ${1.amount} to ${2} (the bill says ${1.iban}); $${literal}", {1: BILL, 2: "XX00 ONFILE"})
    assert said.text == "Pay 84.2 to XX00 ONFILE (the bill says XX00 ATTACKER); ${literal}"


def test_each_part_keeps_its_sources_and_untrusted_ones_are_named_with_step_and_tool() -> None:
    said = rendered("Pay ${1.amount} to ${2}", {1: BILL, 2: "XX00 ONFILE"})
    assert said.sources == ("plan", "step:1", "step:2")
    assert [(o.step, o.tool) for o in said.untrusted] == [(1, "read_bill")]
    assert said.provenance()["untrusted"] == [{"step": 1, "tool": "read_bill"}]
    assert said.provenance()["spans"] == [[4, 8, 1]]  # "84.2" only: the IBAN on file is trusted
    assert said.marked() == "Pay [untrusted: step 1 (untrusted: read_bill)>>]84.2[<<] to XX00 ONFILE"
    assert rendered("All done.", {1: BILL, 2: "x"}).untrusted == ()


def test_a_skipped_step_reads_as_a_marker() -> None:
    assert rendered("IBAN: ${2}", {1: BILL}, skipped=(2,)).text == "IBAN: [step 2 skipped]"


def test_an_old_plan_without_an_answer_keeps_its_hash_and_one_with_an_answer_has_another() -> None:
    body = plan(READ, ONFILE)
    old = Plan.parse(body)
    assert "answer" not in old.data() and "answer" not in old.canonical_json()
    assert Plan.parse({**body, "answer": None}).hash == old.hash
    assert Plan.parse(with_answer("${2}")).hash != old.hash
    assert "answer" in Plan.model_json_schema()["properties"]


@pytest.mark.parametrize(
    ("text", "rule", "why"),
    [
        ("${9}", "ref-missing-step", "answer: ${9} refers to step 9, which does not exist"),
        ("${1.nope}", "ref-path", "answer: ${1.nope}: the output of step 1 (read_bill) has no field"),
        ("${1.iban", "ref-syntax", "answer: unclosed reference"),
        ("${x}", "ref-syntax", "answer: malformed reference '${x}'"),
    ],
)
def test_the_checker_holds_the_answers_references_like_a_parameters(text: str, rule: str, why: str) -> None:
    found = check(with_answer(text), CAT)
    assert [(v.rule, v.step) for v in found.violations] == [(rule, None)]
    assert why in found.violations[0].message


def test_a_good_answer_checks_clean() -> None:
    assert check(with_answer("Pay ${1.amount} to ${2}"), CAT).ok


ANSWER_SINK = "  - name: answer-text\n    answer: true\n"


@pytest.mark.parametrize(
    ("outcome", "violation", "approval"),
    [
        ("untrusted: deny", "sink:answer-text", None),
        ("untrusted: approve\n    approve: auditor", None, ["auditor"]),
        ("untrusted: allow", None, []),
    ],
)
def test_an_answer_sink_rule_denies_holds_for_a_role_or_allows(
    outcome: str, violation: str | None, approval: list[str] | None
) -> None:
    policy = Policy.from_yaml(f"version: 1\nname: p\nsinks:\n{ANSWER_SINK}    {outcome}\n")
    found = check(with_answer("The bill says ${1.iban}"), CAT, policy)
    assert [v.rule for v in found.violations] == ([violation] if violation else [])
    if violation:
        assert found.violations[0].message == "the answer takes data from step 1 (untrusted: read_bill)"
    if approval is not None:
        assert found.decision is not None and list(found.decision.required_approvals) == approval
    trusted = check(with_answer("On file: ${2}"), CAT, policy)
    assert trusted.ok and trusted.decision is not None and not trusted.decision.required_approvals


def test_an_answer_rule_takes_no_tools_and_guards_no_parameter() -> None:
    with pytest.raises(Exception, match="guards the answer"):
        Policy.from_yaml(f"version: 1\nname: p\nsinks:\n{ANSWER_SINK}    tools: [pay_bill]\n")
    policy = Policy.from_yaml(f"version: 1\nname: p\nsinks:\n{ANSWER_SINK}    untrusted: deny\n")
    pay = plan(READ, {"id": 2, "tool": "file_note", "params": {"text": "${1.iban}"}})
    assert check(pay, CAT, policy).ok  # the answer rule is not a catch-all for parameters


def test_a_policy_without_answer_rules_keeps_its_hash() -> None:
    text = "version: 1\nname: p\nsinks:\n  - name: s\n    tools: [pay_bill]\n"
    assert '"answer"' not in Policy.from_yaml(text).canonical_json()


@pytest.fixture
def rt(tmp_path: Path) -> Runtime:
    return Runtime(CAT, None, db=f"sqlite:///{tmp_path}/answer.db", clock=FixedClock(), tools=TOOLS)


def ran(rt: Runtime, body: dict[str, Any]) -> str:
    record = rt.submit(body, "ann")
    return rt.approve(record.id, "ben", record.hash).id


def test_the_run_records_the_answer_with_its_provenance_and_replay_renders_it_again(rt: Runtime) -> None:
    plan_id = ran(rt, with_answer("Pay ${1.amount} to ${2}"))
    result = rt.execute(plan_id)
    assert result.answer == "Pay 84.2 to XX00 ONFILE"
    assert result.answer_provenance is not None and result.answer_provenance.untrusted[0].tool == "read_bill"
    ended = next(e for e in rt.store.plan_events(plan_id)[0] if e.kind == "run.succeeded")
    assert ended.data["answer"] == "Pay 84.2 to XX00 ONFILE"
    assert ended.data["answer_provenance"]["untrusted"] == [{"step": 1, "tool": "read_bill"}]
    assert rt.execute(plan_id).answer == result.answer  # rebuilt from the store: nothing runs again
    assert rt.replay(plan_id).ok
    checked = check(with_answer("Pay ${1.amount} to ${2}"), CAT).to_dict()["answer_provenance"]
    assert {k: ended.data["answer_provenance"][k] for k in ("sources", "untrusted")} == checked  # told beforehand


def test_check_json_says_what_the_answer_will_read_before_anything_runs(tmp_path: Path) -> None:
    (tmp_path / "plan.json").write_text(json.dumps(with_answer("${1.iban}")))
    done = CliRunner().invoke(main, ["check", str(tmp_path / "plan.json"), "--tools", TOOLS, "--json"])
    assert json.loads(done.stdout)["answer_provenance"] == {
        "sources": ["step:1"],
        "untrusted": [{"step": 1, "tool": "read_bill"}],
    }
    (tmp_path / "quiet.json").write_text(json.dumps(plan(READ)))
    quiet = CliRunner().invoke(main, ["check", str(tmp_path / "quiet.json"), "--tools", TOOLS, "--json"])
    assert "answer_provenance" not in json.loads(quiet.stdout)


def test_replay_under_a_policy_that_trusts_the_bill_finds_the_answers_provenance_differs(rt: Runtime) -> None:
    plan_id = ran(rt, with_answer("The bill says ${1.iban}"))
    rt.execute(plan_id)
    trusting = Policy.from_yaml("version: 1\nname: p\ntools:\n  read_bill:\n    untrusted_output: false\n")
    found = rt.replay(plan_id, policy=trusting)
    differs = {d.what: d for d in found.divergences}
    assert "answer" not in differs and differs["answer_provenance"].derived["untrusted"] == []


def test_the_cli_prints_the_answer_with_its_untrusted_part_marked(rt: Runtime) -> None:
    plan_id = ran(rt, with_answer("The bill says ${1.iban}"))
    out = CliRunner().invoke(main, ["execute", plan_id, "--tools", TOOLS, "--db", rt.store.url])
    assert out.exit_code == 0, out.output
    assert "answer: The bill says [untrusted: step 1 (untrusted: read_bill)>>]XX00 ATTACKER[<<]" in out.stdout
    shown = CliRunner().invoke(main, ["show", plan_id, "--db", rt.store.url])
    assert "[untrusted: step 1 (untrusted: read_bill)>>]XX00 ATTACKER[<<]" in shown.stdout


def test_the_plan_page_shows_what_the_answer_reads_and_what_it_said_with_the_untrusted_badge(tmp_path: Path) -> None:
    from tests.serverkit import api, browser, setup

    server = setup(tmp_path, CAT, None)
    body = {**with_answer("The bill says ${1.iban}; on file: ${2}"), "category": "refunds"}
    created = api(server, "alice").post("/api/plans", json=body).json()
    client, _ = browser(server, "dave")
    page = client.get(f"/plans/{created['id']}").text
    assert 'id="answer"' in page and "from step 1 (untrusted: read_bill)" in page and 'id="answer-said"' not in page
    assert api(server, "dave").post(f"/api/plans/{created['id']}/approve", json={"hash": created["hash"]}).is_success
    assert api(server, "dave").post(f"/api/plans/{created['id']}/execute").is_success
    page = client.get(f"/plans/{created['id']}").text
    said = page[page.index('id="answer-said"') :]
    assert '<mark class="untrusted" title="from step 1 (untrusted: read_bill)">' in said
    assert "XX00 ATTACKER</mark>; on file: XX00 ONFILE" in said
    run = client.get(f"/plans/{created['id']}/run").text  # the run's own page says it too, marked the same way
    assert said.split("</p>")[0] in run
    review = api(server, "dave").get(f"/api/plans/{created['id']}/review").json()
    assert review["answer"]["rendered"] == "The bill says XX00 ATTACKER; on file: XX00 ONFILE"


def test_an_answer_longer_than_its_limit_is_cut_there_with_a_note_and_its_marks_kept() -> None:
    from plangate.answer import MAX_ANSWER

    at_limit = rendered("${1.iban}", {1: {**BILL, "iban": "I" * MAX_ANSWER}, 2: "XX00"})
    assert at_limit.text == "I" * MAX_ANSWER  # the limit itself is kept whole
    over = rendered("Pay ${1.iban} to ${2}", {1: {**BILL, "iban": "I" * MAX_ANSWER}, 2: "XX00"})
    assert (
        over.text == "Pay " + "I" * (MAX_ANSWER - 4) + f" [... {4 + 4 + 4} more characters: the answer is cut at"
        f" {MAX_ANSWER}; the outputs are in full in the trace]"
    )
    assert over.provenance()["spans"] == [[4, MAX_ANSWER, 1]]
