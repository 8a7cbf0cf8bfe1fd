"""The OpenAI Agents SDK's own per-call approval, for comparison: ``needs_approval=True`` on the tool that writes.

The same task as :mod:`examples.integrations.openai_agents_recipe`: the run stops at the
refund call, a person approves that one call in the run's state, and the run goes on.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

from agents import Agent, Model, RunConfig, Runner, function_tool

from examples import business
from plangate import RunContext


@function_tool
def get_invoice(invoice_id: str) -> str:
    """Fetch one invoice."""
    return business.get_invoice(invoice_id).model_dump_json()


@function_tool(needs_approval=True)
def issue_refund(invoice_id: str, amount: float) -> str:
    """Refund part or all of a paid invoice."""
    ctx = RunContext(plan_id=str(uuid4()), step_id=1, now=datetime.now(UTC))
    return business.issue_refund(invoice_id, amount, ctx=ctx).model_dump_json()


async def run_with_approval(model: Model, task: str, decide: Any) -> Any:
    agent = Agent(name="refunds", model=model, tools=[get_invoice, issue_refund])
    config = RunConfig(tracing_disabled=True)
    result = await Runner.run(agent, task, run_config=config)
    while result.interruptions:
        state = result.to_state()
        for item in result.interruptions:
            if await decide(item.tool_name, item.arguments):
                state.approve(item)
            else:
                state.reject(item)
        result = await Runner.run(agent, state, run_config=config)
    return result


# --- the demo: not part of the recipe ---


async def demo() -> dict[str, Any]:
    """The run stops at the refund; a person says yes; the refund runs."""
    from agents.testing import ScriptedModel, assistant_message, function_call

    model = ScriptedModel(
        [
            [function_call("get_invoice", {"invoice_id": "42"}, call_id="c1")],
            [function_call("issue_refund", {"invoice_id": "42", "amount": 120.0}, call_id="c2")],
            [assistant_message("Refunded.")],
        ]
    )
    asked: list[tuple[str, dict[str, int]]] = []

    async def decide(tool: str, arguments: str | None) -> bool:
        asked.append((tool, business.effect_counts()))
        return True

    result = await run_with_approval(model, "Refund invoice 42", decide)
    return {"asked": asked, "final": result.final_output, "effects_after": business.effect_counts()}


def main() -> None:
    import asyncio

    outcome = asyncio.run(demo())
    print(f"asked to approve: {outcome['asked'][0][0]}, effects before {outcome['asked'][0][1]}")
    print(f"after yes: {outcome['effects_after']}; the agent says {outcome['final']!r}")


if __name__ == "__main__":
    main()
