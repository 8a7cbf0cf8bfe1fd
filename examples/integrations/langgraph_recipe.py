"""LangGraph: a node submits the plan its model wrote to plangate, and the graph interrupts until plangate runs it.

The graph holds the plan's id, never the right to run it: a resume only makes the graph ask
plangate again, and plangate runs the plan once a person has approved exactly that version.
"""

from __future__ import annotations

from typing import Any, TypedDict

from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt

from plangate import Runtime


class State(TypedDict, total=False):
    task: str
    plan: dict[str, Any]
    plan_id: str
    status: str
    outputs: dict[int, Any]


def governed_graph(runtime: Runtime, write_plan: Any, requester: str) -> Any:
    async def model(state: State) -> State:
        return {"plan": write_plan(state["task"])}

    async def submit(state: State) -> State:
        record = await runtime.asubmit(state["plan"], requested_by=requester)
        return {"plan_id": record.id, "status": record.status}

    async def wait_and_run(state: State) -> State:
        record = await runtime.aget(state["plan_id"])
        if record.status == "pending_approval":
            interrupt({"plan_id": record.id, "hash": record.hash, "needs": record.needs})
            record = await runtime.aget(state["plan_id"])  # resumed: plangate, not the resume value, decides
        if record.status != "approved":
            return {"status": record.status}
        result = await runtime.aexecute(record.id)
        return {"status": result.status, "outputs": result.outputs}

    def again(state: State) -> str:
        return "wait_and_run" if state["status"] == "pending_approval" else END

    graph = StateGraph(State)
    graph.add_node("model", model)
    graph.add_node("submit", submit)
    graph.add_node("wait_and_run", wait_and_run)
    graph.add_edge(START, "model")
    graph.add_edge("model", "submit")
    graph.add_edge("submit", "wait_and_run")
    graph.add_conditional_edges("wait_and_run", again)
    return graph.compile(checkpointer=InMemorySaver())


# --- the demo: not part of the recipe ---


async def demo(folder: str) -> dict[str, Any]:
    """Submit, resume without an approval (nothing happens), approve as another person, resume: the refund runs."""
    from langgraph.types import Command

    from examples import business
    from examples.integrations import _demo

    runtime = _demo.runtime(folder)
    graph = governed_graph(runtime, _demo.written_plan, _demo.REQUESTER)
    config: Any = {"configurable": {"thread_id": "refund-42"}}
    paused = await graph.ainvoke({"task": _demo.TASK}, config)
    asked = paused["__interrupt__"][0].value
    again = await graph.ainvoke(Command(resume="approved, trust me"), config)  # no approval: the graph waits again
    effects_before = business.effect_counts()
    await runtime.aapprove(asked["plan_id"], _demo.APPROVER, asked["hash"])  # a person, on the dashboard or the CLI
    done = await graph.ainvoke(Command(resume="approved"), config)
    runtime.close()
    return {
        "asked": asked,
        "waits_again": "__interrupt__" in again,
        "effects_before": effects_before,
        "status": done["status"],
        "outputs": done["outputs"],
        "effects_after": business.effect_counts(),
    }


def main() -> None:
    import asyncio
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        outcome = asyncio.run(demo(folder))
    print(f"plangate asked for: {', '.join(outcome['asked']['needs'])}")
    print(f"resumed without an approval: waits again = {outcome['waits_again']}, effects {outcome['effects_before']}")
    print(f"after the approval: {outcome['status']}, refund {outcome['outputs'][2]['refund_id'][:6]}...")


if __name__ == "__main__":
    main()
