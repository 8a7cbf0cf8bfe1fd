"""plangate eval planner: the suite, plan equivalence, the measures, and the command."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from plangate import Catalogue, Policy, check
from plangate.cli import main
from plangate.costs import Price, PriceTable
from plangate.equivalence import match
from plangate.evaluate import EvalReport, evaluate_planner, table
from plangate.models import ModelRequest
from plangate.models.test import FunctionModel
from plangate.plan import Plan
from plangate.suite import Suite, load_suite
from tests.conftest import EXAMPLES

SUITE = EXAMPLES / "eval" / "tasks.yaml"
PRICES = PriceTable((("function:*", Price(input=1.0, output=4.0)),))
CALL_COST = (10 * 1.0 + 10 * 4.0) / 1_000_000  # ten tokens in, ten out, at the prices above


@pytest.fixture(scope="module")
def suite() -> Suite:
    return load_suite(SUITE)


def effect(catalogue: Catalogue) -> Callable[[str], str | None]:
    return lambda name: catalogue[name].effect if name in catalogue else None


def plan(*steps: tuple[int, str, dict[str, Any]], order: str = "listed") -> Plan:
    return Plan.parse(
        {
            "task": "t",
            "category": "c",
            "order": order,
            "steps": [{"id": i, "tool": tool, "params": params, "rationale": "r"} for i, tool, params in steps],
        }
    )


def answering(suite: Suite, edit: Callable[[str, dict[str, Any]], Any] = lambda _, plan: plan) -> FunctionModel:
    """A model that answers each task with its reference plan, as ``edit`` changes it; ten tokens each way."""
    plans = {t.task: (t.id, t.reference.data()) for t in suite.tasks if t.reference is not None}

    def answer(request: ModelRequest) -> str:
        ident, data = plans[request.messages[0].content]
        edited = edit(ident, json.loads(json.dumps(data)))
        return edited if isinstance(edited, str) else json.dumps(edited)

    return FunctionModel(answer, tokenizer=lambda _: 10)


def run(suite: Suite, model: FunctionModel, catalogue: Catalogue, policy: Policy, ids: set[str] | None = None) -> Any:
    tasks = [t for t in suite.tasks if ids is None or t.id in ids]
    return evaluate_planner(tasks, model, catalogue, policy, prices=PRICES)


# -- the example suite ---------------------------------------------------------------------


def test_every_reference_plan_of_the_example_suite_is_judged_as_its_task_expects(
    suite: Suite, catalogue: Catalogue, policy: Policy
) -> None:
    assert len(suite.tasks) >= 25 and suite.policy == (EXAMPLES / "policy.yaml").resolve()
    assert {t.expect for t in suite.tasks} == {"valid", "invalid"}
    for task in suite.tasks:
        assert task.reference is not None and 1 <= len(task.reference.steps) <= 10, task.id
        result = check(task.reference, catalogue, policy, user=task.user)
        if task.expect == "valid":
            assert result.ok, (task.id, result.violations)
        else:  # well formed, and refused by the policy: the gate is the point of the task
            assert result.violations and {v.source for v in result.violations} == {"policy"}, task.id
    assert max(len(t.reference.steps) for t in suite.tasks if t.reference) == 10


# -- plan equivalence ----------------------------------------------------------------------


def test_plans_match_up_to_step_numbers_and_free_order(catalogue: Catalogue) -> None:
    of = effect(catalogue)
    reference = plan(
        (1, "get_invoice", {"invoice_id": "42"}),
        (2, "get_invoice", {"invoice_id": "44"}),
        (3, "lookup_customer", {"customer_id": "${1.customer_id}"}),
        (4, "issue_refund", {"invoice_id": "42", "amount": 20}),
    )
    renumbered = plan(
        (7, "get_invoice", {"invoice_id": "44"}),
        (3, "get_invoice", {"invoice_id": "42"}),
        (5, "lookup_customer", {"customer_id": "${3.customer_id}"}),
        (9, "issue_refund", {"invoice_id": "42", "amount": 20.0}),
    )
    found = match(reference, renumbered, of)
    assert found.ok and found.pairs == {1: 3, 2: 7, 3: 5, 4: 9}
    wrong_ref = plan(
        *[(s.id, s.tool, s.params) for s in renumbered.steps[:2]],
        (5, "lookup_customer", {"customer_id": "${7.customer_id}"}),
        (9, "issue_refund", {"invoice_id": "42", "amount": 20}),
    )
    assert match(reference, wrong_ref, of).reason == "the same calls, but their references point at different steps"
    early_refund = plan(
        (1, "get_invoice", {"invoice_id": "42"}),
        (2, "issue_refund", {"invoice_id": "42", "amount": 20}),
        (3, "get_invoice", {"invoice_id": "44"}),
        (4, "lookup_customer", {"customer_id": "${1.customer_id}"}),
    )
    assert match(reference, early_refund, of).reason == "the same calls, but in an order the reference does not allow"
    assert match(early_refund, reference, of).ok is False, "the refund must wait for what is listed before it"


def test_what_makes_plans_differ(catalogue: Catalogue) -> None:
    of = effect(catalogue)
    reference = plan(
        (1, "get_invoice", {"invoice_id": "42"}), (2, "send_email", {"to": "a@b.c", "subject": "s", "body": "b"})
    )
    worded = plan(
        (1, "get_invoice", {"invoice_id": "42"}), (2, "send_email", {"to": "a@b.c", "subject": "Hi", "body": "Text"})
    )
    assert not match(reference, worded, of).ok
    assert match(reference, worded, of, free={"send_email.subject", "send_email.body"}).ok
    other = plan(
        (1, "get_invoice", {"invoice_id": "43"}), (2, "send_email", {"to": "a@b.c", "subject": "s", "body": "b"})
    )
    assert match(reference, other, of).reason == "no step calls get_invoice with the parameters of reference step 1"
    fewer = plan((1, "get_invoice", {"invoice_id": "42"}))
    assert match(reference, fewer, of).reason == "different tools: the plan lacks send_email"
    more = plan(
        (1, "get_invoice", {"invoice_id": "42"}),
        (2, "get_invoice", {"invoice_id": "42"}),
        (3, "run_sql", {"query": "x"}),
    )
    assert match(fewer, more, of).reason == "different tools: the plan adds get_invoice, run_sql"
    flag = plan((1, "run_sql", {"query": True}))
    assert not match(flag, plan((1, "run_sql", {"query": 1})), of).ok, "true is not 1"


# -- the measures, exactly -----------------------------------------------------------------


def test_a_model_that_writes_every_reference_plan_scores_full_marks(
    suite: Suite, catalogue: Catalogue, policy: Policy
) -> None:
    report = run(suite, answering(suite), catalogue, policy)
    count = len(suite.tasks)
    assert [report.rate(m) for m in ("valid", "check", "policy", "match")] == [1.0, 1.0, 1.0, 1.0]
    assert report.totals() == {
        "tasks": count,
        "calls": count,
        "input_tokens": 10 * count,
        "output_tokens": 10 * count,
        "thinking_tokens": 0,
        "cost_usd": pytest.approx(CALL_COST * count),
        "seconds": report.totals()["seconds"],
    }
    refused = next(r for r in report.results if r.id == "delete-paid")
    assert refused.expect == "invalid" and refused.policy is True and "require:read-only-sql" in refused.note
    assert all(r.note == "" for r in report.results if r.expect == "valid")


def test_a_model_that_writes_junk_gets_a_repair_round_and_scores_nothing(
    suite: Suite, catalogue: Catalogue, policy: Policy
) -> None:
    report = run(suite, answering(suite, lambda _, plan: "I would rather not."), catalogue, policy)
    count = len(suite.tasks)
    assert [report.passed(m) for m in ("valid", "check", "policy", "match")] == [(0, count)] * 4
    totals = report.totals()
    assert (totals["calls"], totals["input_tokens"], totals["output_tokens"]) == (2 * count, 20 * count, 20 * count)
    assert report.cost == pytest.approx(2 * CALL_COST * count)
    first = report.results[0]
    assert first.calls == 2 and first.plan is None
    assert first.note.startswith("function:test did not write a valid plan, even after one repair round: first answer:")


def test_reordered_plans_match_where_the_order_is_free_and_only_there(
    suite: Suite, catalogue: Catalogue, policy: Policy
) -> None:
    def reorder(ident: str, data: dict[str, Any]) -> dict[str, Any]:
        steps = data["steps"]
        steps.reverse()
        for new, step in enumerate(steps, start=1):
            step["id"] = new
        return data

    ids = {"invoices-42-43", "customers-both", "customer-and-invoice", "refund-two", "email-both"}
    report = run(suite, answering(suite, reorder), catalogue, policy, ids)
    assert {r.id: r.match for r in report.results} == {
        "invoices-42-43": True,
        "customers-both": True,
        "customer-and-invoice": True,
        "refund-two": False,  # two writes: the reviewer approves the order they are listed in
        "email-both": False,
    }
    assert report.passed("check") == (5, 5) and report.passed("policy") == (5, 5) and report.rate("match") == 0.6
    assert "in an order the reference does not allow" in next(r.note for r in report.results if r.id == "refund-two")


def test_a_wrong_parameter_passes_the_gate_but_does_not_match(
    suite: Suite, catalogue: Catalogue, policy: Policy
) -> None:
    def wrong(ident: str, data: dict[str, Any]) -> dict[str, Any]:
        if ident == "refund-43-part":
            data["steps"][0]["params"]["amount"] = 25
        return data

    report = run(suite, answering(suite, wrong), catalogue, policy, {"invoice-42", "refund-43-part"})
    [lookup, refund] = report.results
    assert (lookup.valid, lookup.check, lookup.policy, lookup.match) == (True, True, True, True)
    assert (refund.valid, refund.check, refund.policy, refund.match) == (True, True, True, False)
    assert refund.note == "no step calls issue_refund with the parameters of reference step 1"
    assert refund.plan is not None and refund.plan["steps"][0]["params"]["amount"] == 25
    assert report.misses({"match": 0.9, "check": 1.0}) == ["missed --min-match 90.0%: match rate 50.0%"]


def test_the_table(suite: Suite, catalogue: Catalogue, policy: Policy) -> None:
    report = run(suite, answering(suite), catalogue, policy, {"invoice-42", "delete-paid"})
    lines = table(report)
    assert lines[0].split() == [
        "id",
        "category",
        "expect",
        "valid",
        "check",
        "policy",
        "match",
        "calls",
        "in",
        "tok",
        "out",
        "tok",
        "think",
        "cost",
        "USD",
        "secs",
    ]
    assert lines[1].split()[:11] == ["invoice-42", "lookups", "valid", "yes", "yes", "yes", "yes", "1", "10", "10", "0"]
    assert lines[3].split()[:12] == ["all", "2", "tasks", "2/2", "2/2", "2/2", "2/2", "2", "20", "20", "0", "0.0001"]
    assert lines[4].split() == ["rate", "100%", "100%", "100%", "100%"]
    assert lines[5] == "model function:test" and lines[6] == "notes:"
    assert lines[7].startswith("  delete-paid: refused, as expected: step 1: require:read-only-sql-in-production:")


def test_without_a_policy_or_a_reference_those_measures_are_left_out(catalogue: Catalogue, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text("- {id: one, task: Look up invoice 42}\n")
    model = FunctionModel(lambda _: json.dumps(load_suite(SUITE).tasks[0].reference.data()), tokenizer=lambda _: 10)  # type: ignore[union-attr]
    report: EvalReport = evaluate_planner(load_suite(tasks).tasks, model, catalogue, prices=PRICES)
    [result] = report.results
    assert (result.valid, result.check, result.policy, result.match, result.category) == (True, True, None, None, "-")
    assert report.rate("policy") is None and report.misses({"policy": 0.5}) == [
        "missed --min-policy 50.0%: policy rate no task it applies to"
    ]


# -- the command ---------------------------------------------------------------------------


def eval_cli(args: list[str], tmp_path: Path) -> Any:
    return CliRunner().invoke(
        main, ["eval", "planner", *args, "--model", "function:test", "--db", f"sqlite:///{tmp_path}/p.db"]
    )


@pytest.fixture
def scripted(suite: Suite, monkeypatch: pytest.MonkeyPatch) -> FunctionModel:
    """``--model`` gives the reference-writing model, but for a wrong amount on one task."""

    def wrong(ident: str, data: dict[str, Any]) -> dict[str, Any]:
        if ident == "refund-43-part":
            data["steps"][0]["params"]["amount"] = 25
        return data

    model = answering(suite, wrong)
    monkeypatch.setattr("plangate.models.from_spec", lambda spec, base_url=None: model)
    return model


def test_eval_planner_prints_a_table_and_progress(scripted: FunctionModel, tmp_path: Path) -> None:
    done = eval_cli([str(SUITE)], tmp_path)
    assert done.exit_code == 0, done.output
    count = len(load_suite(SUITE).tasks)
    progress = done.stderr.splitlines()
    assert len(progress) == count and progress[0].startswith(f"[1/{count}] invoice-42: valid yes, check yes")
    rows = done.stdout.splitlines()
    assert rows[0].split()[:3] == ["id", "category", "expect"] and rows[count + 3] == "model function:test"
    assert rows[count + 4] == "notes:" and len(rows) == count + 5 + 7, "six refusals and a wrong amount"
    assert rows[count + 1].split()[:7] == [
        "all",
        str(count),
        "tasks",
        f"{count}/{count}",
        f"{count}/{count}",
        f"{count}/{count}",
        f"{count - 1}/{count}",
    ]


def test_eval_planner_json_and_a_missed_threshold(scripted: FunctionModel, tmp_path: Path) -> None:
    done = eval_cli([str(SUITE), "--json", "--min-valid", "1", "--min-match", "99%"], tmp_path)
    assert done.exit_code == 1
    report = json.loads(done.stdout)
    count = len(report["tasks"])
    assert report["model"] == "function:test" and report["rates"]["match"] == (count - 1) / count
    assert report["totals"]["calls"] == count and report["totals"]["input_tokens"] == 10 * count
    assert done.stderr.splitlines()[-1] == f"missed --min-match 99.0%: match rate {(count - 1) / count:.1%}"
    from plangate.store import open_store

    assert len(open_store(f"sqlite:///{tmp_path}/p.db").calls()) == count, "the calls are in the cost ledger"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("tasks:\n  - id: a\n    task: [unclosed\n", "line 4 column 1: not-yaml"),
        ("tasks:\n  - {id: a, task: x, expect: maybe}\n", "tasks[0] (a): expect is 'valid' or 'invalid', not 'maybe'"),
        ("tasks:\n  - {id: a, task: x, refrence: {}}\n", "tasks[0]: unknown key 'refrence'"),
        ("- {id: a, task: x}\n- {id: a, task: y}\n", "tasks[1]: the id 'a' is used by an earlier task"),
        ("- {id: a, task: x, reference: nowhere.json}\n", "tasks[0] (a): reference:"),
        ("- {id: a, task: x, reference: {category: c, steps: []}}\n", "tasks[0] (a): reference: not a valid plan"),
        ("tasks: 3\n", "top level: write a list of tasks"),
    ],
)
def test_eval_planner_says_in_one_line_where_the_tasks_file_is_wrong(
    scripted: FunctionModel, tmp_path: Path, text: str, says: str
) -> None:
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(text)
    done = eval_cli([str(tasks), "--tools", str(EXAMPLES / "business.py")], tmp_path)
    assert done.exit_code == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("plangate: ") and says in line, line


def test_eval_planner_needs_tools_and_a_policy_for_min_policy(scripted: FunctionModel, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text("- {id: a, task: Look up invoice 42}\n")
    done = eval_cli([str(tasks)], tmp_path)
    assert done.exit_code == 2 and "give --tools MODULE" in done.stderr
    done = eval_cli([str(tasks), "--tools", str(EXAMPLES / "business.py"), "--min-policy", "0.5"], tmp_path)
    assert done.exit_code == 2 and "--min-policy needs a policy" in done.stderr
    done = eval_cli([str(tasks), "--tools", str(EXAMPLES / "business.py"), "--min-valid", "2"], tmp_path)
    assert done.exit_code == 2 and "not between 0 and 1" in done.stderr


def test_eval_planner_against_the_local_llama_cpp_model(tmp_path: Path) -> None:
    """Two tasks through a real model (SmolLM2-135M, in process): the report is well formed.

    A model this small says nothing about planning quality, so nothing is asserted of it."""
    from tests.test_llamacpp import smollm2

    picked = [t for t in load_suite(SUITE).tasks if t.id in ("invoice-42", "owner-of-43")]
    listed = "".join(
        f"  - {{id: {t.id}, task: {json.dumps(t.task)}, reference: {json.dumps(t.reference.data())}}}\n"
        for t in picked
        if t.reference
    )
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text(f"tools: {EXAMPLES}/business.py\npolicy: {EXAMPLES}/policy.yaml\nuser: alice\ntasks:\n{listed}")
    done = CliRunner().invoke(
        main,
        [
            *("eval", "planner", str(tasks), "--model", f"llamacpp:{smollm2()}"),
            *("--max-tokens", "64", "--json", "--db", f"sqlite:///{tmp_path}/p.db"),
        ],
    )
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    assert report["model"] == "llamacpp:SmolLM2-135M-Instruct.Q4_1.gguf"
    assert [t["id"] for t in report["tasks"]] == ["invoice-42", "owner-of-43"]
    for task in report["tasks"]:
        assert 1 <= task["calls"] <= 2 and task["input_tokens"] > 1000 and 0 < task["output_tokens"] <= 128
        assert task["cost"] == 0.0 and task["seconds"] > 0 and task["thinking_tokens"] == 0
        assert task["valid"] == (task["plan"] is not None)
        assert all(isinstance(task[m], bool) for m in ("valid", "check", "policy", "match"))
    assert report["totals"]["calls"] == sum(t["calls"] for t in report["tasks"])
    assert set(report["rates"]) == {"valid", "check", "policy", "match"}
    assert len(done.stderr.splitlines()) == 2, "one progress line per task"
