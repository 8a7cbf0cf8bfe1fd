"""LangGraph's own per-call approval, for comparison: a tools node interrupts before each call that writes.

The same task as :mod:`examples.integrations.langgraph_recipe`: a person says yes or no to one
tool call at a time, with the arguments the model chose; nothing checks the calls against a
policy, records them, or can resume the run after a crash from what was recorded.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TypedDict
from uuid import uuid4

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from examples import business
from plangate import RunContext

WRITES = {"issue_refund"}


class State(TypedDict, total=False):
    task: str
    calls: list[dict[str, Any]]
    outputs: list[Any]


def per_call_graph(write_calls: Any) -> Any:
    async def model(state: State) -> State:
        return {"calls": write_calls(state["task"])}

    async def tools(state: State) -> State:
        outputs: list[Any] = []
        for call in state["calls"]:
            if call["tool"] in WRITES and not interrupt({"approve": call}):
                outputs.append("refused by a person")
                continue
            tool = getattr(business, call["tool"])
            ctx = {"ctx": RunContext(plan_id=str(uuid4()), step_id=1, now=datetime.now(UTC))}
            outputs.append(tool(**call["args"], **(ctx if tool.ctx_param else {})))
        return {"outputs": outputs}

    graph = StateGraph(State)
    graph.add_node("model", model)
    graph.add_node("tools", tools)
    graph.add_edge(START, "model")
    graph.add_edge("model", "tools")
    graph.add_edge("tools", END)
    return graph.compile(checkpointer=InMemorySaver())


# --- the demo: not part of the recipe ---


def written_calls(task: str) -> list[dict[str, Any]]:
    """The calls a model makes for the task, one at a time (the amount read off the invoice by the model)."""
    return [
        {"tool": "get_invoice", "args": {"invoice_id": "42"}},
        {"tool": "issue_refund", "args": {"invoice_id": "42", "amount": 120.0}},
    ]


async def demo() -> dict[str, Any]:
    """The graph pauses before the refund; a person says yes; the refund runs."""
    from langgraph.types import Command

    graph = per_call_graph(written_calls)
    config: Any = {"configurable": {"thread_id": "refund-42"}}
    paused = await graph.ainvoke({"task": "Refund invoice 42"}, config)
    asked = paused["__interrupt__"][0].value
    effects_before = business.effect_counts()
    done = await graph.ainvoke(Command(resume=True), config)
    return {"asked": [(asked["approve"]["tool"], effects_before)], "outputs": done["outputs"]}


def main() -> None:
    import asyncio

    outcome = asyncio.run(demo())
    print(f"asked to approve: {outcome['asked'][0][0]}, effects before {outcome['asked'][0][1]}")
    print(f"after yes: refund {outcome['outputs'][1].refund_id[:6]}...")


if __name__ == "__main__":
    main()
