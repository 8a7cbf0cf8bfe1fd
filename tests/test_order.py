"""In what order steps run: the story a reviewer reads top to bottom, with effects as barriers."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue, Policy, tool
from plangate.graph import run_deps
from plangate.plan import Plan
from plangate.runtime import Runtime
from plangate.story import tell
from tests.helpers import FixedClock, a_late_outcome_is_not_recorded, plan

LOG: list[str] = []
TOGETHER = threading.Barrier(10, timeout=10)


@tool
def look_up(user: str) -> str:
    """Find a user; fails for one nobody knows."""
    if user == "nobody":
        raise LookupError("User not found")
    LOG.append(f"look_up:{user}")
    return user


@tool(effect="write")
def cancel(order: str) -> str:
    """Cancel an order."""
    LOG.append(f"cancel:{order}")
    return order


@tool(effect="write")
def ship(order: str) -> str:
    """Ship an order; fails for a broken one."""
    if order == "broken":
        raise RuntimeError("the carrier refused it")
    LOG.append(f"ship:{order}")
    return order


@tool(effect="irreversible", external=True)
def notify(text: str) -> str:
    """Tell the customer."""
    LOG.append(f"notify:{text}")
    return text


@tool
def wait_for_all(n: int) -> int:
    """A read that finishes only when ten of them run at the same time."""
    TOGETHER.wait()
    return n


MET = threading.Event()


@tool
def wait_to_meet(n: int) -> str:
    """A read that waits a little for ``meet`` to run beside it: 'met' when it did, else 'alone'."""
    return "met" if MET.wait(timeout=0.5) else "alone"


@tool
def meet(n: int) -> int:
    """A read that says it has run."""
    MET.set()
    return n


PAIR = threading.Barrier(2, timeout=10)


@tool(effect="write", resource="pair:{key}")
def write_in_pair(key: str) -> str:
    """A write that finishes only when another runs at the same time."""
    PAIR.wait()
    LOG.append(f"write:{key}")
    return key


CAT = Catalogue([look_up, cancel, ship, notify, wait_for_all, wait_to_meet, meet, write_in_pair])


@pytest.fixture
def rt(tmp_path: Path) -> Runtime:
    LOG.clear()
    policy = Policy.from_yaml("version: 1\nname: p\napproval: {human: [ops]}\n")
    return Runtime(CAT, policy, db=f"sqlite:///{tmp_path}/order.db", clock=FixedClock(), max_concurrency=16)


def run(rt: Runtime, *steps: dict[str, Any], order: str = "listed") -> Any:
    MET.clear()
    record = rt.submit({**plan(*steps, category="ops"), "order": order}, "ann")
    assert record.status == "pending_approval", record
    rt.approve(record.id, "ben", record.hash)
    return rt.execute(record.id, actor="ops")


def test_a_failed_lookup_listed_before_a_write_stops_the_write(rt: Runtime) -> None:
    result = run(
        rt,
        {"id": 1, "tool": "look_up", "params": {"user": "nobody"}},
        {"id": 2, "tool": "look_up", "params": {"user": "ada"}},
        {"id": 3, "tool": "cancel", "params": {"order": "A1"}},  # references nothing
    )
    assert result.status == "halted" and result.failed_step == 1
    assert not [entry for entry in LOG if entry.startswith("cancel")], "the write never ran"


def test_a_message_listed_after_a_write_waits_for_it_and_never_tells_a_falsehood(rt: Runtime) -> None:
    done = run(
        rt,
        {"id": 1, "tool": "ship", "params": {"order": "A1"}},
        {"id": 2, "tool": "notify", "params": {"text": "your order shipped"}},
    )
    assert done.ok and LOG == ["ship:A1", "notify:your order shipped"]
    LOG.clear()
    failed = run(
        rt,
        {"id": 1, "tool": "ship", "params": {"order": "broken"}},
        {"id": 2, "tool": "notify", "params": {"text": "your order shipped"}},
    )
    assert failed.status == "halted" and LOG == [], "the customer is not told of a shipment that failed"


def test_reads_between_effects_still_run_at_the_same_time(rt: Runtime) -> None:
    """Ten reads meet at a barrier that opens only when all ten are running: run one by one, they would time out."""
    steps = [{"id": i, "tool": "wait_for_all", "params": {"n": i}} for i in range(1, 11)]
    result = run(rt, {"id": 20, "tool": "cancel", "params": {"order": "A1"}}, *steps)
    assert result.ok and LOG == ["cancel:A1"]


def test_the_order_a_plan_is_run_in() -> None:
    body = Plan.parse(
        plan(
            {"id": 1, "tool": "look_up", "params": {"user": "a"}},
            {"id": 2, "tool": "look_up", "params": {"user": "b"}},
            {"id": 3, "tool": "ship", "params": {"order": "${1}"}},
            {"id": 4, "tool": "look_up", "params": {"user": "c"}},
            {"id": 5, "tool": "look_up", "params": {"user": "d"}},
            {"id": 6, "tool": "notify", "params": {"text": "${5}"}},
            {"id": 7, "tool": "mystery", "params": {}},
        )
    )
    deps = run_deps(body, lambda name: CAT[name].effect if name in CAT else None)
    assert deps == {  # the edges that matter: an effect waited for all before it, so waiting for it is enough
        1: frozenset(),
        2: frozenset(),
        3: {1, 2},  # a write waits for everything listed before it
        4: {3},  # a read waits for the effects listed before it
        5: {3},
        6: {3, 4, 5},  # so does an irreversible one (and for 1 and 2 through 3)
        7: {6},  # a tool whose effect is unknown counts as an effect
    }


def test_the_review_page_shows_the_order_edges(tmp_path: Path) -> None:
    from plangate.record import PlanRecord
    from plangate.server.views import graph_svg

    body = Plan.parse(
        plan(
            {"id": 1, "tool": "look_up", "params": {"user": "a"}},
            {"id": 2, "tool": "ship", "params": {"order": "${1}"}},
            {"id": 3, "tool": "notify", "params": {"text": "shipped"}},
        )
    )
    record = PlanRecord(
        id="p", version=1, hash=body.hash, status="pending_approval", task="t", category="c",
        requested_by="ann", role=None, plan=body,
    )  # fmt: skip
    svg = graph_svg(record, CAT)
    assert svg.count('class="data-edge"') == 1, "2 reads 1's output"
    assert svg.count('class="order-edge"') == 1, "3 waits for 2, the write listed before it, without reading it"


def test_after_makes_a_step_wait_for_one_it_does_not_read(rt: Runtime) -> None:
    side_by_side = run(
        rt,
        {"id": 1, "tool": "wait_to_meet", "params": {"n": 1}},
        {"id": 2, "tool": "meet", "params": {"n": 2}},
    )
    assert side_by_side.outputs[1] == "met", "two reads with nothing between them run at the same time"
    ordered = run(
        rt,
        {"id": 1, "tool": "wait_to_meet", "params": {"n": 1}},
        {"id": 2, "tool": "meet", "params": {"n": 2}, "after": [1]},
    )
    assert ordered.ok and ordered.outputs[1] == "alone", "step 2 started only once step 1 had finished"


def test_dataflow_order_runs_what_reads_nothing_at_the_same_time(rt: Runtime) -> None:
    """Two writes that finish only when both run at once: in dataflow order they do."""
    result = run(
        rt,
        {"id": 1, "tool": "write_in_pair", "params": {"key": "a"}},
        {"id": 2, "tool": "write_in_pair", "params": {"key": "b"}},
        order="dataflow",
    )
    assert result.ok and sorted(LOG) == ["write:a", "write:b"]
    LOG.clear()
    chained = run(
        rt,
        {"id": 1, "tool": "ship", "params": {"order": "broken"}},
        {"id": 2, "tool": "notify", "params": {"text": "shipped"}, "after": [1]},
        order="dataflow",
    )
    assert chained.status == "halted" and LOG == [], "after still orders steps in dataflow order"


def test_an_optional_lookup_that_fails_lets_the_fallback_run(rt: Runtime) -> None:
    result = run(
        rt,
        {"id": 1, "tool": "look_up", "params": {"user": "nobody"}, "on_failure": "continue"},
        {"id": 2, "tool": "look_up", "params": {"user": "ada"}, "condition": "${1} == null"},
        {"id": 3, "tool": "cancel", "params": {"order": "${1}"}, "condition": "${1} != null"},
        {"id": 4, "tool": "cancel", "params": {"order": "${2}"}, "condition": "${2} != null"},
    )
    assert result.ok and result.failed_optional == (1,) and result.skipped == (3,)
    assert result.outputs == {1: None, 2: "ada", 4: "ada"}
    assert LOG == ["look_up:ada", "cancel:ada"]
    row = rt.store.steps(result.plan_id)[1]
    assert (row.status, row.output, row.error) == ("failed_optional", None, "LookupError: User not found")
    story = "\n".join(tell(rt.trace(result.plan_id)))
    assert "step 1 failed, and is optional (on_failure: continue)" in story
    assert rt.store.verify_audit().ok
    again = rt.execute(result.plan_id, actor="ops")
    assert again.failed_optional == (1,) and again.outputs == result.outputs, "the record tells the same story"


def test_an_optional_lookup_that_succeeds_takes_the_first_branch(rt: Runtime) -> None:
    result = run(
        rt,
        {"id": 1, "tool": "look_up", "params": {"user": "bea"}, "on_failure": "continue"},
        {"id": 2, "tool": "look_up", "params": {"user": "ada"}, "condition": "${1} == null"},
        {"id": 3, "tool": "cancel", "params": {"order": "${1}"}, "condition": "${1} != null"},
    )
    assert result.ok and result.failed_optional == () and result.skipped == (2,)
    assert LOG == ["look_up:bea", "cancel:bea"]


def test_a_condition_orders_its_step_after_the_steps_it_reads_and_skips_it_after_a_skipped_one(rt: Runtime) -> None:
    gated = run(
        rt,
        {"id": 1, "tool": "wait_to_meet", "params": {"n": 1}},
        {"id": 2, "tool": "meet", "params": {"n": 2}, "condition": "${1} != 'never'"},
        order="dataflow",
    )
    assert gated.ok and gated.outputs[1] == "alone", "step 2 waited for the step its condition reads"
    result = run(
        rt,
        {"id": 1, "tool": "look_up", "params": {"user": "bea"}},
        {"id": 2, "tool": "look_up", "params": {"user": "ada"}, "condition": "${1} == 'nobody'"},
        {"id": 3, "tool": "look_up", "params": {"user": "cy"}, "condition": "${2} != 'zed'"},
    )
    assert result.ok and result.skipped == (2, 3) and LOG == ["look_up:bea"]
    assert rt.store.steps(result.plan_id)[3].error == "step 2, whose output it reads, was skipped"
    steps = (
        {"id": 1, "tool": "look_up", "params": {"user": "a"}},
        {"id": 2, "tool": "look_up", "params": {"user": "b"}, "condition": "${1} != 'x'"},
    )
    assert run_deps(Plan.parse({**plan(*steps), "order": "dataflow"}), lambda name: CAT[name].effect)[2] == {1}


def test_the_order_of_after_and_dataflow_plans() -> None:
    steps = (
        {"id": 1, "tool": "look_up", "params": {"user": "a"}},
        {"id": 2, "tool": "ship", "params": {"order": "x"}},
        {"id": 3, "tool": "notify", "params": {"text": "${1}"}, "after": [2]},
        {"id": 4, "tool": "look_up", "params": {"user": "b"}},
    )
    dataflow = Plan.parse({**plan(*steps), "order": "dataflow"})
    assert run_deps(dataflow, lambda name: CAT[name].effect) == {1: set(), 2: set(), 3: {1, 2}, 4: set()}
    listed = Plan.parse(plan(*steps))
    assert run_deps(listed, lambda name: CAT[name].effect) == {1: set(), 2: {1}, 3: {1, 2}, 4: {3}}


def test_the_review_page_shows_after_edges_and_says_when_listed_order_is_not_execution_order(tmp_path: Path) -> None:
    from tests import serverkit

    setup = serverkit.setup(tmp_path, CAT, Policy.from_yaml("version: 1\nname: p\napproval: {human: [ops]}\n"))
    client, _ = serverkit.browser(setup, "alice")
    steps = (
        {"id": 1, "tool": "look_up", "params": {"user": "a"}, "on_failure": "continue"},
        {"id": 2, "tool": "look_up", "params": {"user": "b"}, "after": [1]},
    )
    pages = {}
    for order in ("listed", "dataflow"):
        made = serverkit.api(setup, "alice").post("/api/plans", json={**plan(*steps), "order": order})
        assert made.status_code == 201, made.text
        pages[order] = client.get(f"/plans/{made.json()['id']}").text
    listed, dataflow = pages["listed"], pages["dataflow"]
    assert listed.count('class="after-edge"') == 1 and 'class="data-edge"' not in listed
    assert "after step 1" in listed and "optional: a failure gives null" in listed
    assert 'id="dataflow-order"' not in listed
    assert 'id="dataflow-order"' in dataflow and "the listed order is not the execution order" in dataflow


def test_a_write_that_fails_halts_even_when_its_step_says_continue(tmp_path: Path) -> None:
    """The checker refuses such a plan; the engine does not rely on it: here the tool became a write after the check."""
    from plangate.engine import Engine

    @tool(name="ship")
    def ship_as_a_read(order: str) -> str:
        """What 'ship' was when the plan was checked."""
        return order

    LOG.clear()
    rt = Runtime(Catalogue([ship_as_a_read, notify]), db=f"sqlite:///{tmp_path}/o.db", clock=FixedClock())
    steps = (
        {"id": 1, "tool": "ship", "params": {"order": "broken"}, "on_failure": "continue"},
        {"id": 2, "tool": "notify", "params": {"text": "shipped"}},
    )
    record = rt.submit(plan(*steps), "ann")
    rt.approve(record.id, "ben", record.hash)
    claim = rt.start(record.id, actor="ops")
    engine = Engine(store=rt.store, catalogue=CAT, clock=FixedClock(), owner=claim.owner)
    result = engine.run(record.id, 1, claim.body)
    assert result.status == "halted" and result.failed_step == 1 and LOG == []
    assert Runtime(CAT, db=rt.store).submit(plan(*steps), "ann").violations[0].rule == "optional-effect"


def test_an_optional_failure_given_an_output_outside_plangate_is_named_by_the_audit(rt: Runtime) -> None:
    import sqlite3

    result = run(rt, {"id": 1, "tool": "look_up", "params": {"user": "nobody"}, "on_failure": "continue"})
    assert result.failed_optional == (1,)
    db = rt.store.url.removeprefix("sqlite:///")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE steps SET output = '\"forged\"' WHERE plan_id = ?", (result.plan_id,))
    from plangate import ledger

    report = ledger.verify(rt.store)
    assert any("step 1: steps.output differs" in t for t in report.tables), report


def test_an_outcome_that_comes_back_after_its_step_was_settled_is_not_recorded(tmp_path: Path) -> None:
    a_late_outcome_is_not_recorded(f"sqlite:///{tmp_path}/late.db")
