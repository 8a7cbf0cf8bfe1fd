"""Attacks on the take-back of a run cut off from its store, and on how it records the outcomes the run knew
(``Runtime.start(known=...)``, ``Engine.record_known``): a person's or another runner's act while the run
waits for its store, a refusal whose message is all a person reads, and the audit log the refusal writes.

The PostgreSQL connections are cut from inside a step's tool call (:mod:`tests.outage`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue, RunContext, tool
from plangate.accounts import Accounts
from plangate.errors import StateError
from plangate.policy import Policy
from plangate.register import Register
from plangate.runtime import Runtime
from plangate.store import open_store
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
