"""Attacks on the Temporal backend: workflows started by hand, and what a workflow's input may choose."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue, Policy
from plangate import temporal as temporal_module
from plangate.runtime import Runtime
from plangate.testing import temporal_server
from tests.helpers import plan
from tests.test_temporal_attacks import TOOLS, _calls, _direct, _setup, activities, by_hand


@pytest.fixture(scope="module")
def temporal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with temporal_server(tmp_path_factory.mktemp("temporal") / "server.log") as address:
        yield address


def _claimed(db: str, tools: str, name: str) -> tuple[str, dict[str, Any]]:
    """A Temporal worker's claim on the one plan there is, and the input of the workflow it would start."""
    catalogue = Catalogue.from_spec(tools)
    claim = temporal_module._claim(db, catalogue, name, [])
    assert claim is not None
    return claim.owner, temporal_module.workflow_args(claim, catalogue)


def test_a_workflow_started_by_hand_under_the_plans_id_runs_none_of_its_steps(temporal: str, tmp_path: Path) -> None:
    """A plan a Temporal worker claimed (its workflow since lost, or never started): a workflow started by
    hand under the plan's id, its input copied from the history, passed every check the activities made
    (the workflow's id, the claim's owner, the hash) and ran the plan's steps outside plangate. A claim is
    now handed to the one workflow run plangate started for it, and no other run's activities act."""
    tools, db, rt, plan_id = _setup(tmp_path, "charge")
    owner, args = _claimed(db, tools, "t-by-hand")
    (tmp_path / "go").touch()
    failed = asyncio.run(by_hand(temporal, db, tools, args, plan_id))
    refusal = str(failed.__cause__.__cause__)  # the workflow failed with its activity, which failed with this
    assert f"plan {plan_id} is running under {owner}, not under this workflow run's claim" in refusal, refusal
    assert "it runs none of its steps" in refusal
    assert _calls(tmp_path) == [] and rt.store.steps(plan_id) == {}
    plan = rt.store.get_plan(plan_id)
    assert plan is not None and plan.status == "running" and plan.lease_owner == owner, "its claim is left alone"
    assert rt.store.verify_audit().ok


def test_the_activities_plangate_offers_never_open_a_store_a_workflows_input_names(tmp_path: Path) -> None:
    """``run_step`` and ``finish``, registered as they are (as the engine's benchmark did), opened whatever
    store the workflow's input named: whoever could start a workflow could point the worker at another
    database, or make it create one at a path of their choice. The input now names the plan alone, and the
    only activities there are answer to their host's store."""
    from temporalio import activity
    from temporalio.testing import ActivityEnvironment

    tools, db, _, plan_id = _setup(tmp_path, "charge")
    _, args = _claimed(db, tools, "t-elsewhere")
    elsewhere = tmp_path / "elsewhere.db"
    forged = {**args, "db": f"sqlite:///{elsewhere}", "step_id": 1}
    offered = [v for v in vars(temporal_module).values() if activity._Definition.from_callable(v) is not None]
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, workflow_id=plan_id)
    (tmp_path / "go").touch()
    for one in [*offered, *temporal_module.hosted(db, tools)]:
        with contextlib.suppress(Exception):  # refused (the claim was handed to no run): what it opened counts
            env.run(one, forged)
    assert not elsewhere.exists(), "an activity opened the store the workflow's input named"
    assert "db" not in args and "tools" not in args, "the input names the plan, never a store or tools"


def test_a_workflow_whose_claim_never_comes_ends_without_a_step(
    temporal: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workflow waits for its claim, which the worker that started it hands over and then says so. One
    started by hand and never told, or whose worker died before handing its claim over, ends on its own
    without a step: it neither runs the plan nor keeps the plan's id from the workflow of its next claim."""
    from temporalio.worker import UnsandboxedWorkflowRunner

    monkeypatch.setattr(temporal_module, "_HANDOVER_SECONDS", 1.0)  # ten minutes; read by the workflow unsandboxed
    tools, db, rt, plan_id = _setup(tmp_path, "charge")
    _, args = _claimed(db, tools, "t-never")
    (tmp_path / "go").touch()
    unsandboxed = UnsandboxedWorkflowRunner()
    failed = asyncio.run(by_hand(temporal, db, tools, args, plan_id, signal=False, workflow_runner=unsandboxed))
    assert f"plan {plan_id}: no claim was handed to this workflow run within 1 s" in str(failed.__cause__)
    assert _calls(tmp_path) == [] and rt.store.steps(plan_id) == {}


def test_a_workflow_input_with_no_policy_runs_no_step_of_a_plan_checked_against_one(tmp_path: Path) -> None:
    """The activities held the policy a workflow's input carried against the one the plan was checked
    against only when it carried one: an input with none ran the steps under no policy at all, with the
    tools' own word on their idempotency (here a charge the policy says may not run twice, which Temporal's
    retry would call again) and time limits, and no deny or require rule at the call."""
    governed = {
        "version": 1,
        "name": "governed",
        "approval": {"human": ["ops"]},
        "tools": {"charge": {"idempotent": False}},
    }
    tools = tmp_path / "waiting.py"
    tools.write_text(TOOLS.format(dir=str(tmp_path)))
    db = f"sqlite:///{tmp_path}/t.db"
    rt = Runtime(Catalogue.from_module(tools), Policy.from_data(governed), db=db)
    record = rt.submit(plan({"id": 1, "tool": "charge", "params": {"to": "ann"}}), "ann")
    rt.approve(record.id, "ben", record.hash)
    args = {**_direct(db, str(tools), "t-no-policy"), "step_id": 1}
    assert args["policy"] is not None  # what plangate's worker writes
    step, _ = activities(db, str(tools))
    (tmp_path / "go").touch()
    with pytest.raises(Exception, match=r"checked against policy \w+…, and this workflow carries no policy: it runs"):
        step({**args, "policy": None})
    assert _calls(tmp_path) == [] and rt.store.steps(record.id) == {}


def test_a_step_row_changed_after_the_check_never_feeds_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each step's activity held the plan's step rows against the audit log, then read them again from the
    store to run the step: a row changed in between (a trigger, an operator) was acted on unchecked, here an
    output that fed the next step's mail. The step now runs on the rows as checked, read under the log's lock."""
    from tests.test_attacks_temporal2 import _setup as _setup_steps

    tools, db, rt, plan_id = _setup_steps(
        tmp_path,
        {"id": 1, "tool": "look", "params": {"to": "ann"}},
        {"id": 2, "tool": "mail", "params": {"to": "${1}"}},
    )
    args = _direct(db, tools, "t-changed")
    step, _ = activities(db, tools)
    assert step({**args, "step_id": 1}) == "succeeded"
    real = temporal_module._check_claim

    def then_changed(store: Any, args: dict[str, Any], owner: str, policy: Any) -> Any:
        checked = real(store, args, owner, policy)
        with store.transaction():  # the row changed the moment the check is done
            store.command("UPDATE steps SET output = ? WHERE plan_id = ? AND step_id = 1", ('"eve"', plan_id))
        return checked

    monkeypatch.setattr(temporal_module, "_check_claim", then_changed)
    assert step({**args, "step_id": 2}) == "succeeded"
    sent = rt.store.steps(plan_id)[2]
    assert sent.params == {"to": "ann"}, "the mail went where the checked output said"


def test_a_step_row_changed_after_the_check_never_decides_the_plans_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan's end was decided on the step rows read again after the check: a failed step's row set to
    succeeded in between ended the plan as succeeded, its answer drawn from an output no tool gave."""
    from tests.test_attacks_temporal2 import _setup as _setup_steps

    tools, db, rt, plan_id = _setup_steps(tmp_path, {"id": 1, "tool": "send", "params": {"to": "ann"}})
    args = {**_direct(db, tools, "t-ended"), "step_id": 1}
    step, finish = activities(db, tools)
    assert step(args) == "failed"
    real = temporal_module._check_claim

    def then_changed(store: Any, args: dict[str, Any], owner: str, policy: Any) -> Any:
        checked = real(store, args, owner, policy)
        with store.transaction():
            store.command("UPDATE steps SET status = 'succeeded', output = '\"sent\"' WHERE plan_id = ?", (plan_id,))
        return checked

    monkeypatch.setattr(temporal_module, "_check_claim", then_changed)
    assert finish(args) == "halted"
    assert [e.kind for e in rt.trace(plan_id)][-1] == "run.halted"
