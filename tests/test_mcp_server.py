"""``plangate mcp serve`` driven by the official MCP SDK's client: a real server process, over stdio and HTTP.

Reads run at once when the policy clears them; a call of a tool with an effect only
proposes a plan, and nothing happens until a person approves it and it is executed.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from examples.business import effect_counts
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from plangate import Catalogue, Policy, Runtime
from plangate.accounts import Accounts
from plangate.cli import main
from plangate.errors import SignInRequiredError
from plangate.mcpserver import Gate
from tests.conftest import EXAMPLES, load_plan

TOOLS = str(EXAMPLES / "business.py")
POLICY = str(EXAMPLES / "policy.yaml")
OWN = {"plangate_submit_plan", "plangate_draft_add", "plangate_draft_submit", "plangate_plan_status"}
OWN |= {"plangate_plan_result"}

Session = Callable[[ClientSession], Awaitable[None]]


def serve_args(db: str, *extra: str, policy: str = POLICY) -> list[str]:
    return ["-m", "plangate", "mcp", "serve", "--tools", TOOLS, "--policy", policy, "--db", db, *extra]


def over_stdio(db: str, body: Session, *extra: str, policy: str = POLICY) -> None:
    """Start ``plangate mcp serve`` as a subprocess on stdio and run ``body`` with a client session on it."""

    async def go() -> None:
        server = StdioServerParameters(
            command=sys.executable, args=serve_args(db, "--as", "alice", *extra, policy=policy), env=dict(os.environ)
        )
        async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            await body(session)

    anyio.run(go)


@contextlib.contextmanager
def over_http(tmp_path: Path, db: str, *extra: str, policy: str = POLICY) -> Any:
    """``plangate mcp serve --http`` on a free loopback port: its URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, *serve_args(db, "--as", "alice", "--http", f"127.0.0.1:{port}", *extra, policy=policy)]
    log = tmp_path / "mcp.log"
    with log.open("wb") as out, subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT) as process:
        try:
            deadline = time.monotonic() + 30
            while True:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
                assert process.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            process.terminate()
            process.wait(10)


@contextlib.asynccontextmanager
async def http_session(url: str) -> AsyncIterator[ClientSession]:
    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def runtime(db: str) -> Runtime:
    return Runtime(Catalogue.from_module(TOOLS), Policy.load(POLICY), db=db)


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/plangate.db"


async def call(session: ClientSession, name: str, arguments: dict[str, Any]) -> tuple[bool, str, dict[str, Any]]:
    result = await session.call_tool(name, arguments)
    text = result.content[0].text  # type: ignore[union-attr]
    return bool(result.is_error), text, result.structured_content or {}


# -- what the client sees -------------------------------------------------------------------------


def test_the_client_sees_reads_and_writes_with_their_hints_and_the_catalogues_schemas(db: str) -> None:
    seen: dict[str, Any] = {}

    async def body(session: ClientSession) -> None:
        seen.update({tool.name: tool for tool in (await session.list_tools()).tools})

    over_stdio(db, body)
    catalogue = Catalogue.from_module(TOOLS)
    assert set(seen) == set(catalogue.names) | OWN  # no tool approves or executes
    for tool in catalogue:
        offered = seen[tool.name]
        assert offered.input_schema == tool.params_schema
        assert offered.annotations.read_only_hint is (tool.effect == "read")
        assert offered.annotations.destructive_hint is (tool.effect == "irreversible")
        assert offered.annotations.idempotent_hint is tool.idempotent
        assert offered.annotations.open_world_hint is tool.external
        assert offered.description.startswith(tool.description)
        proposes = "only proposes a one-step plan for approval" in offered.description
        assert proposes is (tool.effect != "read")
    assert seen["plangate_plan_status"].annotations.read_only_hint is True
    assert seen["plangate_submit_plan"].input_schema["required"] == ["task", "category", "steps"]


# -- reads run at once, writes wait ---------------------------------------------------------------


def test_a_read_runs_at_once_and_is_recorded_as_asked_over_mcp(db: str) -> None:
    answers: list[tuple[bool, str, dict[str, Any]]] = []

    async def body(session: ClientSession) -> None:
        answers.append(await call(session, "get_invoice", {"invoice_id": "42"}))

    over_stdio(db, body)
    error, text, data = answers[0]
    assert not error and json.loads(text)["total"] == 120.0
    assert data["status"] == "succeeded" and data["output"]["customer_id"] == "c-7"
    assert data["category"] == "lookups" and data["approved_by"] == ["policy:example-business"]
    rt = runtime(db)
    record = rt.get(data["plan_id"])
    assert record.requested_by == "alice" and record.status == "succeeded"
    events = rt.trace(record.id)
    assert events[0].kind == "plan.submitted" and events[0].data["via"] == "mcp" and events[0].actor == "alice"
    assert "step.succeeded" in [event.kind for event in events]
    assert effect_counts() == {}


def test_a_write_proposes_a_plan_and_nothing_happens_until_it_is_approved_and_executed(db: str) -> None:
    got: dict[str, Any] = {}

    async def body(session: ClientSession) -> None:
        error, text, data = await call(session, "issue_refund", {"invoice_id": "42", "amount": 20.0})
        assert not error and data["status"] == "pending_approval" and data["needs"] == ["a person"]
        assert f"http://127.0.0.1:8420/plans/{data['plan_id']}" in text and "nothing has run" in text
        assert effect_counts() == {}
        error, text, early = await call(session, "plangate_plan_result", {"plan_id": data["plan_id"][:8]})
        assert not error and early["outputs"] is None and "waits for approval" in early["why"]

        rt = runtime(db)
        rt.approve(data["plan_id"], "dave", data["hash"])
        assert effect_counts() == {}  # approved is not run: an MCP server never executes a write
        error, text, approved = await call(session, "plangate_plan_status", {"plan_id": data["plan_id"]})
        assert approved["status"] == "approved" and approved["approved_by"] == ["dave"]
        assert f"plangate execute {data['plan_id']}" in text
        command = ["execute", data["plan_id"], "--db", db, "--as", "bob"]  # as a person runs it: not in this loop
        done = await anyio.to_thread.run_sync(lambda: CliRunner().invoke(main, command))
        assert done.exit_code == 0, done.output

        got["status"] = await call(session, "plangate_plan_status", {"plan_id": data["plan_id"]})
        got["result"] = await call(session, "plangate_plan_result", {"plan_id": data["plan_id"]})

    over_stdio(db, body)
    assert effect_counts() == {"refund": 1}
    assert got["status"][2]["status"] == "succeeded"
    error, _, result = got["result"]
    assert not error and result["outputs"]["1"]["amount"] == 20.0 and result["error"] is None


def test_a_whole_plan_is_checked_and_submitted_and_a_refused_one_says_every_violation(db: str) -> None:
    answers: list[tuple[bool, str, dict[str, Any]]] = []

    async def body(session: ClientSession) -> None:
        answers.append(await call(session, "plangate_submit_plan", load_plan("refund")))
        answers.append(await call(session, "plangate_submit_plan", load_plan("broken")))

    over_stdio(db, body)
    (error, _, submitted), (refused, text, rejected) = answers
    assert not error and submitted["status"] == "pending_approval"
    assert submitted["needs"] == ["a person", "privacy-officer"]
    assert refused and rejected["status"] == "rejected" and "refused (9 violations)" in text
    assert "step 1: unknown-tool: no tool named 'get_invoce'" in text
    assert rejected["violations"][0]["rule"] == "unknown-tool"
    assert runtime(db).get(rejected["plan_id"]).status == "rejected"  # recorded, as any refused plan is
    assert effect_counts() == {}


def test_a_crafted_call_is_refused_and_nothing_is_recorded(db: str) -> None:
    answers: list[tuple[bool, str, dict[str, Any]]] = []

    async def body(session: ClientSession) -> None:
        crafted = {"invoice_id": "42", "amount": 20.0, "approved": True}
        answers.append(await call(session, "issue_refund", crafted))
        answers.append(await call(session, "plangate_approve", {"plan_id": "x"}))
        answers.append(await call(session, "plangate_plan_status", {"plan_id": "x", "execute": True}))

    over_stdio(db, body)
    (extra, text, data), (unknown, unknown_text, _), (status_extra, status_text, _) = answers
    assert extra and data["error"] == "bad-arguments" and "approved: not a known field" in text
    assert unknown and unknown_text == "no tool named 'plangate_approve'"
    assert status_extra and "execute: not a known field" in status_text
    assert runtime(db).list_plans() == [] and effect_counts() == {}


# -- over streamable HTTP, with a deny rule on a read --------------------------------------------


def test_over_http_a_deny_rule_refuses_a_read_by_name(tmp_path: Path, db: str) -> None:
    text = Path(POLICY).read_text()
    policy = tmp_path / "policy.yaml"
    rule = '  - name: no-invoice-44\n    tools: ["get_invoice"]\n    pattern: "^44$"\n    message: "is sealed"\n'
    policy.write_text(text.replace("require:\n", f"deny:\n{rule}\nrequire:\n", 1))
    answers: list[tuple[bool, str, dict[str, Any]]] = []

    async def body(url: str) -> None:
        async with http_session(url) as session:
            assert "get_invoice" in {tool.name for tool in (await session.list_tools()).tools}
            answers.append(await call(session, "get_invoice", {"invoice_id": "44"}))
            answers.append(await call(session, "get_invoice", {"invoice_id": "43"}))

    with over_http(tmp_path, db, policy=str(policy)) as url:
        anyio.run(body, url)
    (refused, text, data), (error, _, ran) = answers
    assert refused and data["status"] == "rejected"
    assert "step 1: deny:no-invoice-44: " in text and "is sealed" in text
    assert not error and ran["output"]["total"] == 75.5


# -- the gate itself: what a policy that sends a read to a person does, drafts, identity ---------


def test_a_read_the_policy_sends_to_a_person_does_not_run(db: str) -> None:
    gate = Gate(runtime(db), user="alice", category="refunds")
    reply = gate.call("get_invoice", {"invoice_id": "42"})
    assert not reply.error and reply.data["status"] == "pending_approval" and "output" not in reply.data
    assert [event.kind for event in runtime(db).trace(reply.data["plan_id"])].count("step.succeeded") == 0


def test_a_draft_grows_a_step_at_a_time_and_is_submitted_as_one_plan(db: str) -> None:
    gate = Gate(runtime(db), user="alice")
    first = gate.call("plangate_draft_add", {"tool": "get_invoice", "params": {"invoice_id": "42"}, "rationale": "r"})
    draft = first.data["draft"]
    refund = {"invoice_id": "42", "amount": "${1.total}"}
    step = {"tool": "issue_refund", "params": refund, "rationale": "r", "draft": draft}
    second = gate.call("plangate_draft_add", step)
    assert second.data["step"] == 2 and "${2}" in second.text
    done = gate.call("plangate_draft_submit", {"draft": draft, "task": "Refund invoice 42"})
    assert not done.error and done.data["category"] == "refunds" and done.data["status"] == "pending_approval"
    assert [step.tool for step in runtime(db).get(done.data["plan_id"]).plan.steps] == ["get_invoice", "issue_refund"]
    again = gate.call("plangate_draft_submit", {"draft": draft, "task": "again"})
    assert again.error and "no draft" in again.text
    assert effect_counts() == {}


def test_who_asks_is_known_before_the_first_call(db: str) -> None:
    code = CliRunner().invoke(main, ["mcp", "serve", "--tools", TOOLS, "--db", db])
    assert code.exit_code == 2 and "say who you are with --as NAME" in code.stderr
    code = CliRunner().invoke(main, ["mcp", "serve", "--tools", TOOLS, "--db", db, "--as", "a", "--http", "nope"])
    assert code.exit_code == 2 and "--http takes HOST:PORT" in code.stderr


def test_with_accounts_the_token_says_who_asks_and_what_they_may_see(db: str) -> None:
    rt = runtime(db)
    accounts = Accounts(rt.store)
    accounts.add("alice", "requester")
    accounts.add("bob", "requester")
    with pytest.raises(SignInRequiredError):
        Gate(rt, user="alice")  # a name is not enough once the store has accounts
    alice = Gate(rt, token=accounts.issue_token("alice"))
    reply = alice.call("issue_refund", {"invoice_id": "42", "amount": 5.0})
    assert rt.get(reply.data["plan_id"]).requested_by == "alice"
    bob = Gate(rt, token=accounts.issue_token("bob"))
    hidden = bob.call("plangate_plan_status", {"plan_id": reply.data["plan_id"]})
    assert hidden.error and "bob may see no plan" in hidden.text
