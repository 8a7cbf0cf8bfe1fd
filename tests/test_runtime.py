from __future__ import annotations

import asyncio
import itertools
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue, Policy, approval, results, tool
from plangate.errors import GovernanceError, NotFoundError, SelfApprovalError, StaleHashError, StateError, UsageError
from plangate.runtime import Runtime
from tests.conftest import load_plan
from tests.helpers import FixedClock, plan

CALLS: list[str] = []


@tool
def fetch(key: str) -> dict[str, Any]:
    CALLS.append(f"fetch:{key}")
    return {"key": key, "total": 12.5, "count": 3, "paid": True}


@tool(effect="write", resource="row:{key}")
def store_value(key: str, value: float) -> str:
    CALLS.append(f"store:{key}={value}")
    return f"stored {key}"


@tool(effect="write")
def explode(reason: str) -> str:
    raise RuntimeError(reason)


@tool
def liar(x: int) -> int:
    return "not an int"  # type: ignore[return-value]


@tool
def text(x: str) -> str:
    return x


@tool
async def slow_async(label: str) -> str:
    await asyncio.sleep(0.01)
    CALLS.append(f"async:{label}")
    return label


CAT = Catalogue([fetch, store_value, explode, liar, text, slow_async])
POLICY = Policy.from_yaml("""
version: 1
name: test
users: {ann: staff, ben: reviewer, cat: privacy}
roles:
  staff: {}
  reviewer: {}
  privacy: {}
default_role: staff
deny:
  - {name: no-secret, params: [value, x], pattern: "secret"}
approval:
  auto: [reads]
  human: [ops]
""")


@pytest.fixture
def rt(tmp_path: Path) -> Runtime:
    CALLS.clear()
    return Runtime(CAT, POLICY, db=f"sqlite:///{tmp_path}/plangate.db", clock=FixedClock())


def approved(rt: Runtime, data: dict[str, Any]) -> str:
    record = rt.submit(data, "ann")
    return rt.approve(record.id, "ben", record.hash).id


def kinds(rt: Runtime, plan_id: str) -> list[str]:
    return [e.kind for e in rt.trace(plan_id)]


def test_submit_records_check_and_policy(rt: Runtime) -> None:
    record = rt.submit(plan({"id": 1, "tool": "fetch", "params": {"key": "a"}}), "ann")
    assert record.status == "pending_approval" and record.version == 1 and record.needs == ("a person",)
    assert record.id == "00000000-0000-0000-0000-000000000001", "ids come from the clock"
    assert kinds(rt, record.id) == ["plan.submitted", "plan.checked", "plan.pending_approval"]
    bad = rt.submit(plan({"id": 1, "tool": "nope"}), "ann")
    assert bad.status == "rejected" and [v.rule for v in bad.violations] == ["unknown-tool"]
    with pytest.raises(StateError, match="is rejected, not approved"):
        rt.execute(bad.id)


def test_a_wrong_hash_is_shown_as_far_as_it_differs_from_the_current_one(rt: Runtime) -> None:
    record = rt.submit(plan({"id": 1, "tool": "fetch", "params": {"key": "a"}}), "ann")
    current = record.hash
    near = current[:20] + ("0" if current[20] != "0" else "1") + current[21:]
    with pytest.raises(StaleHashError) as refused:
        rt.approve(record.id, "ben", near)
    assert str(refused.value) == (
        f"the hash given ({near[:21]}…) is not plan {record.id}'s current version v1 ({current[:21]}…): "
        "review v1 and decide on its hash"
    )
    with pytest.raises(StaleHashError) as far:
        rt.approve(record.id, "ben", "f" * 64 if current[0] != "f" else "0" * 64)
    assert f"({current[:12]}…)" in str(far.value), "hashes that differ early are shown by their first 12 characters"
    with pytest.raises(StaleHashError) as prefix:
        rt.approve(record.id, "ben", current[:12])
    assert str(prefix.value) == (
        f"the hash given ({current[:12]}) is only the start of plan {record.id}'s current version v1 "
        f"({current[:13]}…): give the whole hash"
    )


@pytest.mark.parametrize(
    ("given", "current", "shown"),
    [
        ("a" * 64, "b" * 64, ("a" * 12 + "…", "b" * 12 + "…")),
        ("a" * 30 + "c" * 34, "a" * 30 + "d" * 34, ("a" * 30 + "c…", "a" * 30 + "d…")),
        ("a" * 63 + "c", "a" * 63 + "d", ("a" * 63 + "c", "a" * 63 + "d")),
        ("abc", "a" * 64, ("abc", "a" * 12 + "…")),
    ],
)
def test_two_hashes_are_shown_as_far_as_they_differ(given: str, current: str, shown: tuple[str, str]) -> None:
    assert approval.apart(given, current) == shown


def test_auto_approval_is_logged_as_such(rt: Runtime) -> None:
    record = rt.submit(plan({"id": 1, "tool": "fetch", "params": {"key": "a"}}, category="reads"), "ann")
    assert record.status == "approved"
    approval = rt.store.approvals(record.id)[0]
    assert (approval.kind, approval.actor, approval.plan_hash) == ("auto", "policy:test", record.hash)
    events = rt.trace(record.id)
    assert events[-1].kind == "plan.approved" and events[-1].data["by"] == "auto"
    assert rt.execute(record.id).ok


def test_approval_rules(rt: Runtime) -> None:
    record = rt.submit(plan({"id": 1, "tool": "fetch", "params": {"key": "a"}}), "ann")
    with pytest.raises(SelfApprovalError, match="ann requested plan"):
        rt.approve(record.id, "ann", record.hash)
    with pytest.raises(StaleHashError, match="is not plan"):
        rt.approve(record.id, "ben", "f" * 64)
    with pytest.raises(GovernanceError, match="holds role 'reviewer' under policy 'test', not 'privacy'"):
        rt.approve(record.id, "ben", record.hash, role="privacy")
    with pytest.raises(NotFoundError):
        rt.approve("no-such-plan", "ben", record.hash)
    assert rt.approve(record.id[:8], "ben", record.hash, comment="fine").status == "approved"
    with pytest.raises(StateError, match="already approved"):
        rt.approve(record.id, "cat", record.hash)


def test_named_approvals_are_all_required(tmp_path: Path) -> None:
    named = Policy.from_yaml("""
version: 1
name: named
users: {ben: reviewer, cat: privacy}
roles: {reviewer: {}, privacy: {}, staff: {}}
default_role: staff
sequences:
  - {name: pii, after: {tools: [fetch]}, forbid: {tools: [text]}, unless_approved_by: privacy}
""")
    rt = Runtime(CAT, named, db=f"sqlite:///{tmp_path}/p.db", clock=FixedClock())
    record = rt.submit(
        plan(
            {"id": 1, "tool": "fetch", "params": {"key": "a"}}, {"id": 2, "tool": "text", "params": {"x": "${1.key}"}}
        ),
        "ann",
    )
    assert record.needs == ("a person", "privacy")
    assert rt.approve(record.id, "ben", record.hash).needs == ("privacy",)
    with pytest.raises(StateError, match="needs approval by privacy"):
        rt.execute(record.id)
    assert rt.approve(record.id, "cat", record.hash).status == "approved"


def test_reject_needs_a_comment_and_ends_the_plan(rt: Runtime) -> None:
    record = rt.submit(plan({"id": 1, "tool": "fetch", "params": {"key": "a"}}), "ann")
    with pytest.raises(UsageError, match="needs a comment"):
        rt.reject(record.id, "ben", " ")
    assert rt.reject(record.id, "ben", "not now").status == "rejected"
    with pytest.raises(StateError, match="is rejected; edit it"):
        rt.approve(record.id, "cat", record.hash)
    assert rt.trace(record.id)[-1].data == {
        "by": "person",
        "comment": "not now",
        "transition": {"from": "pending_approval", "to": "rejected"},
    }


def test_edit_makes_a_new_version_and_voids_approvals(rt: Runtime) -> None:
    record = rt.submit(plan({"id": 1, "tool": "fetch", "params": {"key": "a"}}), "ann")
    rt.approve(record.id, "ben", record.hash)
    edited = rt.edit(record.id, plan({"id": 1, "tool": "fetch", "params": {"key": "b"}}), "cat")
    assert (edited.version, edited.status) == (2, "pending_approval") and edited.hash != record.hash
    assert all(a.void for a in rt.store.approvals(record.id, 1))
    with pytest.raises(StaleHashError):
        rt.approve(record.id, "ben", record.hash)
    with pytest.raises(SelfApprovalError, match="cat wrote a version of plan"):
        rt.approve(record.id, "cat", edited.hash)
    with pytest.raises(StateError, match="does not change"):
        rt.edit(record.id, plan({"id": 1, "tool": "fetch", "params": {"key": "b"}}), "cat")
    assert rt.approve(record.id, "ben", edited.hash).status == "approved"
    assert rt.execute(record.id).outputs[1]["key"] == "b"
    with pytest.raises(StateError, match="only a plan not yet executed"):
        rt.edit(record.id, plan({"id": 1, "tool": "fetch", "params": {"key": "c"}}), "cat")
    assert "plan.edited" in kinds(rt, record.id)


def test_execute_runs_once_with_typed_references(rt: Runtime) -> None:
    plan_id = approved(
        rt,
        plan(
            {"id": 1, "tool": "fetch", "params": {"key": "a"}, "expected_output": "object"},
            {"id": 2, "tool": "store_value", "params": {"key": "${1.key}", "value": "${1.total}"}},
            {"id": 3, "tool": "text", "params": {"x": "stored ${1.total} as ${2}"}},
        ),
    )
    result = rt.execute(plan_id)
    assert result.ok and result.ran == (1, 2, 3)
    assert result.outputs[3] == "stored 12.5 as stored a"
    assert CALLS == ["fetch:a", "store:a=12.5"]
    again = rt.execute(plan_id)
    assert again.ok and again.ran == () and CALLS == ["fetch:a", "store:a=12.5"], "nothing repeats"
    steps = rt.store.steps(plan_id)
    assert steps[2].idempotency_key == f"{plan_id}:2" and steps[2].params == {"key": "a", "value": 12.5}
    assert kinds(rt, plan_id)[-1] == "run.succeeded"


def test_a_failure_halts_and_says_why(rt: Runtime) -> None:
    plan_id = approved(
        rt,
        plan(
            {"id": 1, "tool": "fetch", "params": {"key": "a"}},
            {"id": 2, "tool": "explode", "params": {"reason": "card declined ${1.key}"}},
            {"id": 3, "tool": "store_value", "params": {"key": "z", "value": "${1.total}"}, "condition": "${2} == 'x'"},
        ),
    )
    result = rt.execute(plan_id)
    assert result.status == "halted" and result.failed_step == 2 and result.tool == "explode"
    assert result.error == "RuntimeError: card declined a" and result.rationale == "needed"
    assert "resume" in (result.next_step or "")
    assert rt.get(plan_id).status == "halted" and 3 not in rt.store.steps(plan_id)
    assert CALLS == ["fetch:a"]
    assert rt.execute(plan_id).failed_step == 2, "executing a halted plan repeats nothing"
    assert CALLS == ["fetch:a"]


def test_a_secret_brought_in_by_a_reference_is_refused_at_call_time(rt: Runtime) -> None:
    plan_id = approved(
        rt,
        plan(
            {"id": 1, "tool": "text", "params": {"x": "sec"}},
            {"id": 2, "tool": "text", "params": {"x": "${1}ret"}},
        ),
    )
    check = rt.get(plan_id)
    assert check.violations == ()
    result = rt.execute(plan_id)
    assert result.failed_step == 2 and "refused by the policy: step 2: deny:no-secret" in (result.error or "")


def test_a_policy_refusal_s_halt_says_to_edit_the_plan_or_change_the_policy_not_to_resume(rt: Runtime) -> None:
    plan_id = approved(
        rt,
        plan(
            {"id": 1, "tool": "text", "params": {"x": "sec"}},
            {"id": 2, "tool": "text", "params": {"x": "${1}ret"}},
        ),
    )
    result = rt.execute(plan_id)
    assert result.next_step == results.REFUSED and "edit the plan" in result.next_step
    assert "change the policy" in result.next_step and not result.next_step.startswith("fix the cause")
    assert rt.execute(plan_id).next_step == results.REFUSED, "the recorded result says the same"
    again = rt.resume(plan_id)
    assert (again.status, again.error, again.next_step) == ("halted", result.error, results.REFUSED), "as it says"


def test_sql_brought_in_by_a_reference_is_refused_at_call_time(tmp_path: Path) -> None:
    ran: list[str] = []

    @tool(effect="write")
    def query_db(query: str) -> str:
        ran.append(query)
        return "rows"

    rules = Policy.from_yaml(
        "version: 1\nname: sql\nrequire:\n"
        "  - {name: reads-only, tools: [query_db], sql: read-only, tables: 'CREATE TABLE t (x);'}\n"
    )
    rt = Runtime(Catalogue([text, query_db]), rules, db=f"sqlite:///{tmp_path}/plangate.db", clock=FixedClock())
    record = rt.submit(
        plan(
            {"id": 1, "tool": "text", "params": {"x": "SELECT x FROM t; DELETE FROM t"}},
            {"id": 2, "tool": "query_db", "params": {"query": "${1}"}},
        ),
        "ann",
    )
    assert record.violations == ()
    rt.approve(record.id, "ben", record.hash)
    result = rt.execute(record.id)
    assert result.failed_step == 2 and ran == []
    said = "refused by the policy: step 2: require:reads-only: param 'query': must be one read-only SQL statement; "
    assert said in (result.error or "") and "it is more than one statement" in (result.error or "")


@pytest.mark.parametrize(
    ("step", "error"),
    [
        ({"id": 1, "tool": "liar", "params": {"x": 1}}, "does not match 'liar''s declared type"),
        ({"id": 1, "tool": "fetch", "params": {"key": "a"}, "expected_output": "object|null"}, None),
        ({"id": 1, "tool": "text", "params": {"x": "a"}, "expected_output": "integer|string"}, None),
    ],
)
def test_output_types_are_checked_at_run_time(rt: Runtime, step: dict[str, Any], error: str | None) -> None:
    result = rt.execute(approved(rt, plan(step)))
    assert result.error == error if error is None else error in (result.error or "")


def test_conditions_skip_steps_and_their_dependents(rt: Runtime) -> None:
    plan_id = approved(
        rt,
        plan(
            {"id": 1, "tool": "fetch", "params": {"key": "a"}},
            {"id": 2, "tool": "store_value", "params": {"key": "b", "value": 1}, "condition": "${1.total} > 100"},
            {"id": 3, "tool": "text", "params": {"x": "${2}"}},
            {"id": 4, "tool": "store_value", "params": {"key": "c", "value": 2}, "condition": "${1.paid}"},
        ),
    )
    result = rt.execute(plan_id)
    assert result.ok and result.skipped == (2, 3)
    steps = rt.store.steps(plan_id)
    assert steps[2].error == "its condition is false: ${1.total} > 100"
    assert steps[3].error == "step 2, whose output it reads, was skipped"
    assert CALLS == ["fetch:a", "store:c=2.0"]


def test_independent_steps_run_concurrently_within_the_limit(tmp_path: Path) -> None:
    barrier = threading.Barrier(3, timeout=5)
    active, peak, lock = [0], [0], threading.Lock()

    @tool
    def meet(n: int) -> int:
        barrier.wait()  # only passes if three steps run at the same time
        return n

    @tool
    def count(n: int) -> int:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.02)
        with lock:
            active[0] -= 1
        return n

    rt = Runtime(Catalogue([meet, count]), db=f"sqlite:///{tmp_path}/p.db", clock=FixedClock())
    record = rt.submit(plan(*({"id": i, "tool": "meet", "params": {"n": i}} for i in (1, 2, 3))), "ann")
    rt.approve(record.id, "ben", record.hash)
    assert rt.execute(record.id).ok

    rt.max_concurrency = 2
    record = rt.submit(plan(*({"id": i, "tool": "count", "params": {"n": i}} for i in range(1, 7))), "ann")
    rt.approve(record.id, "ben", record.hash)
    assert rt.execute(record.id).ok and peak[0] == 2


def test_async_tools_run_on_the_event_loop(rt: Runtime) -> None:
    plan_id = approved(rt, plan(*({"id": i, "tool": "slow_async", "params": {"label": str(i)}} for i in (1, 2))))
    result = rt.execute(plan_id)
    assert result.ok and result.outputs == {1: "1", 2: "2"}
    assert sorted(CALLS) == ["async:1", "async:2"]


def test_a_halt_stops_new_steps_from_starting(tmp_path: Path) -> None:
    started: list[int] = []
    release = threading.Event()

    @tool
    def fail_soon(n: int) -> int:
        started.append(n)
        raise ValueError("no")

    @tool
    def slow(n: int) -> int:
        started.append(n)
        release.wait(5)
        return n

    @tool
    def later(n: int) -> int:
        started.append(n)
        return n

    rt = Runtime(
        Catalogue([fail_soon, slow, later]), db=f"sqlite:///{tmp_path}/p.db", clock=FixedClock(), max_concurrency=2
    )
    record = rt.submit(
        plan(
            {"id": 1, "tool": "slow", "params": {"n": 1}},
            {"id": 2, "tool": "fail_soon", "params": {"n": 2}},
            {"id": 3, "tool": "later", "params": {"n": 3}},
        ),
        "ann",
    )
    rt.approve(record.id, "ben", record.hash)
    threading.Timer(0.2, release.set).start()
    result = rt.execute(record.id)
    assert result.failed_step == 2 and 3 not in started
    steps = rt.store.steps(record.id)
    assert steps[1].status == "succeeded", "the step already running finishes and is recorded"
    assert 3 not in steps


def test_resume_after_a_failure_reruns_only_the_failed_step(rt: Runtime, tmp_path: Path) -> None:
    flag = tmp_path / "fixed"

    @tool(effect="write", idempotent=True)
    def flaky(x: str) -> str:
        if not flag.exists():
            raise ConnectionError("service down")
        return x

    rt.catalogue = Catalogue([*CAT, flaky])
    plan_id = approved(
        rt,
        plan(
            {"id": 1, "tool": "fetch", "params": {"key": "a"}}, {"id": 2, "tool": "flaky", "params": {"x": "${1.key}"}}
        ),
    )
    assert rt.execute(plan_id).failed_step == 2
    flag.touch()
    result = rt.resume(plan_id)
    assert result.ok and result.ran == (2,) and CALLS == ["fetch:a"]
    assert rt.store.steps(plan_id)[2].attempt == 2
    assert "run.resumed" in kinds(rt, plan_id)


def test_a_plan_is_checked_again_when_its_tools_changed(rt: Runtime) -> None:
    plan_id = approved(rt, plan({"id": 1, "tool": "text", "params": {"x": "a"}}))

    @tool(name="text")
    def text_v2(x: int) -> str:
        return str(x)

    rt.catalogue = Catalogue([fetch, text_v2])
    with pytest.raises(
        GovernanceError, match="the tools changed since v1 was checked, and it no longer passes: step 1: param-type"
    ):
        rt.execute(plan_id)
    rt.catalogue = CAT
    assert rt.execute(plan_id).ok


def test_trace_and_the_audit_chain(rt: Runtime, tmp_path: Path) -> None:
    plan_id = approved(rt, plan({"id": 1, "tool": "fetch", "params": {"key": "a"}}))
    rt.execute(plan_id)
    assert kinds(rt, plan_id) == [
        "plan.submitted",
        "plan.checked",
        "plan.pending_approval",
        "plan.approval",
        "plan.approved",
        "run.started",
        "step.started",
        "step.succeeded",
        "run.succeeded",
    ]
    events = rt.trace(plan_id)
    assert [e.seq for e in events] == list(range(1, 10)) and events[0].at == "2026-11-29T09:00:00.001000Z"
    assert all(later.prev == earlier.hash for earlier, later in itertools.pairwise(events))
    assert rt.store.verify_audit().ok


def tamper(path: Path, sql: str) -> None:
    conn = sqlite3.connect(path)
    conn.execute(sql)
    conn.commit()
    conn.close()


@pytest.mark.parametrize(
    ("sql", "bad_seq", "problem"),
    [
        ('UPDATE events SET data = \'{"hash":"x"}\' WHERE seq = 4', 4, "it was edited"),
        ("UPDATE events SET actor = 'mallory' WHERE seq = 6", 6, "it was edited"),
        ("DELETE FROM events WHERE seq = 5", 6, "deleted or reordered"),
        ("UPDATE events SET seq = 100 WHERE seq = 3", 4, "deleted or reordered"),
        ("DELETE FROM events WHERE seq >= 8", 8, "cut off the end"),
    ],
)
def test_tampering_is_detected(rt: Runtime, tmp_path: Path, sql: str, bad_seq: int, problem: str) -> None:
    plan_id = approved(rt, plan({"id": 1, "tool": "fetch", "params": {"key": "a"}}))
    rt.execute(plan_id)
    rt.close()
    tamper(tmp_path / "plangate.db", sql)
    report = Runtime(CAT, POLICY, db=f"sqlite:///{tmp_path}/plangate.db").store.verify_audit()
    assert not report.ok and report.bad_seq == bad_seq and problem in (report.problem or ""), report


def test_the_example_business_end_to_end(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> None:
    rt = Runtime(catalogue, policy, db=f"sqlite:///{tmp_path}/p.db", clock=FixedClock())
    record = rt.submit(load_plan("refund"), "alice")
    rt.approve(record.id, "dave", record.hash)
    rt.approve(record.id, "carol", record.hash)
    result = rt.execute(record.id)
    assert result.ok and result.outputs[4] == "message-1"
    assert result.outputs[3]["refund_id"] == "r-42-3-00000000"
