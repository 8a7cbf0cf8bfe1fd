"""The async API: the governed path awaited inside a running event loop, and the sync API refusing to block one."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from plangate import Catalogue, tool
from plangate.errors import UsageError
from plangate.models.test import ScriptedModel
from plangate.react import ReActAgent
from plangate.runtime import Runtime
from plangate.store import open_store
from tests.helpers import plan

EVENTS: list[str] = []
CALLED: Counter[str] = Counter()
LOOPS: list[asyncio.AbstractEventLoop] = []
STARTED = threading.Event()
GATE = threading.Event()


@tool
async def look_up(key: str) -> str:
    """Read a value (a coroutine: it runs on the engine's loop)."""
    LOOPS.append(asyncio.get_running_loop())
    await asyncio.sleep(0)
    CALLED[f"look_up:{key}"] += 1
    return f"value of {key}"


@tool(effect="write")
def write_down(key: str, value: str) -> str:
    """Write a value (a plain function: it runs on a thread)."""
    CALLED[f"write_down:{key}"] += 1
    return f"{key}={value}"


@tool(effect="write")
def held(label: str) -> str:
    """Wait until the test lets it go."""
    EVENTS.append(f"tool started {label}")
    STARTED.set()
    GATE.wait(30)
    EVENTS.append(f"tool ended {label}")
    return label


@tool(effect="write")
def refuse(reason: str) -> str:
    """Fail, always."""
    raise RuntimeError(reason)


CAT = Catalogue([look_up, write_down, held, refuse])


@pytest.fixture(autouse=True)
def fresh() -> None:
    EVENTS.clear()
    CALLED.clear()
    LOOPS.clear()
    STARTED.clear()
    GATE.clear()


def two_steps(key: str) -> dict[str, Any]:
    return plan(
        {"id": 1, "tool": "look_up", "params": {"key": key}},
        {"id": 2, "tool": "write_down", "params": {"key": key, "value": "${1}"}},
    )


async def approved(rt: Runtime, body: dict[str, Any]) -> str:
    record = await rt.asubmit(body, "ann")
    assert record.status == "pending_approval"
    record = await rt.aapprove(record.id, "ben", record.hash)
    assert record.status == "approved"
    return record.id


def test_the_governed_path_awaited_inside_a_loop(any_db: str) -> None:
    rt = Runtime(CAT, db=any_db)

    async def main() -> None:
        plan_id = await approved(rt, two_steps("a"))
        result = await rt.aexecute(plan_id)
        assert result.ok and result.outputs == {1: "value of a", 2: "a=value of a"}
        assert LOOPS and LOOPS[0] is not asyncio.get_running_loop(), "an async tool runs on the engine's loop"
        assert (await rt.aget(plan_id)).status == "succeeded"
        kinds = [e.kind for e in await rt.atrace(plan_id)]
        assert kinds[0] == "plan.submitted" and "plan.approved" in kinds and kinds[-1] == "run.succeeded"
        again = await rt.aexecute(plan_id)
        assert again.ok and CALLED == {"look_up:a": 1, "write_down:a": 1}, "a finished plan is not run again"

    asyncio.run(main())
    assert rt.store.verify_audit().ok
    rt.close()


def test_rejecting_and_editing_awaited(tmp_path: Path) -> None:
    rt = Runtime(CAT, db=f"sqlite:///{tmp_path}/p.db")

    async def main() -> None:
        first = await rt.asubmit(two_steps("a"), "ann")
        edited = await rt.aedit(first.id, two_steps("b"), "ann")
        assert edited.version == 2
        rejected = await rt.areject(first.id, "ben", "not this one", edited.hash)
        assert rejected.status == "rejected"

    asyncio.run(main())
    rt.close()


def test_many_plans_run_side_by_side_on_one_runtime(any_db: str) -> None:
    rt = Runtime(CAT, db=any_db)
    keys = [f"k{n}" for n in range(8)]

    async def main() -> None:
        ids = await asyncio.gather(*(approved(rt, two_steps(key)) for key in keys))
        results = await asyncio.gather(*(rt.aexecute(plan_id) for plan_id in ids))
        assert all(r.ok for r in results)
        records = await asyncio.gather(*(rt.aget(plan_id) for plan_id in ids))
        assert {r.status for r in records} == {"succeeded"}

    asyncio.run(main())
    once = Counter({f"{name}:{key}": 1 for key in keys for name in ("look_up", "write_down")})
    assert once == CALLED, "each step ran once"
    assert rt.store.verify_audit().ok
    rt.close()


def test_the_loop_goes_on_while_a_tool_runs(tmp_path: Path) -> None:
    rt = Runtime(CAT, db=f"sqlite:///{tmp_path}/p.db")

    async def main() -> None:
        plan_id = await approved(rt, plan({"id": 1, "tool": "held", "params": {"label": "slow"}}))
        run = asyncio.create_task(rt.aexecute(plan_id))
        await asyncio.to_thread(STARTED.wait, 30)
        other = await rt.asubmit(two_steps("meanwhile"), "ann")  # another task's work, on the same runtime
        EVENTS.append(f"other task submitted: {other.status}")
        GATE.set()
        assert (await run).ok
        EVENTS.append("run awaited")

    asyncio.run(main())
    assert EVENTS == [
        "tool started slow",
        "other task submitted: pending_approval",
        "tool ended slow",
        "run awaited",
    ]
    rt.close()


def test_a_cancelled_await_leaves_the_run_to_end_as_recorded(tmp_path: Path) -> None:
    rt = Runtime(CAT, db=f"sqlite:///{tmp_path}/p.db")

    async def main() -> str:
        plan_id = await approved(rt, plan({"id": 1, "tool": "held", "params": {"label": "x"}}))
        run = asyncio.create_task(rt.aexecute(plan_id))
        await asyncio.to_thread(STARTED.wait, 30)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        assert (await rt.aget(plan_id)).status == "running", "the run goes on without the task that awaited it"
        GATE.set()
        for _ in range(3000):
            if (await rt.aget(plan_id)).status != "running":
                break
            await asyncio.sleep(0.01)
        return plan_id

    plan_id = asyncio.run(main())
    assert rt.get(plan_id).status == "succeeded"
    assert EVENTS == ["tool started x", "tool ended x"], "the step ran once, to its end"
    assert [e.kind for e in rt.trace(plan_id)][-2:] == ["step.succeeded", "run.succeeded"]
    assert rt.store.verify_audit().ok
    rt.close()


def test_a_store_in_memory_is_used_in_turns_through_a_halt_and_its_closing() -> None:
    rt = Runtime(CAT, db="sqlite:///:memory:")

    async def main() -> None:
        plan_id = await approved(rt, plan({"id": 1, "tool": "refuse", "params": {"reason": "no"}}))
        first, second = await asyncio.gather(rt.aexecute(plan_id), rt.aget(plan_id))
        assert first.status == "halted" and "RuntimeError: no" in (first.error or "")
        assert second.status in ("approved", "halted"), "the read took its turn before or after the run"
        assert (await rt.aresume(plan_id)).status == "halted"
        closed = await rt.aclose_plan(plan_id, actor="ben", reason="not worth another try")
        assert closed.status == "closed"

    asyncio.run(main())
    assert rt.store.verify_audit().ok
    rt.close()


def test_the_sync_runs_refuse_a_running_loop_and_say_what_to_use(tmp_path: Path) -> None:
    rt = Runtime(CAT, db=f"sqlite:///{tmp_path}/p.db")
    agent = ReActAgent(ScriptedModel(["Final Answer: no"]), CAT, rt.store)

    async def main() -> str:
        plan_id = await approved(rt, two_steps("a"))
        with pytest.raises(UsageError) as refused:
            rt.execute(plan_id)
        assert str(refused.value) == (
            "Runtime.execute was called inside a running event loop, which it would block while tools run: "
            "use `await runtime.aexecute(...)`"
        )
        for call, instead in (
            (lambda: rt.resume(plan_id), "runtime.aresume"),
            (lambda: rt.compensate(plan_id, actor="cat", reason="undo"), "runtime.acompensate"),
            (lambda: agent.run("why?"), "agent.arun"),
            (lambda: agent.resume(plan_id), "agent.aresume"),
        ):
            with pytest.raises(UsageError, match=f"use `await {instead}"):
                call()
        record = rt.submit(two_steps("quick"), "ann")  # a decision is a short write: allowed, and it blocks that long
        assert record.status == "pending_approval"
        return plan_id

    plan_id = asyncio.run(main())
    assert rt.get(plan_id).status == "approved" and not CALLED, "nothing ran"
    assert rt.execute(plan_id).ok, "outside a loop the sync API runs as before"
    rt.close()


def test_react_arun_inside_a_loop_with_an_async_tool(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/p.db")
    model = ScriptedModel(['Thought: look it up.\nAction: look_up {"key": "q"}', "Thought: done.\nFinal Answer: found"])
    agent = ReActAgent(model, CAT, store)

    async def main() -> None:
        result = await agent.arun("What is q?")
        assert result.status == "answered" and result.answer == "found"
        assert result.steps[0].observation == "value of q", "a coroutine tool is awaited, not handed back"

    asyncio.run(main())
    assert CALLED == {"look_up:q": 1}
    assert store.verify_audit().ok
    store.close()


def test_a_fastapi_app_drives_the_governed_path_with_the_async_api(tmp_path: Path) -> None:
    rt = Runtime(CAT, db=f"sqlite:///{tmp_path}/p.db")
    app = FastAPI()

    @app.post("/plans")
    async def submit(body: dict[str, Any]) -> dict[str, Any]:
        record = await rt.asubmit(body, "ann")
        return {"id": record.id, "hash": record.hash, "status": record.status}

    @app.post("/plans/{plan_id}/approve")
    async def approve(plan_id: str, body: dict[str, str]) -> dict[str, str]:
        return {"status": (await rt.aapprove(plan_id, "ben", body["hash"])).status}

    @app.post("/plans/{plan_id}/run")
    async def run(plan_id: str) -> dict[str, Any]:
        result = await rt.aexecute(plan_id)
        return {"status": result.status, "outputs": {str(k): v for k, v in result.outputs.items()}}

    with TestClient(app) as client:
        made = client.post("/plans", json=two_steps("web")).json()
        assert made["status"] == "pending_approval"
        assert client.post(f"/plans/{made['id']}/approve", json={"hash": made["hash"]}).json() == {"status": "approved"}
        ran = client.post(f"/plans/{made['id']}/run").json()
    assert ran == {"status": "succeeded", "outputs": {"1": "value of web", "2": "web=value of web"}}
    rt.close()
