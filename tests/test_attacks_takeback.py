"""Attacks on the take-back of a run cut off from its store, and on how it records the outcomes the run knew
(``Runtime.start(known=...)``, ``Engine.record_known``): a person's or another runner's act while the run
waits for its store, a refusal whose message is all a person reads, and the audit log the refusal writes.

The PostgreSQL connections are cut from inside a step's tool call (:mod:`tests.outage`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue, RunContext, tool
from plangate.accounts import Accounts
from plangate.errors import GovernanceError, StateError
from plangate.policy import Policy
from plangate.register import Register
from plangate.runtime import Runtime
from plangate.store import open_store
from tests import outage
from tests.helpers import plan

CALLS: list[int] = []
DURING: dict[str, Any] = {}  # what someone else does while a step's tool is in its call


@pytest.fixture(autouse=True)
def calls_counted_afresh() -> Iterator[None]:
    CALLS.clear()
    yield
    DURING.clear()


@tool(effect="irreversible")
def pay(amount: int, ctx: RunContext) -> str:
    """Pay; meanwhile someone else acts on the plan (``DURING``)."""
    CALLS.append(ctx.step_id)
    if "act" in DURING:  # on a thread of its own, as another process would: not on the run's event loop
        beside = threading.Thread(target=DURING["act"])
        beside.start()
        beside.join()
    return f"paid {amount}"


@tool(effect="write", idempotent=True)
def filed(n: str) -> str:
    return n


AUTO = Policy.from_yaml(
    "version: 1\nname: auto-ops\ncategories: {ops: {tools: [pay, filed]}}\napproval: {auto: [ops], escalate: []}\n"
)


def paid_then_filed(rt: Runtime) -> str:
    """A payment then a filing, approved automatically (category ``ops``)."""
    Accounts(rt.store).add("gina", "governance")
    steps = ({"id": 1, "tool": "pay", "params": {"amount": 5}}, {"id": 2, "tool": "filed", "params": {"n": "${1}"}})
    record = rt.submit(plan(*steps), "ann")
    assert record.status == "approved"
    return record.id


def test_a_resume_under_a_changed_register_does_not_send_a_live_run_back_for_approval(tmp_path: Path) -> None:
    """While a run holds its plan under a live lease (its payment in its call, or its run cut off from its store
    and waiting to take the plan back), the register holds the plan's category for people and someone resumes
    the plan: the resume is refused as any second runner is, and the run goes on. It sent the live run's plan
    back for approval: the run lost its lease, the payment's outcome, known, was never recorded, and the plan
    halted after the approval for a person to settle a payment plangate had known was made."""
    db = f"sqlite:///{tmp_path}/p.db"
    rt, other = Runtime(Catalogue([pay, filed]), AUTO, db=db), Runtime(Catalogue([pay, filed]), AUTO, db=db)
    refused: list[Exception] = []

    def hold_and_resume() -> None:
        Register(other.store, other.clock).set("ops", False, by="gina", reason="an audit")
        try:
            other.resume(plan_id)
        except Exception as exc:  # held to what it is below
            refused.append(exc)

    try:
        plan_id = paid_then_filed(rt)
        DURING["act"] = hold_and_resume
        result = rt.execute(plan_id)
        assert len(refused) == 1 and isinstance(refused[0], StateError), refused
        assert "already running" in str(refused[0]), refused
        assert result.status == "succeeded" and result.outputs == {1: "paid 5", 2: "paid 5"}, result
        assert CALLS == [1]
        with closing(open_store(db)) as store:
            assert store.verify_audit().ok
    finally:
        rt.close()
        other.close()


# -- a take-back refused by the register, after the store went away during a call --------------------------------


def the_refusals_commit_cut(monkeypatch: pytest.MonkeyPatch, then: Callable[[str], None] = lambda _: None) -> None:
    """The take-back's first claim (its refusal) commits and its connection breaks before the answer comes;
    ``then`` is done with the plan's id before the next try, once."""
    outage.cut_armed_commits(monkeypatch)
    start = Runtime.start

    def the_refusal_cut(self: Runtime, plan_id: str, **kwargs: Any) -> Any:
        if kwargs.get("known") is not None and "armed" not in DURING:  # the take-back's first claim
            DURING["armed"] = plan_id
            outage.ARMED["thread"] = threading.get_ident()
        elif kwargs.get("known") is not None and "then" not in DURING:  # the next try
            DURING["then"] = plan_id
            then(plan_id)
        return start(self, plan_id, **kwargs)

    monkeypatch.setattr(Runtime, "start", the_refusal_cut)


@pytest.fixture
def cut(pg_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The store a run is cut off from (PostgreSQL), with quick waits for it to come back."""
    yield from (pg_db for _ in outage.quick_retries(pg_db, monkeypatch))


def governance_changes() -> None:
    """The store goes away, and meanwhile governance changes (``DURING["change"]``; else the register holds the
    plan's category for people): the take-back is refused."""
    if "change" in DURING:
        DURING["change"]()
    else:
        with closing(open_store(outage.DB["url"])) as store:
            Register(store).set("ops", False, by="gina", reason="an audit")
    outage.cut_every_connection()


@tool(effect="irreversible")
def decline(amount: int, ctx: RunContext) -> str:
    """A payment declined (the tool raised) as the store goes away and governance changes."""
    CALLS.append(ctx.step_id)
    governance_changes()
    raise RuntimeError("declined")


@tool(effect="irreversible", timeout=0.2)
async def ship_slowly(n: int, ctx: RunContext) -> str:
    """A shipment that overruns its limit (it may have happened) as the store goes away and governance changes."""
    CALLS.append(ctx.step_id)
    governance_changes()
    await asyncio.sleep(30)
    return "shipped"


HELD = Policy.from_yaml(
    "version: 1\nname: auto-ops\ncategories: {ops: {tools: [decline, ship_slowly, filed]}}\n"
    "approval: {auto: [ops], escalate: []}\n"
)


def refused_take_back(db: str, name: str) -> tuple[GovernanceError, Runtime, str]:
    """A plan of one ``name`` step then a filing, run: the refusal of its take-back, its runtime and plan."""
    rt = Runtime(Catalogue([decline, ship_slowly, filed]), HELD, db=db)
    Accounts(rt.store).add("gina", "governance")
    steps = ({"id": 1, "tool": name, "params": {"amount": 5} if name == "decline" else {"n": 1}},)
    record = rt.submit(plan(*steps, {"id": 2, "tool": "filed", "params": {"n": "${1}"}}), "ann")
    assert record.status == "approved"
    with pytest.raises(GovernanceError, match="it is back for approval") as refused:
        rt.execute(record.id)
    assert CALLS == [1]
    return refused.value, rt, record.id


def test_a_refused_take_back_says_an_overrun_it_recorded_is_for_a_person_to_settle(cut: str) -> None:
    """The shipment overran its limit as the store went away: the refused take-back records it as of unknown
    outcome, as the run would have. The refusal said its outcome "is recorded", which a person reads as nothing
    left to settle; it now says the outcome is unknown, and that a person settles it."""
    said, rt, plan_id = refused_take_back(cut, "ship_slowly")
    try:
        assert rt.store.steps(plan_id)[1].status == "outcome_unknown"
        assert "step 1, known from before the store went away, is recorded as of unknown outcome" in str(said), said
        assert "a person settles it" in str(said), said
        rt.approve(plan_id, "ben", rt.get(plan_id).hash)  # the person the register now asks for
        halted = rt.execute(plan_id)
        assert halted.status == "halted" and (halted.error or "").startswith("outcome unknown"), halted
        rt.settle(plan_id, 1, done=True, actor="ben", output="shipped", note="it left the warehouse")
        result = rt.resume(plan_id)
        assert result.status == "succeeded" and result.outputs == {1: "shipped", 2: "shipped"}, result
        assert CALLS == [1]  # shipped once: the refusal, the approval and the resumes never called it again
        assert rt.store.verify_audit().ok
        assert rt.replay(plan_id).ok, rt.replay(plan_id)
    finally:
        rt.close()


def test_a_refused_take_back_whose_answer_was_lost_after_it_recorded_a_failure_is_still_the_refusal(
    cut: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refused take-back records the payment's failure and sends the plan back for approval; that commit goes
    through as its answer is lost. The next try said another runner had taken the plan and that the failure was
    not recorded: both untrue. It is the refusal, with the failure on record."""
    the_refusals_commit_cut(monkeypatch)
    said, rt, plan_id = refused_take_back(cut, "decline")
    try:
        assert DURING["armed"] == plan_id and "thread" not in outage.ARMED  # the refusal's commit was cut
        assert "step 1, known from before the store went away, is recorded" in str(said), said
        assert rt.get(plan_id).status == "pending_approval"
        assert rt.store.steps(plan_id)[1].status == "failed"
        assert rt.store.verify_audit().ok
        assert rt.replay(plan_id).ok, rt.replay(plan_id)
    finally:
        rt.close()


@tool(effect="write", compensate="cancel", timeout=0.2)
async def book_slowly(n: int, ctx: RunContext) -> dict[str, str]:
    """A booking that overruns its limit (it may have happened) as the store goes away and the tools change."""
    CALLS.append(ctx.step_id)
    governance_changes()
    await asyncio.sleep(30)
    return {"booking": f"b{n}"}


@tool(effect="write", idempotent=True)
def cancel(booking: str) -> str:
    CALLS.append(-1)
    return f"cancelled {booking}"


@tool(name="filed", effect="write", idempotent=True)
def filed_as_flag(n: bool) -> bool:  # its contract changed: what the plan gives it no longer fits
    return n


ROLLING = Policy.from_yaml(
    "version: 1\nname: auto-ops\ncategories: {ops: {tools: [book_slowly, cancel, filed]}}\n"
    "approval: {auto: [ops], escalate: []}\ncompensation: {on_halt: auto}\n"
)


def test_a_refusal_whose_answer_was_lost_is_still_the_refusal_once_a_person_settled_a_step_since(
    cut: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The booking overran as the store went away and the tools changed: the refused take-back records it as of
    unknown outcome and halts the plan for a person; its answer is lost. Before the next try, a person settles the
    booking as made. The next try found the refusal no longer the plan's newest event, read the halt as the run's
    own end, and the policy's rollback (which a refused plan never gets) cancelled the booking under the person
    who had just settled it. The refusal is the plan's last move, and it is still the refusal."""
    rt = Runtime(Catalogue([book_slowly, cancel, filed]), ROLLING, db=cut)
    DURING["change"] = lambda: setattr(rt, "catalogue", Catalogue([book_slowly, cancel, filed_as_flag]))

    def settled_by_a_person(plan_id: str) -> None:
        with closing(Runtime(Catalogue([book_slowly, cancel, filed_as_flag]), ROLLING, db=cut)) as other:
            other.settle(plan_id, 1, done=True, actor="ben", output={"booking": "b1"}, note="it was made")

    the_refusals_commit_cut(monkeypatch, settled_by_a_person)
    try:
        steps = ({"id": 1, "tool": "book_slowly", "params": {"n": 1}},)
        record = rt.submit(plan(*steps, {"id": 2, "tool": "filed", "params": {"n": "${1.booking}"}}), "ann")
        assert record.status == "approved"
        with pytest.raises(GovernanceError, match="no longer passes") as refused:
            rt.execute(record.id)
        assert "thread" not in outage.ARMED  # the refusal's commit was cut
        assert "step 1, known from before the store went away, is not recorded: a person settled" in str(refused.value)
        assert CALLS == [1], "the booking was cancelled by the policy's rollback"
        assert rt.get(record.id).status == "halted"
        assert rt.store.verify_audit().ok
        assert rt.replay(record.id).ok, rt.replay(record.id)
    finally:
        rt.close()


def test_a_refusal_whose_answer_was_lost_is_still_the_refusal_once_a_person_edited_the_plan_since(
    cut: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refused take-back records the payment's failure and sends the plan back for approval; its answer is
    lost. Before the next try, the requester corrects the plan (a new version, checked: it waits for the person the
    register asks for). The next try read the edit's check, a move of the checker's, as the refusal, and said
    "plan ... may not run: None". It is the take-back's refusal, with its reason, and the failure on record."""

    def edited_by_the_requester(plan_id: str) -> None:
        with closing(Runtime(Catalogue([decline, ship_slowly, filed]), HELD, db=cut)) as other:
            corrected = plan(
                {"id": 1, "tool": "decline", "params": {"amount": 4}},
                {"id": 2, "tool": "filed", "params": {"n": "${1}"}},
            )
            assert other.edit(plan_id, corrected, "ann").status == "pending_approval"

    the_refusals_commit_cut(monkeypatch, edited_by_the_requester)
    said, rt, plan_id = refused_take_back(cut, "decline")
    try:
        assert "thread" not in outage.ARMED  # the refusal's commit was cut
        assert "None" not in str(said) and "the auto-approval register has held category 'ops'" in str(said), said
        assert "step 1, known from before the store went away, is recorded" in str(said), said
        assert rt.get(plan_id).version == 2 and rt.get(plan_id).status == "pending_approval"
        assert CALLS == [1]
        assert rt.store.verify_audit().ok
        assert rt.replay(plan_id).ok, rt.replay(plan_id)
    finally:
        rt.close()
