"""The OpenAI Agents SDK: a tool submits the plan the agent wrote and answers with its id and what it needs.

The agent never runs an effect itself. Its second tool asks plangate to run the plan, which
plangate does only once a person has approved that exact version; before that the tool
answers with what the plan still needs, and nothing happens.
"""

from __future__ import annotations

import json
from typing import Any

from agents import FunctionTool, function_tool

from plangate import Runtime


def plangate_tools(runtime: Runtime, requester: str) -> list[FunctionTool]:
    @function_tool
    async def propose_plan(plan_json: str) -> str:
        """Submit a plan (plangate's plan JSON) for checking and approval; returns its id and what it needs.

        Args:
            plan_json: The plan: task, category and steps over the catalogue's tools.
        """
        record = await runtime.asubmit(plan_json, requested_by=requester)
        problems = [f"step {v.step}: {v.message}" for v in record.violations]
        return json.dumps({"plan_id": record.id, "status": record.status, "needs": record.needs, "problems": problems})

    @function_tool
    async def run_approved_plan(plan_id: str) -> str:
        """Run a plan once it is approved; until then, say what it still needs.

        Args:
            plan_id: The id propose_plan returned.
        """
        record = await runtime.aget(plan_id)
        if record.status not in ("approved", "running", "halted", "succeeded"):
            return json.dumps({"plan_id": plan_id, "status": record.status, "needs": record.needs})
        result = await runtime.aexecute(plan_id)
        return json.dumps(
            {"plan_id": plan_id, "status": result.status, "outputs": result.outputs, "error": result.error}
        )

    return [propose_plan, run_approved_plan]


# --- the demo: not part of the recipe ---


async def demo(folder: str) -> dict[str, Any]:
    """Run 1 proposes the plan and tries to run it early; a person approves; run 2 runs it."""
    from agents import Agent, RunConfig, Runner
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    from examples import business
    from examples.integrations import _demo

    runtime = _demo.runtime(folder)
    plan = json.dumps(_demo.written_plan(_demo.TASK))
    model = ScriptedModel(
        [
            [function_call("propose_plan", {"plan_json": plan}, call_id="c1")],
            ModelStep.respond(_run_the_proposed_plan("c2")),
            [assistant_message("Submitted; it waits for a person's approval.")],
        ]
    )
    agent = Agent(name="refunds", instructions="Plan, then run once approved.", model=model)
    agent.tools = plangate_tools(runtime, _demo.REQUESTER)
    config = RunConfig(tracing_disabled=True)

    first = await Runner.run(agent, _demo.TASK, run_config=config)
    proposed = json.loads(_outputs(first)[0])
    early = json.loads(_outputs(first)[1])
    effects_before = business.effect_counts()
    record = await runtime.aget(proposed["plan_id"])
    await runtime.aapprove(record.id, _demo.APPROVER, record.hash)  # a person, on the dashboard or the CLI
    model.extend(
        [
            ModelStep.respond(_run_the_proposed_plan("c3")),
            [assistant_message("Refunded.")],
        ]
    )
    second = await Runner.run(
        agent, [*first.to_input_list(), {"role": "user", "content": "Approved."}], run_config=config
    )
    ran = json.loads(_outputs(second)[-1])
    runtime.close()
    return {
        "proposed": proposed,
        "early": early,
        "effects_before": effects_before,
        "ran": ran,
        "final": second.final_output,
    }


def _run_the_proposed_plan(call_id: str) -> Any:
    """The scripted model reads the plan id off propose_plan's answer, as a real model would."""
    from agents.testing import function_call

    def respond(call: Any) -> Any:
        answers = [item["output"] for item in call.input if isinstance(item, dict) and "output" in item]
        plan_id = next(json.loads(a)["plan_id"] for a in answers if "status" in json.loads(a))
        return [function_call("run_approved_plan", {"plan_id": plan_id}, call_id=call_id)]

    return respond


def _outputs(result: Any) -> list[str]:
    return [item.output for item in result.new_items if item.type == "tool_call_output_item"]


def main() -> None:
    import asyncio
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        outcome = asyncio.run(demo(folder))
    print(f"proposed: {outcome['proposed']['status']}, needs {', '.join(outcome['proposed']['needs'])}")
    print(f"run before the approval: {outcome['early']['status']}, effects {outcome['effects_before']}")
    print(f"after the approval: {outcome['ran']['status']}; the agent says {outcome['final']!r}")


if __name__ == "__main__":
    main()
