"""Pydantic AI's own per-call approval, for comparison: ``requires_approval=True`` and deferred tool requests.

The same task as :mod:`examples.integrations.pydantic_ai_recipe`: the run ends with the
refund call waiting; a person approves that call; a second run with the decision carries it out.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

from pydantic_ai import Agent, DeferredToolRequests

from examples import business
from plangate import RunContext


def refund_agent(model: Any) -> Agent[None, str | DeferredToolRequests]:
    agent: Agent[None, str | DeferredToolRequests] = Agent(model, output_type=[str, DeferredToolRequests])

    @agent.tool_plain
    def get_invoice(invoice_id: str) -> dict[str, Any]:
        """Fetch one invoice."""
        return business.get_invoice(invoice_id).model_dump()

    @agent.tool_plain(requires_approval=True)
    def issue_refund(invoice_id: str, amount: float) -> dict[str, Any]:
        """Refund part or all of a paid invoice."""
        ctx = RunContext(plan_id=str(uuid4()), step_id=1, now=datetime.now(UTC))
        return business.issue_refund(invoice_id, amount, ctx=ctx).model_dump()

    return agent


async def run_with_approval(model: Any, task: str, decide: Any) -> Any:
    agent = refund_agent(model)
    result = await agent.run(task)
    while isinstance(result.output, DeferredToolRequests):
        approvals = {call.tool_call_id: await decide(call.tool_name, call.args) for call in result.output.approvals}
        decisions = result.output.build_results(approvals=approvals)
        result = await agent.run(message_history=result.all_messages(), deferred_tool_results=decisions)
    return result


# --- the demo: not part of the recipe ---


async def demo() -> dict[str, Any]:
    """The run stops at the refund; a person says yes; the refund runs."""
    from examples.integrations.pydantic_ai_recipe import scripted_model

    asked: list[Any] = []

    async def decide(tool: str, args: Any) -> bool:
        asked.append((tool, business.effect_counts()))
        return True

    result = await run_with_approval(scripted_model(), "Refund invoice 42", decide)
    return {"asked": asked, "final": result.output, "effects_after": business.effect_counts()}


def main() -> None:
    import asyncio

    outcome = asyncio.run(demo())
    print(f"asked to approve: {outcome['asked'][0][0]}, effects before {outcome['asked'][0][1]}")
    print(f"after yes: {outcome['effects_after']}; the agent says {outcome['final']!r}")


if __name__ == "__main__":
    main()
