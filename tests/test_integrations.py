"""The recipes (examples/integrations/): each runs offline end to end on its framework's own test model,
no effect happens before a person approves, and docs/integrations.md counts their lines truly."""

from __future__ import annotations

import ast
import asyncio
import importlib
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from plangate import Runtime, StateError
from plangate._extras import MissingExtraError
from tests.conftest import EXAMPLES, ROOT

RECIPES = EXAMPLES / "integrations"
DEMO_MARK = "# --- the demo: not part of the recipe ---"


def test_langgraph_the_graph_waits_for_plangate_and_runs_the_approved_plan(tmp_path: Path) -> None:
    from examples.integrations import langgraph_recipe

    outcome = asyncio.run(langgraph_recipe.demo(str(tmp_path)))
    assert outcome["asked"]["needs"] == ("a person",)
    assert outcome["waits_again"] and outcome["effects_before"] == {}
    assert outcome["status"] == "succeeded" and outcome["outputs"][2]["amount"] == 120.0
    assert outcome["effects_after"] == {"refund": 1}
    runtime = Runtime(db=f"sqlite:///{tmp_path}/plangate.db")
    kinds = [(e.kind, e.actor) for e in runtime.trace(outcome["asked"]["plan_id"])]
    assert ("plan.approval", "dave") in kinds and kinds[0] == ("plan.submitted", "alice")


def test_langgraph_resumes_without_an_approval_never_make_the_effect(tmp_path: Path) -> None:
    from examples import business
    from examples.integrations import _demo, langgraph_recipe
    from langgraph.types import Command

    async def go() -> tuple[dict[str, Any], str]:
        runtime = _demo.runtime(tmp_path)
        graph = langgraph_recipe.governed_graph(runtime, _demo.written_plan, _demo.REQUESTER)
        config: Any = {"configurable": {"thread_id": "t"}}
        state = await graph.ainvoke({"task": _demo.TASK}, config)
        plan_id = state["__interrupt__"][0].value["plan_id"]
        for value in (True, "approved", {"plan_id": plan_id, "approved": True}):
            state = await graph.ainvoke(Command(resume=value), config)
            assert "__interrupt__" in state and "outputs" not in state
        with pytest.raises(StateError, match="not approved: it needs approval by a person"):
            await runtime.aexecute(plan_id)
        await runtime.areject(plan_id, _demo.APPROVER, "not this one")
        state = await graph.ainvoke(Command(resume="go"), config)
        runtime.close()
        return state, plan_id

    state, _ = asyncio.run(go())
    assert state["status"] == "rejected" and "__interrupt__" not in state and "outputs" not in state
    assert business.effect_counts() == {}


def test_openai_agents_the_tool_answers_with_the_plan_id_and_the_run_goes_on_once_approved(tmp_path: Path) -> None:
    from examples.integrations import openai_agents_recipe

    outcome = asyncio.run(openai_agents_recipe.demo(str(tmp_path)))
    assert outcome["proposed"]["status"] == "pending_approval" and outcome["proposed"]["needs"] == ["a person"]
    assert outcome["proposed"]["problems"] == []
    assert outcome["early"] == {
        "plan_id": outcome["proposed"]["plan_id"],
        "status": "pending_approval",
        "needs": ["a person"],
    }
    assert outcome["effects_before"] == {}
    assert outcome["ran"]["status"] == "succeeded" and outcome["ran"]["outputs"]["2"]["amount"] == 120.0
    assert outcome["final"] == "Refunded."


def test_pydantic_ai_the_calls_are_one_plan_approved_then_run(tmp_path: Path) -> None:
    from examples.integrations import pydantic_ai_recipe

    outcome = asyncio.run(pydantic_ai_recipe.demo(str(tmp_path)))
    assert outcome["steps"] == ["get_invoice", "issue_refund"] and outcome["record"].needs == ("a person",)
    assert outcome["effects_before"] == {}
    assert outcome["result"].ok and outcome["result"].outputs[2]["amount"] == 120.0


def test_pydantic_ai_a_read_runs_at_once_as_a_plan_of_its_own_and_a_write_is_only_held(tmp_path: Path) -> None:
    from examples import business
    from examples.integrations import _demo, pydantic_ai_recipe
    from pydantic_ai import Agent

    from plangate.integrations.pydantic_ai import PlanGateToolset

    async def go() -> tuple[PlanGateToolset, Any, list[Any]]:
        runtime = _demo.runtime(tmp_path)
        toolset = PlanGateToolset(
            runtime, requester="alice", task=_demo.TASK, category="refunds", read_category="lookups"
        )
        result = await Agent(pydantic_ai_recipe.scripted_model(), toolsets=[toolset]).run(_demo.TASK)
        reads = [await runtime.aget(plan_id) for plan_id in toolset.ran_at_once]
        runtime.close()
        return toolset, result.output, reads

    toolset, said, reads = asyncio.run(go())
    assert [(r.category, r.status, r.requested_by) for r in reads] == [("lookups", "succeeded", "alice")]
    assert said == "The refund waits for approval."
    assert toolset.plan()["steps"][1]["params"] == {"invoice_id": "42", "amount": 120.0}
    assert business.effect_counts() == {}


def calls(*script: tuple[str, dict[str, Any]]) -> Any:
    """A FunctionModel that makes these calls in turn, each after the answer to the one before, then stops."""
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel

    seen: list[Any] = []

    def respond(messages: list[Any], info: Any) -> ModelResponse:
        last = [p for p in getattr(messages[-1], "parts", []) if p.part_kind in ("tool-return", "retry-prompt")]
        seen.extend(p.content if isinstance(p, ToolReturnPart) else p.model_response() for p in last)
        if len(seen) == len(script):
            return ModelResponse(parts=[TextPart("done")])
        name, args = script[len(seen)]
        return ModelResponse(parts=[ToolCallPart(name, args)])

    model = FunctionModel(respond)
    model.seen = seen  # type: ignore[attr-defined]
    return model


def test_pydantic_ai_without_a_read_category_every_call_is_held_and_refers_to_earlier_steps(tmp_path: Path) -> None:
    from examples import business
    from examples.integrations import _demo
    from pydantic_ai import Agent

    from plangate.integrations.pydantic_ai import PlanGateToolset

    model = calls(
        ("get_invoice", {"invoice_id": "42"}),
        ("issue_refund", {"invoice_id": "42", "amount": "${1.total}"}),
    )

    async def go() -> tuple[PlanGateToolset, Any, Any]:
        runtime = _demo.runtime(tmp_path)
        toolset = PlanGateToolset(runtime, requester="alice", task=_demo.TASK, category="refunds")
        await Agent(model, toolsets=[toolset]).run(_demo.TASK)
        record = await toolset.submit()
        await runtime.aapprove(record.id, "dave", record.hash)
        result = await runtime.aexecute(record.id)
        runtime.close()
        return toolset, record, result

    toolset, record, result = asyncio.run(go())
    assert toolset.ran_at_once == []
    assert model.seen[0] == {
        "held": "step 1 of the plan, run only after the plan is approved",
        "refer_to_output_as": "${1}",
    }
    assert record.status == "pending_approval" and record.violations == ()
    assert result.ok and result.outputs[2]["amount"] == 120.0 and business.effect_counts() == {"refund": 1}


def test_pydantic_ai_a_call_plangate_would_refuse_goes_back_to_the_model_at_once(tmp_path: Path) -> None:
    from examples.integrations import _demo
    from pydantic_ai import Agent

    from plangate.integrations.pydantic_ai import PlanGateToolset

    model = calls(
        ("issue_refund", {"invoice_id": "42", "amount": "120"}),
        ("run_sql", {"query": "DELETE FROM invoices"}),
        ("issue_refund", {"invoice_id": "42", "amount": 120.0}),
    )

    async def go() -> PlanGateToolset:
        runtime = _demo.runtime(tmp_path)
        toolset = PlanGateToolset(runtime, requester="alice", task=_demo.TASK, category="refunds")
        await Agent(model, toolsets=[toolset]).run(_demo.TASK)
        runtime.close()
        return toolset

    toolset = asyncio.run(go())
    assert "plangate would refuse this call" in model.seen[0] and "amount" in model.seen[0]
    assert "plangate would refuse this call" in model.seen[1] and "run_sql" in model.seen[1]
    assert [step["tool"] for step in toolset.plan()["steps"]] == ["issue_refund"]
    assert toolset.plan()["steps"][0]["id"] == 1


def test_pydantic_ai_toolset_refuses_an_empty_plan_and_a_runtime_without_tools(tmp_path: Path) -> None:
    from examples.integrations import _demo

    from plangate.integrations.pydantic_ai import PlanGateToolset

    runtime = _demo.runtime(tmp_path)
    with pytest.raises(ValueError, match="no plan to submit"):
        asyncio.run(PlanGateToolset(runtime, requester="alice", task="t", category="refunds").submit())
    with pytest.raises(ValueError, match="has no catalogue"):
        PlanGateToolset(Runtime(db=runtime.store), requester="alice", task="t", category="refunds")
    runtime.close()


def test_pydantic_ai_toolset_without_its_extra_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pydantic_ai", None)
    monkeypatch.delitem(sys.modules, "plangate.integrations.pydantic_ai", raising=False)
    with pytest.raises(MissingExtraError, match=r"needs the pydantic-ai extra: pip install 'plangate\[pydantic-ai\]'"):
        importlib.import_module("plangate.integrations.pydantic_ai")


def test_fastapi_your_routes_and_the_mounted_dashboard_share_one_store(tmp_path: Path) -> None:
    from examples.integrations import fastapi_mount

    outcome = fastapi_mount.demo(str(tmp_path))
    assert outcome["asked"]["status"] == "pending_approval" and outcome["asked"]["needs"] == ["a person"]
    assert outcome["early"][0] == 409 and "not approved" in outcome["early"][1]
    assert outcome["effects_before"] == {}
    assert outcome["login_url"] == "https://intranet.example/gov/"
    assert outcome["approved_url"].startswith(
        f"https://intranet.example/gov/plans/{outcome['asked']['plan_id']}?flash="
    )
    assert outcome["ran"]["status"] == "succeeded" and outcome["effects_after"] == {"refund": 1}


@pytest.mark.parametrize(
    "module",
    ["langgraph_percall", "openai_agents_percall", "pydantic_ai_percall"],
)
def test_the_per_call_versions_ask_before_the_refund_and_make_it_after_yes(module: str) -> None:
    from examples import business

    demo = importlib.import_module(f"examples.integrations.{module}").demo
    outcome = asyncio.run(demo())
    assert outcome["asked"] == [("issue_refund", {})]  # asked about the refund alone, before any effect
    assert business.effect_counts() == {"refund": 1}


@pytest.mark.parametrize("path", sorted(RECIPES.glob("[!_]*.py")), ids=lambda p: p.stem)
def test_every_recipe_runs_from_its_main(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    importlib.import_module(f"examples.integrations.{path.stem}").main()
    printed = capsys.readouterr().out
    assert printed.count("\n") >= 2 and "Traceback" not in printed


def recipe_lines(path: Path) -> int:
    """The lines a user writes: above the demo mark, neither blank, nor a comment, nor a docstring,
    nor ``from __future__``."""
    text = path.read_text()
    glue = text[: text.index(DEMO_MARK)]
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(glue)):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            docstrings.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    return sum(
        1
        for number, line in enumerate(glue.splitlines(), start=1)
        if line.strip()
        and not line.strip().startswith("#")
        and number not in docstrings
        and line.strip() != "from __future__ import annotations"
    )


def test_the_docs_table_counts_the_recipes_lines_truly() -> None:
    table = re.findall(
        r"^\| (\w[\w ]*?) \| `(\w+)\.py`: (\d+) \| `(\w+)\.py`: (\d+) \|$",
        (ROOT / "docs" / "integrations.md").read_text(),
        re.MULTILINE,
    )
    assert {row[0] for row in table} == {"LangGraph", "OpenAI Agents SDK", "Pydantic AI"}
    for _, recipe, count, percall, percall_count in table:
        assert recipe_lines(RECIPES / f"{recipe}.py") == int(count), recipe
        assert recipe_lines(RECIPES / f"{percall}.py") == int(percall_count), percall


def test_the_docs_show_the_recipes_own_text() -> None:
    shown = re.findall(
        r"^```python\n(.*?)^```", (ROOT / "docs" / "integrations.md").read_text(), re.MULTILINE | re.DOTALL
    )
    modules = {path.stem: path.read_text() for path in RECIPES.glob("[!_]*.py")}
    assert len(shown) == 4
    for block in shown:
        holders = [name for name, text in modules.items() if block in text.split(DEMO_MARK)[0]]
        assert len(holders) == 1, block[:80]
