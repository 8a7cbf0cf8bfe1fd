from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from plangate import Catalogue, Policy
from plangate.budget import BudgetAllocator
from plangate.cli import main
from plangate.costs import Price, PriceTable
from plangate.library import match, template_from
from plangate.models import ModelError, ModelRequest, Usage
from plangate.models.test import FunctionModel, Reply, ScriptedModel
from plangate.planner import Planner, PlanningError, parse_answer
from plangate.runtime import Runtime
from plangate.store import open_store
from tests.conftest import EXAMPLES, load_plan
from tests.helpers import FixedClock

GOOD = json.dumps(
    {
        "task": "Refund invoice 42",
        "category": "refunds",
        "steps": [
            {"id": 1, "tool": "get_invoice", "params": {"invoice_id": "42"}, "rationale": "Need the total."},
            {
                "id": 2,
                "tool": "issue_refund",
                "params": {"invoice_id": "42", "amount": "${1.total}"},
                "rationale": "The refund itself.",
            },
        ],
    }
)
PRICES = PriceTable((("scripted:*", Price(input=1.0, output=4.0)),))


@pytest.fixture
def runtime(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> Runtime:
    return Runtime(catalogue, policy, db=f"sqlite:///{tmp_path}/p.db", clock=FixedClock())


def planner(runtime: Runtime, model: Any, **options: Any) -> Planner:
    assert runtime.catalogue is not None
    settings = {"store": runtime.store, "policy": runtime.policy, "prices": PRICES, "clock": runtime.clock, **options}
    return Planner(runtime.catalogue, model=model, **settings)


def test_a_model_plan_with_thinking_usage_and_cost(runtime: Runtime) -> None:
    model = ScriptedModel([Reply(text=f"Here is the plan:\n```json\n{GOOD}\n```\nDone.", thinking="Get it first.")])
    result = planner(runtime, model).plan("Refund invoice 42")
    assert result.source == "model" and [s.tool for s in result.plan.steps] == ["get_invoice", "issue_refund"]
    request = model.requests[0]
    assert request.json_schema is not None and request.json_schema["$id"] == "urn:plangate:plan:1"
    assert "- issue_refund(invoice_id: string, amount: number) -> {refund_id: string" in request.system
    assert "[write, idempotent]" in request.system and "at most 20 steps" in request.system
    assert request.thinking_budget == result.budget.tokens if result.budget else False
    assert result.thinking == "Get it first." and result.usage.thinking > 0
    assert result.cost == pytest.approx(PRICES.cost("scripted:test", result.usage))
    ledger = runtime.store.calls()
    assert len(ledger) == 1 and ledger[0].purpose == "plan" and ledger[0].budget == result.budget.tokens  # type: ignore[union-attr]

    record = runtime.submit(result, requested_by="alice")
    planned = next(e for e in runtime.trace(record.id) if e.kind == "plan.planned")
    assert planned.data["thinking"] == "Get it first." and planned.data["model"] == "scripted:test"
    assert runtime.store.calls(plan_id=record.id)[0].id == ledger[0].id, "the call is attributed to the plan"


def test_one_repair_round_with_the_exact_errors(runtime: Runtime) -> None:
    model = ScriptedModel(['{"task": "x", "steps": [{"id": "1"}]}', GOOD])
    result = planner(runtime, model).plan("Refund invoice 42")
    assert len(result.calls) == 2 and [c.purpose for c in result.calls] == ["plan", "repair"]
    repair = model.requests[1]
    assert repair.messages[1].role == "assistant" and repair.messages[1].content.startswith('{"task": "x"')
    feedback = repair.messages[2].content
    assert "category: required, but missing" in feedback and "steps[0].id: Input should be a valid integer" in feedback


@pytest.mark.parametrize(
    ("replies", "message"),
    [
        (["", ""], "the answer was empty"),
        (["I cannot do that.", "Still no."], "the answer holds no JSON object"),
        (['{"task": "x", "category": "c", "steps": [', '{"task":'], "not JSON: line 1"),
        (['{"steps": 5}', '{"task": 1}'], "not a valid plan"),
    ],
)
def test_a_model_that_never_writes_a_plan_fails_clearly(runtime: Runtime, replies: list[str], message: str) -> None:
    model = ScriptedModel(replies)
    with pytest.raises(PlanningError, match=message) as err:
        planner(runtime, model).plan("Refund invoice 42")
    assert "even after one repair round" in str(err.value) and len(err.value.calls) == 2
    assert len(runtime.store.calls()) == 2, "failed calls still cost, and are in the ledger"


def test_the_repair_and_the_failure_say_each_problem_after_one_colon(runtime: Runtime) -> None:
    model = ScriptedModel(['{"task": "x", "steps": 5}', '{"task": "x", "category": "c"}'])
    with pytest.raises(PlanningError) as err:
        planner(runtime, model).plan("Refund invoice 42")
    first = "not a valid plan: category: required, but missing; steps: Input should be a valid list (got 5)"
    assert f"{first}\n\nWrite the whole plan again" in model.requests[1].messages[2].content
    second = "not a valid plan: steps: required, but missing"
    assert str(err.value).endswith(f"first answer: {first}\nafter repair: {second}")
    assert ":;" not in str(err.value)


def test_lenient_parsing() -> None:
    from plangate.models import ModelResponse

    wrapped = ModelResponse(text='Sure! {"plan": ' + GOOD.replace("}]}", "},]}") + "} hope that helps")
    assert len(parse_answer(wrapped).steps) == 2
    cut = ModelResponse(text=GOOD[:80], stop_reason="max_tokens")
    with pytest.raises(Exception, match="cut off at max_tokens"):
        parse_answer(cut)
    braces = ModelResponse(text=GOOD.replace("Need the total.", 'Need the \\"total\\" {with braces}.'))
    assert parse_answer(braces).steps[0].rationale == 'Need the "total" {with braces}.'


def test_a_plan_that_fails_the_check_is_not_repaired(runtime: Runtime) -> None:
    bad = GOOD.replace("get_invoice", "fetch_invoice")
    model = ScriptedModel([bad])
    result = planner(runtime, model).plan("Refund invoice 42")
    assert len(result.calls) == 1, "the model is not silently re-invoked"
    record = runtime.submit(result, requested_by="alice")
    assert record.status == "rejected" and record.violations[0].rule == "unknown-tool"


def test_model_errors_and_refusals_reach_nothing(runtime: Runtime) -> None:
    def refuse(request: ModelRequest) -> Reply:
        raise ModelError("scripted:test refused to answer")

    with pytest.raises(PlanningError, match="planning failed: scripted:test refused"):
        planner(runtime, FunctionModel(refuse, name="scripted:test")).plan("Refund invoice 42")
    assert runtime.store.calls()[0].ok is False and runtime.list_plans() == []


def test_cost_caps_refuse_to_plan_past_them(runtime: Runtime, policy: Policy) -> None:
    capped = policy.model_copy(update={"budgets": policy.budgets.model_copy(update={"per_plan_usd": 0.001})})
    with pytest.raises(PlanningError, match=r"refused by the policy's budgets\.per_plan_usd"):
        planner(runtime, ScriptedModel([GOOD]), policy=capped).plan("Refund invoice 42")
    daily = policy.model_copy(update={"budgets": policy.budgets.model_copy(update={"per_day_usd": 0.2})})
    cheap = planner(runtime, ScriptedModel([GOOD, GOOD, GOOD]), policy=daily, max_tokens=1000)
    cheap.plan("Refund invoice 42")
    with runtime.store.transaction():  # pretend the day has been expensive
        row = runtime.store.calls()[0]
        runtime.store.record_call(row.__class__(**{**row.__dict__, "id": "spent", "cost": 0.19}))
    with pytest.raises(PlanningError, match=r"budgets\.per_day_usd"):
        cheap.plan("Refund invoice 42")
    unknown = Planner(
        runtime.catalogue,
        model=ScriptedModel([GOOD]),
        store=runtime.store,  # type: ignore[arg-type]
        policy=capped,
        prices=PriceTable(()),
        clock=runtime.clock,
    )
    with pytest.raises(PlanningError, match="has no price for scripted:test"):
        unknown.plan("Refund invoice 42")


def utf8_bytes(text: str) -> int:
    """The most tokens a byte-level BPE tokenizer can make of ``text``: one a byte."""
    return len(text.encode())


def test_a_cost_cap_holds_for_text_that_takes_a_token_a_byte(runtime: Runtime, policy: Policy) -> None:
    """CJK takes three bytes a character and emoji four, and a tokenizer may spend a token on each byte:
    a cap under what such a prompt costs refuses the call, where characters / 3 let it through."""
    task = "退款发票四十二，然后通知客户🙏🏽" * 200
    prices = PriceTable((("scripted:*", Price(input=1.0, output=0.0)),))  # the prompt's cost alone
    uncapped = planner(runtime, ScriptedModel([GOOD], tokenizer=utf8_bytes), prices=prices).plan(task)
    cost = uncapped.cost
    assert cost is not None
    capped = policy.model_copy(update={"budgets": policy.budgets.model_copy(update={"per_plan_usd": cost * 0.99})})
    model = ScriptedModel([GOOD], tokenizer=utf8_bytes)
    with pytest.raises(PlanningError, match=r"refused by the policy's budgets\.per_plan_usd"):
        planner(runtime, model, policy=capped, prices=prices).plan(task)
    assert model.requests == [], "the model was never called"


def test_the_budget_grows_with_the_expected_steps() -> None:
    allocator = BudgetAllocator()
    one = allocator.allocate("Look up invoice 42", tools=6)
    four = allocator.allocate("Refund invoice 42, tell the customer, then close the ticket and log it", tools=6)
    assert (one.expected_steps, four.expected_steps) == (1, 4)
    assert one.tokens < four.tokens and one.effort == "low"
    assert allocator.allocate("x " * 5000, tools=500, steps=30).tokens == allocator.ceiling
    assert allocator.allocate("Refund each invoice", tools=1).expected_steps == 2


def test_the_library_fills_templates_without_a_model(runtime: Runtime) -> None:
    plan = runtime.submit(load_plan("refund"), "alice").plan
    template = template_from(plan, "refund-and-tell", source_plan="p", created_by="dave", created_at="t")
    assert template.pattern == "Refund invoice {{invoice_id}} and tell the customer"
    assert template.slots == [{"name": "invoice_id", "type": "string", "example": "42"}]
    found = match([template], "refund invoice 44   and tell the customer")
    assert found is not None and found.slots == {"invoice_id": "44"}
    assert found.plan.steps[0].params == {"invoice_id": "44"} and found.plan.steps[2].params["invoice_id"] == "44"
    assert "for invoice 44." in found.plan.steps[3].params["body"]
    assert match([template], "Refund invoice 44 and tell the boss") is None
    with runtime.store.transaction():
        runtime.store.save_template(template)
    result = planner(runtime, None).plan("Refund invoice 43 and tell the customer")
    assert result.source == "library" and result.template == "refund-and-tell" and result.calls == ()
    with pytest.raises(PlanningError, match="no template in the library fits"):
        planner(runtime, None).plan("Delete everything")


def test_typed_slots_only_match_their_type() -> None:
    from plangate.plan import Plan

    plan = Plan.parse(
        {
            "task": "Send 3 reminders to c-7",
            "category": "c",
            "steps": [{"id": 1, "tool": "remind", "params": {"count": 3, "customer": "c-7"}, "rationale": "r"}],
        }
    )
    template = template_from(plan, "remind", source_plan="p", created_by="u", created_at="t")
    assert [(s["name"], s["type"]) for s in template.slots] == [("count", "integer"), ("customer", "string")]
    found = match([template], "Send 12 reminders to c-9")
    assert found is not None and found.plan.steps[0].params == {"count": 12, "customer": "c-9"}
    assert match([template], "Send many reminders to c-9") is None


def test_plan_usage_and_library_on_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PLANGATE_DB", f"sqlite:///{tmp_path}/cli.db")
    tools, policy = str(EXAMPLES / "business.py"), str(EXAMPLES / "policy.yaml")
    runner = CliRunner()
    done = runner.invoke(main, ["plan", "Refund invoice 44 and tell the customer", "--tools", tools])
    assert done.exit_code == 2 and "no template in the library fits" in done.stderr

    submitted = json.loads(
        runner.invoke(
            main,
            [
                "submit",
                str(EXAMPLES / "plans" / "refund.json"),
                "--tools",
                tools,
                "--policy",
                policy,
                "--as",
                "alice",
                "--json",
            ],
        ).stdout
    )
    done = runner.invoke(main, ["library", "add", submitted["id"]])
    assert done.exit_code == 2 and "only an approved plan" in done.stderr
    for who in ("dave", "carol"):
        runner.invoke(main, ["approve", submitted["id"], "--as", who, "--hash", submitted["hash"]])
    done = runner.invoke(main, ["library", "add", submitted["id"], "--name", "refund-and-tell"])
    assert done.exit_code == 0 and "Refund invoice {{invoice_id}} and tell the customer" in done.stdout
    assert "refund-and-tell" in runner.invoke(main, ["library", "list"]).stdout

    done = runner.invoke(
        main, ["plan", "Refund invoice 44 and tell the customer", "--tools", tools, "--policy", policy, "--as", "alice"]
    )
    assert done.exit_code == 0, done.output
    assert '"invoice_id": "44"' in done.stdout and "planned from the library: template 'refund-and-tell'" in done.stdout
    done = runner.invoke(
        main, ["run", "Refund invoice 44 and tell the customer", "--tools", tools, "--policy", policy, "--as", "alice"]
    )
    assert done.exit_code == 0 and "waiting for approval by a person and by privacy-officer" in done.stdout
    assert runner.invoke(main, ["usage"]).stdout.startswith("no model calls")
    assert runner.invoke(main, ["library", "remove", "refund-and-tell", "--as", "dave"]).exit_code == 0
    assert runner.invoke(main, ["library", "remove", "refund-and-tell"]).exit_code == 2
    removed = [e for e in open_store(f"sqlite:///{tmp_path}/cli.db").events() if e.kind == "library.removed"]
    assert [(e.actor, e.data) for e in removed] == [("dave", {"template": "refund-and-tell"})], "recorded, and by whom"
    assert runner.invoke(main, ["audit", "verify"]).exit_code == 0


def test_usage_shows_budget_against_tokens_used(
    runtime: Runtime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = ScriptedModel([Reply(text=GOOD, thinking="think " * 50)] * 2)
    planner(runtime, model).plan("Refund invoice 42")
    planner(runtime, model).plan("Refund invoice 42 and tell the customer")
    monkeypatch.setenv("PLANGATE_DB", f"sqlite:///{tmp_path}/p.db")
    out = CliRunner().invoke(main, ["usage", "--days", "100000"]).stdout
    lines = out.splitlines()
    assert lines[0].split() == ["STEPS", "CALLS", "BUDGET", "THINKING", "USED/BUDGET", "OUTPUT", "COST", "USD"]
    assert lines[1].split()[:2] == ["1", "1"] and lines[2].split()[:2] == ["2", "1"]
    assert lines[-1].startswith("2 calls")
    assert Usage(input=1, output=2) + Usage(thinking=3) == Usage(input=1, output=2, thinking=3)


def test_the_compact_plan_format_is_shorter_and_names_every_field(runtime: Runtime) -> None:
    from plangate.models.test import rough_tokens
    from plangate.plan import Plan, Step

    compact = planner(runtime, None)._system_prompt()
    full = planner(runtime, None, schema_text="json")._system_prompt()
    assert '"$defs"' in full and "type Step = {" in compact and "$defs" not in compact
    for name in [*Plan.model_fields, *Step.model_fields]:
        assert f"  {name}" in compact, name  # every key of the format, one line each
    # Counted with the library's stand-in tokenizer (words and punctuation marks) over the
    # example catalogue and policy: the format costs 1045 fewer, 46% of the prompt (the answer's line: 28).
    assert (rough_tokens(full), rough_tokens(compact)) == (2267, 1222)


def test_both_modes_describe_tools_with_one_renderer(runtime: Runtime) -> None:
    from plangate.react import ReActAgent
    from plangate.tools import render_tool
    from plangate.tools.basic import search

    assert render_tool(search) == (
        "- search(query: string, k?: integer = 3) -> {document: string, score: number, text: string}[]  [read, "
        "idempotent]\n  Search the document collection; returns the best matching documents with their text.\n"
        "  query: Words to look for. k: How many documents to return (1 to 10)."
    )
    assert runtime.catalogue is not None
    model = FunctionModel(lambda request: "Final Answer: none")
    ReActAgent(model, runtime.catalogue, runtime.store).run("q")
    planned = planner(runtime, None)._system_prompt()
    for tool in runtime.catalogue:
        assert render_tool(tool) in planned and render_tool(tool) in model.requests[0].system


def test_the_prompt_names_the_policys_categories_and_what_each_may_do(runtime: Runtime) -> None:
    """A planner that guesses a category loses plans the policy would accept: it is told the choices."""
    system = planner(runtime, None)._system_prompt()
    assert "the category must be one of these" in system
    assert (
        "  - lookups: Looking things up; never changes anything, never calls outside."
        " (read tools only; no external tools)" in system
    )
    assert "  - refunds: Refunds and telling the customer. (tools get_invoice, lookup_customer, issue_refund," in system
    assert "  - maintenance: Operators' housekeeping; the roles and deny rules still apply. (every tool)" in system
    assert "category must be one of" not in planner(runtime, None, policy=None)._system_prompt()
