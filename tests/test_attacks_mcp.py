"""An attacker's pass over MCP tools in, ``plangate mcp serve`` out, the async API and the recipes.

The central promise under attack: only the exact plan a person approved runs, each step at
most once, and the log proves it. Each test is one attack, against real parts: a hostile MCP
server of the tests' own (tests/hostile_mcp.py) over stdio, SQLite, the SDK's client.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from examples.business import connect, effect_counts

from plangate import Runtime, ledger, references
from plangate.accounts import Accounts
from plangate.errors import CatalogueError, GovernanceError, ToolDefinitionError, UsageError
from plangate.mcpserver import Gate
from plangate.policy import Policy
from plangate.tools import Catalogue
from tests.conftest import EXAMPLES, load_plan
from tests.helpers import plan

HOSTILE = Path(__file__).with_name("hostile_mcp.py")
BUSINESS = str(EXAMPLES / "business.py")
POLICY = """
version: 1
name: attacks
roles: {dev: {tools: ["*"], scopes: ["*"]}}
default_role: dev
approval: {default: human, auto: [ops]}
categories:
  ops: {description: "Reads at once; anything else waits for a person.", tools: ["*"]}
"""


class Server:
    """The hostile server's spec, its state file (which tools it lists) and the calls it received."""

    def __init__(self, folder: Path, state: str = "v1") -> None:
        self.state, self.log = folder / "state", folder / "calls.jsonl"
        self.state.write_text(state)
        self.spec = f"mcp:stdio:{shlex.quote(sys.executable)} {shlex.quote(str(HOSTILE))} {self.state} {self.log}"

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        found = [json.loads(line) for line in self.log.read_text().splitlines()]
        return [c for c in found if tool is None or c["tool"] == tool]


@pytest.fixture
def hostile(tmp_path: Path) -> Server:
    return Server(tmp_path)


def governed(server: Server, tmp_path: Path, extra: str = "") -> tuple[Catalogue, Runtime]:
    catalogue = Catalogue.from_spec(server.spec)
    policy = Policy.from_yaml(POLICY + extra)
    return catalogue, Runtime(catalogue, policy, db=f"sqlite:///{tmp_path}/p.db", tools=server.spec)


def approved(runtime: Runtime, tool: str, **params: Any) -> str:
    record = runtime.submit(plan({"id": 1, "tool": tool, "params": params}, category="ops"), requested_by="alice")
    if record.status == "pending_approval":
        runtime.approve(record.id, "bob", record.hash)
    return record.id


# -- 1. a hostile server as a tool source ------------------------------------------------------------


def test_a_read_hint_is_believed_only_until_the_policy_says_otherwise(hostile: Server, tmp_path: Path) -> None:
    catalogue, runtime = governed(hostile, tmp_path)
    with catalogue:
        lying = runtime.submit(
            plan({"id": 1, "tool": "liar", "params": {"note": "x"}}, category="ops"), requested_by="a"
        )
        assert lying.status == "approved"  # the documented default: a read hint is believed, auto-approved
        assert hostile.calls() == []  # approving runs nothing
    catalogue, runtime = governed(hostile, tmp_path, "tools: {liar: {effect: write}}\n")
    with catalogue:
        held = runtime.submit(
            plan({"id": 1, "tool": "liar", "params": {"note": "y"}}, category="ops"), requested_by="a"
        )
        assert held.status == "pending_approval" and held.needs == ("a person",)
        with pytest.raises(GovernanceError, match="approval"):
            runtime.execute(held.id, actor="a")
    assert hostile.calls() == []


def test_a_server_that_dies_during_a_write_leaves_its_outcome_unknown_and_it_is_never_called_again(
    hostile: Server, tmp_path: Path
) -> None:
    catalogue, runtime = governed(hostile, tmp_path)
    with catalogue:
        plan_id = approved(runtime, "crash", note="pay 100")
        first = runtime.execute(plan_id, actor="bob")
        assert first.status == "halted" and "outcome unknown" in (first.error or "")
        assert "'crash' is not idempotent" in (first.error or "")
        again = runtime.resume(plan_id, actor="bob")  # a resume does not call it again: a person settles it
        assert again.status == "halted" and "outcome unknown" in (again.error or "")
    assert len(hostile.calls("crash")) == 1
    kinds = [e.kind for e in runtime.trace(plan_id)]
    assert "step.outcome_unknown" in kinds and "step.failed" not in kinds


def test_a_server_that_hangs_is_cut_off_by_the_time_limit_and_not_called_again(hostile: Server, tmp_path: Path) -> None:
    catalogue, runtime = governed(hostile, tmp_path, "limits: {tool_timeout: 2}\n")
    with catalogue:
        plan_id = approved(runtime, "hang", note="x")
        halted = runtime.execute(plan_id, actor="bob")
        assert halted.status == "halted" and "timed out" in (halted.error or "") and "outcome unknown" in halted.error
    assert len(hostile.calls("hang")) == 1


def test_an_is_error_answer_fails_the_step_and_a_resume_calls_again_under_the_same_key(
    hostile: Server, tmp_path: Path
) -> None:
    catalogue, runtime = governed(hostile, tmp_path)
    with catalogue:
        plan_id = approved(runtime, "flaky", note="x")
        first = runtime.execute(plan_id, actor="bob")
        assert first.status == "halted" and "McpToolError: try again" in (first.error or "")
        assert len(hostile.calls("flaky")) == 1  # an MCP tool has no retries of its own: the run halts
        again = runtime.resume(plan_id, actor="bob")  # a person resumes: the server said it failed
    made = hostile.calls("flaky")
    assert again.status == "succeeded" and len(made) == 2
    assert {c["meta"]["plangate/idempotency_key"] for c in made} == {f"{plan_id}:1"}
    assert [c["meta"]["plangate/attempt"] for c in made] == [1, 2]


def test_an_output_that_breaks_its_own_schema_fails_the_step(hostile: Server, tmp_path: Path) -> None:
    catalogue, runtime = governed(hostile, tmp_path)
    with catalogue:
        plan_id = approved(runtime, "bad_output", note="x")
        result = runtime.execute(plan_id, actor="bob")
    assert result.status == "halted" and "'x' is not of type 'integer'" in (result.error or ""), result.error


@pytest.mark.parametrize("state", ["names", "deep"])
def test_odd_names_and_schemas_are_refused_when_the_catalogue_opens(hostile: Server, state: str) -> None:
    hostile.state.write_text(state)
    said = {"names": "'../etc/passwd': a tool name is a letter or '_' then", "deep": "its tool list cannot be read"}
    with pytest.raises((CatalogueError, ToolDefinitionError), match=re.escape(said[state])):
        Catalogue.from_spec(hostile.spec).close()


def test_a_server_that_comes_back_with_other_tools_under_the_same_names_is_drift(
    hostile: Server, tmp_path: Path
) -> None:
    catalogue, runtime = governed(hostile, tmp_path)
    with catalogue:
        plan_id = approved(runtime, "liar", note="x")
        hostile.state.write_text("v2")  # it restarts as another server: liar now cannot be undone
        for held in catalogue._holds:  # type: ignore[attr-defined]
            held.close()  # the connection broke; the next call opens it again
        refused = runtime.execute(plan_id, actor="bob")
        assert refused.status == "halted" and "came back with other tools" in (refused.error or ""), refused.error
        assert "(drift): nothing was called" in (refused.error or "")
        hostile.state.write_text("v1")  # the same server again: the catalogue goes on
        assert runtime.resume(plan_id, actor="bob").status == "succeeded"
    assert len(hostile.calls("liar")) == 1


def test_a_server_tool_named_like_plangates_own_cannot_be_served(hostile: Server, tmp_path: Path) -> None:
    hostile.state.write_text("own")
    with Catalogue.from_spec(hostile.spec) as catalogue:
        runtime = Runtime(catalogue, db=f"sqlite:///{tmp_path}/p.db")
        with pytest.raises(UsageError, match="'plangate_' are plangate's own over MCP: plangate_submit_plan"):
            Gate(runtime, user="alice")


# -- 2. plangate mcp serve, as a hostile client sees it -------------------------------------------------


def business(db: str) -> Runtime:
    return Runtime(Catalogue.from_module(BUSINESS), Policy.load(EXAMPLES / "policy.yaml"), db=db)


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/plangate.db"


def test_a_reference_smuggled_into_a_direct_call_is_text_the_tool_is_given(db: str) -> None:
    gate = Gate(business(db), user="alice")
    reply = gate.call("get_invoice", {"invoice_id": "${1.total}"})  # read as a value: no such invoice
    assert reply.error and reply.data["status"] == "halted" and "${1.total}" in reply.text
    refund = gate.call("issue_refund", {"invoice_id": "42", "amount": "${1}"})
    assert refund.error and refund.data["error"] == "bad-arguments"  # not a number: refused before recording
    assert effect_counts() == {}


def test_a_direct_calls_arguments_reach_the_tool_exactly_as_the_client_sent_them(db: str) -> None:
    rt = business(db)
    body = "Pay $${1} or ${2.total} by ${date}."
    reply = Gate(rt, user="alice").call("send_email", {"to": "a@example.com", "subject": "s", "body": body})
    assert not reply.error and reply.data["status"] == "pending_approval", reply.text
    record = rt.get(reply.data["plan_id"])
    assert record.plan is not None and references.resolve(record.plan.steps[0].params, {}) == {
        "to": "a@example.com",
        "subject": "s",
        "body": body,
    }
    rt.approve(record.id, "bob", record.hash)
    assert rt.execute(record.id).ok
    with connect() as conn:
        assert [row[0] for row in conn.execute("SELECT body FROM outbox")] == [body]


def test_a_whole_plan_is_never_run_over_mcp_even_when_the_policy_approves_it(db: str) -> None:
    gate = Gate(business(db), user="alice")
    reads = {
        "task": "t",
        "category": "lookups",
        "steps": [{"id": 1, "tool": "get_invoice", "params": {"invoice_id": "42"}, "rationale": "r"}],
    }
    submitted = gate.call("plangate_submit_plan", reads)
    assert submitted.data["status"] == "approved" and "an MCP call never runs it" in submitted.text
    result = gate.call("plangate_plan_result", {"plan_id": submitted.data["plan_id"]})
    assert result.data["outputs"] is None and business(db).store.steps(submitted.data["plan_id"]) == {}
    smuggled = {**load_plan("refund"), "category": "lookups"}  # a write under a category that holds only reads
    refused = gate.call("plangate_submit_plan", smuggled)
    assert refused.error and refused.data["status"] == "rejected" and effect_counts() == {}


def test_draft_ids_are_unguessable_and_a_guess_adds_nothing(db: str) -> None:
    gate = Gate(business(db), user="alice")
    first = gate.call("plangate_draft_add", {"tool": "get_invoice", "params": {"invoice_id": "42"}, "rationale": "r"})
    assert uuid.UUID(first.data["draft"]).version == 4
    guess = gate.call("plangate_draft_add", {"tool": "issue_refund", "params": {}, "rationale": "r", "draft": "1"})
    assert guess.error and guess.data["error"] == "no-draft"
    submitted = gate.call("plangate_draft_submit", {"draft": first.data["draft"], "task": "t"})
    again = gate.call("plangate_draft_submit", {"draft": first.data["draft"], "task": "t"})
    assert not submitted.error and again.error and again.data["error"] == "no-draft"  # a draft is submitted once
    late = gate.call(
        "plangate_draft_add", {"tool": "issue_refund", "params": {}, "rationale": "r", "draft": first.data["draft"]}
    )
    assert late.error and len(business(db).get(submitted.data["plan_id"]).plan.steps) == 1  # type: ignore[union-attr]


def test_very_large_arguments_are_refused_before_anything_is_recorded(db: str) -> None:
    gate = Gate(business(db), user="alice")
    reply = gate.call("get_invoice", {"invoice_id": "4" * 2_000_000})
    assert reply.error and "invoice_id" in reply.text and len(reply.text) < 2000
    assert business(db).list_plans() == []


def test_another_accounts_plans_cannot_be_found_by_prefix(db: str) -> None:
    rt = business(db)
    accounts = Accounts(rt.store)
    accounts.add("alice", "requester")
    accounts.add("bob", "requester")
    alice = Gate(rt, token=accounts.issue_token("alice"))
    secret = alice.call("issue_refund", {"invoice_id": "42", "amount": 5.0}).data["plan_id"]
    bob = Gate(rt, token=accounts.issue_token("bob"))
    answers = {
        prefix: bob.call("plangate_plan_status", {"plan_id": prefix}).text
        for prefix in (secret, secret[:8], "ffffffff-ffff")
    }
    assert len(set(answers.values()) - {""}) == len(answers)  # each names what was asked...
    said = {text.replace(prefix, "ID") for prefix, text in answers.items()}
    assert len(said) == 1, said  # ...and says the same of a plan bob may not see and of none at all


def test_over_http_a_request_whose_host_or_origin_is_not_loopback_is_refused(tmp_path: Path, db: str) -> None:
    import httpx

    from tests.test_mcp_server import over_http

    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    with over_http(tmp_path, db) as url:
        port = url.split(":")[2].split("/")[0]
        rebound = httpx.post(url, json=hello, headers={**headers, "Host": f"evil.example:{port}"})
        foreign = httpx.post(url, json=hello, headers={**headers, "Origin": "http://evil.example"})
    assert rebound.status_code == 421 and foreign.status_code == 403
    assert business(db).list_plans() == []


# -- 3. the async API -----------------------------------------------------------------------------------


def test_two_tasks_executing_one_plan_at_once_make_its_effect_once(db: str) -> None:
    rt = business(db)
    refund = {"id": 1, "tool": "issue_refund", "params": {"invoice_id": "42", "amount": 5.0}}
    record = rt.submit(plan(refund, category="refunds"), requested_by="alice")
    assert record.needs == ("a person",)
    rt.approve(record.id, "dave", record.hash)

    async def both() -> list[Any]:
        return await asyncio.gather(*(rt.aexecute(record.id, actor="bob") for _ in range(2)), return_exceptions=True)

    outcomes = asyncio.run(both())
    ran = [o for o in outcomes if not isinstance(o, BaseException)]
    assert len(ran) >= 1 and all(isinstance(o, GovernanceError) for o in outcomes if o not in ran), outcomes
    assert effect_counts() == {"refund": 1}
    assert ledger.verify(rt.store).ok


def test_an_approval_racing_an_edit_binds_to_the_hash_it_names(db: str) -> None:
    rt = business(db)
    record = rt.submit(load_plan("refund"), requested_by="alice")
    edited = {**load_plan("refund"), "task": "another task"}

    async def race() -> list[Any]:
        return await asyncio.gather(
            rt.aedit(record.id, edited, "alice"),
            rt.aapprove(record.id, "dave", record.hash),
            return_exceptions=True,
        )

    asyncio.run(race())
    now = rt.get(record.id)
    valid = [a for a in rt.store.approvals(record.id, now.version) if not a.void and a.decision == "approved"]
    assert all(a.plan_hash == now.hash for a in valid) and (now.hash == record.hash or valid == [])


# -- 4. the Pydantic AI toolset -------------------------------------------------------------------------


def test_the_toolsets_draft_is_submitted_once_and_not_changed_after(tmp_path: Path) -> None:
    from examples.integrations import _demo

    from plangate.integrations.pydantic_ai import PlanGateToolset

    toolset = PlanGateToolset(_demo.runtime(tmp_path), requester="alice", task=_demo.TASK, category="refunds")
    toolset.steps.append(
        {"id": 1, "tool": "issue_refund", "params": {"invoice_id": "42", "amount": 5.0}, "rationale": "r"}
    )
    first = asyncio.run(toolset.submit())
    with pytest.raises(UsageError, match=f"already submitted as plan {first.id}"):
        asyncio.run(toolset.submit())
    assert len(toolset.runtime.list_plans()) == 1 and effect_counts() == {}
