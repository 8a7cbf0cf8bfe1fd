"""Attacks on MCP calls that overlap: several plans in one process calling one server at once.

A worker runs plans side by side, each on a runtime of its own over one catalogue, so their
calls share one session with each server. Each test runs plans on threads, as a worker does,
against a server that writes JSON-RPC itself (tests/wire_mcp.py): it answers out of order,
twice, or to a request it was never sent; it answers after a call's time ran out; it dies with
calls of two plans in flight. Sequenced by what the server has received, never by sleeping.
"""

from __future__ import annotations

import concurrent.futures
import json
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from plangate import Runtime
from plangate.policy import Policy
from plangate.results import RunResult
from plangate.tools import Catalogue
from tests.test_attacks_mcp import POLICY, approved

WIRE = Path(__file__).with_name("wire_mcp.py")


class Wire:
    """One catalogue over the wire server, and a runtime for each plan (as a worker's runner makes them)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.spec = f"mcp:stdio:{shlex.quote(sys.executable)} {shlex.quote(str(WIRE))} {shlex.quote(str(folder))}"
        opened = Catalogue.from_spec(self.spec)  # a call of slow may take a second, the others the default
        self.catalogue = opened.with_changes("slow-1s", lambda t: replace(t, timeout=1) if t.name == "slow" else t)
        self.opened = opened
        self.policy = Policy.from_yaml(POLICY)

    def runtime(self) -> Runtime:
        return Runtime(self.catalogue, self.policy, db=f"sqlite:///{self.folder}/p.db", tools=self.spec)

    def plan(self, tool: str, note: str) -> str:
        return approved(self.runtime(), tool, note=note)

    def execute(self, plan_id: str) -> RunResult:
        return self.runtime().execute(plan_id, actor="bob")

    def calls(self) -> list[dict[str, Any]]:
        log = self.folder / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def received(self, count: int) -> None:
        """Wait until the server has received ``count`` calls (it writes each down before anything else)."""
        deadline = time.monotonic() + 30
        while len(self.calls()) < count:
            assert time.monotonic() < deadline, f"the server has not received {count} calls"
            time.sleep(0.01)

    def logged(self, plan_id: str) -> str:
        return json.dumps([e.data for e in self.runtime().trace(plan_id)])


@pytest.fixture
def wire(tmp_path: Path) -> Any:
    made = Wire(tmp_path)
    with made.opened:
        yield made


def test_answers_out_of_order_twice_or_never_asked_for_each_reach_their_own_plan(wire: Wire) -> None:
    a, b = wire.plan("pair", "a"), wire.plan("pair", "b")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # the server answers neither until both are in
        done = list(pool.map(wire.execute, [a, b]))
    assert [r.outputs for r in done] == [{1: f"a {a}:1"}, {1: f"b {b}:1"}]
    for plan_id in (a, b):
        assert "never asked" not in wire.logged(plan_id) and "second answer" not in wire.logged(plan_id)
    assert sorted((c["note"], c["meta"]["plangate/idempotency_key"]) for c in wire.calls()) == [
        ("a", f"{a}:1"),
        ("b", f"{b}:1"),
    ]
    assert wire.execute(wire.plan("echo", "next")).status == "succeeded"


def test_an_answer_after_the_time_limit_is_recorded_nowhere_and_the_calls_beside_it_are_unharmed(wire: Wire) -> None:
    b, c = wire.plan("pair", "b"), wire.plan("pair", "c")
    late = wire.plan("slow", "late")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = pool.submit(wire.execute, b)  # in flight until c's call comes
        wire.received(1)
        timed_out = wire.execute(late)  # its time runs out with b's call in flight
        assert timed_out.status == "halted" and "timed out" in (timed_out.error or "")
        second = pool.submit(wire.execute, c)  # the late answer comes first, then b's and c's
        assert (first.result().outputs, second.result().outputs) == ({1: f"b {b}:1"}, {1: f"c {c}:1"})
    assert f"late {late}:1" not in wire.logged(late)
    assert wire.execute(wire.plan("echo", "next")).outputs == {
        1: "next " + wire.calls()[-1]["meta"]["plangate/idempotency_key"]
    }


def test_a_server_that_dies_under_two_plans_calls_leaves_each_as_its_tool_allows_and_opens_again(
    wire: Wire,
) -> None:
    once, again = wire.plan("die", "pay"), wire.plan("again", "set")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # the server dies once both calls are in
        halted = list(pool.map(wire.execute, [once, again]))
    assert [r.status for r in halted] == ["halted", "halted"]
    assert "outcome unknown" in (halted[0].error or "") and "'die' is not idempotent" in (halted[0].error or "")
    assert "broke during the call of 'again'" in (halted[1].error or "")
    resumed = wire.runtime().resume(again, actor="bob")  # idempotent: called again, under the same key
    assert resumed.status == "succeeded" and resumed.outputs == {1: f"set {again}:1"}, resumed.error
    still = wire.runtime().resume(once, actor="bob")  # not idempotent: a person settles it
    assert still.status == "halted" and "outcome unknown" in (still.error or "")
    keys = [(c["tool"], c["meta"]["plangate/idempotency_key"]) for c in wire.calls()]
    assert sorted(keys) == sorted([("die", f"{once}:1"), ("again", f"{again}:1"), ("again", f"{again}:1")])
    assert wire.execute(wire.plan("echo", "next")).status == "succeeded"
