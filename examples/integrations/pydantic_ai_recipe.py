"""Pydantic AI: the agent's tool calls become one governed plan.

:class:`~plangate.integrations.pydantic_ai.PlanGateToolset` offers the catalogue's tools. The
invoice is read at once (the policy approves a lone read by itself); the refund is only
collected. When the run ends the calls are submitted as one plan, a person approves it, and
plangate runs it.
"""

from __future__ import annotations

from typing import Any

from pydantic_ai import Agent

from plangate import PlanRecord, RunResult, Runtime
from plangate.integrations.pydantic_ai import PlanGateToolset


async def propose(runtime: Runtime, model: Any, task: str, requester: str) -> PlanRecord:
    toolset = PlanGateToolset(runtime, requester=requester, task=task, category="refunds", read_category="lookups")
    await Agent(model, toolsets=[toolset]).run(task)
    return await toolset.submit()


async def run_approved(runtime: Runtime, plan_id: str) -> RunResult:
    return await runtime.aexecute(plan_id)


# --- the demo: not part of the recipe ---


def scripted_model() -> Any:
    """Pydantic AI's FunctionModel: read the invoice, refund its total, then say so."""
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel

    def respond(messages: list[Any], info: Any) -> ModelResponse:
        returned = [p for m in messages for p in getattr(m, "parts", []) if isinstance(p, ToolReturnPart)]
        if not returned:
            return ModelResponse(parts=[ToolCallPart("get_invoice", {"invoice_id": "42"})])
        if len(returned) == 1:
            total = returned[0].content["total"]
            return ModelResponse(parts=[ToolCallPart("issue_refund", {"invoice_id": "42", "amount": total})])
        held = isinstance(returned[-1].content, dict) and "held" in returned[-1].content
        return ModelResponse(parts=[TextPart("The refund waits for approval." if held else "Refunded.")])

    return FunctionModel(respond)


async def demo(folder: str) -> dict[str, Any]:
    """The agent runs; its calls are one plan; nothing is refunded until a person approves; then plangate runs it."""
    from examples import business
    from examples.integrations import _demo

    runtime = _demo.runtime(folder)
    record = await propose(runtime, scripted_model(), _demo.TASK, _demo.REQUESTER)
    effects_before = business.effect_counts()
    await runtime.aapprove(record.id, _demo.APPROVER, record.hash)  # a person, on the dashboard or the CLI
    result = await run_approved(runtime, record.id)
    runtime.close()
    assert record.plan is not None
    steps = [step.tool for step in record.plan.steps]
    return {"record": record, "steps": steps, "effects_before": effects_before, "result": result}


def main() -> None:
    import asyncio
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        outcome = asyncio.run(demo(folder))
    print(f"one plan of the agent's calls: {', '.join(outcome['steps'])}; needs {', '.join(outcome['record'].needs)}")
    print(f"before the approval: effects {outcome['effects_before']}")
    print(f"after the approval: {outcome['result']}")


if __name__ == "__main__":
    main()
