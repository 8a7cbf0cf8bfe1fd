"""The Temporal backend: an approved plan runs as a Temporal workflow, each step an activity.

The workflow walks the plan's dependency graph and starts an activity for every step
whose inputs are done, several at once where the plan allows; the activity's id is the
step's idempotency key, ``plan_id:step_id``. Each activity runs exactly one step through
plangate's own engine, so the audit events, the durable ``started`` record, and the rules
for halting and for unknown outcomes are the same as on the embedded engine: when
Temporal retries an activity whose worker died, a completed step is not run again, an
idempotent one runs again under the same key, and any other ends the run for a person.

A step's time limit and retries are the engine's: ``one()`` waits for the call up to its
limit and makes the retries itself, and each activity's ``start_to_close_timeout`` is that
budget plus a margin, so the engine's limit fires first. Temporal's retries are for an
activity whose worker was lost, whatever the tool: ``one()`` finds the ``started`` record
and never calls a tool that is not idempotent again (it records the unknown outcome, which
is what halts the run for a person), so they are kept for every step.

``plangate worker --temporal HOST:PORT`` hosts the workflow and the activities and starts
a workflow (id = plan id, so never twice) for each approved plan it claims.
Install with ``pip install 'plangate[temporal]'``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from plangate import ledger, tracing
    from plangate._clock import SystemClock
    from plangate.engine import Engine
    from plangate.errors import GovernanceError
    from plangate.plan import Plan
    from plangate.policy import Policy
    from plangate.record import Claim
    from plangate.runtime import Runtime
    from plangate.store import open_store
    from plangate.tools import Catalogue

TASK_QUEUE = "plangate"
_LEASE_SECONDS = 3600.0  # a workflow's lease: Temporal itself keeps the run going, not this process
_MARGIN_SECONDS = 60.0  # over a step's own budget: the engine's limit, not Temporal's, ends a hung call


def _stepper(args: dict[str, Any]) -> Any:
    """The engine for one activity: the plan text claimed when the workflow started, never what the store holds now.

    The text travels in the workflow's own history with its approved hash; the steps the
    store recorded are held against the audit log before each step, so nothing changed in
    the store since the claim reaches a tool.
    """
    body = Plan.parse(args["body"])
    if body.hash != args["hash"]:
        raise ApplicationError(
            f"plan {args['plan_id']}: the workflow's plan text is not the approved one", non_retryable=True
        )
    store = open_store(args["db"])
    try:
        _check_claim(store, args)
    except GovernanceError as refused:
        store.close()
        raise ApplicationError(str(refused), non_retryable=True) from None
    policy = Policy.from_data(json.loads(args["policy"])) if args.get("policy") else None
    engine = Engine(
        store=store,
        catalogue=_catalogue(args["tools"]),
        clock=SystemClock(),
        policy=policy,
        owner=args.get("owner"),
    )
    stepper = engine.stepper(
        args["plan_id"], args["version"], body, actor="temporal", traceparent=args.get("traceparent")
    )
    return stepper, store


@functools.lru_cache(maxsize=8)
def _catalogue(spec: str) -> Catalogue:
    """The activity's tools, opened once per worker process: an MCP server is not started for each step."""
    return Catalogue.from_spec(spec)


def _check_claim(store: Any, args: dict[str, Any]) -> None:
    """The plan must still be running under this workflow's claim, for the hash it carries, with the
    approvals the log holds and the steps it recorded; else nothing runs."""
    with store.snapshot():
        row = store.get_plan(args["plan_id"])
        owner = args.get("owner")
        if row is None or not owner or row.lease_owner != owner or row.status != "running":
            held = f"{row.status} under {row.lease_owner}" if row else "not there"
            raise GovernanceError(f"plan {args['plan_id']} is {held}, not running under this workflow's claim")
        version = store.get_version(row.id, row.version)
        if version is None or (row.version, row.hash) != (args["version"], args["hash"]):
            raise GovernanceError(f"plan {row.id}'s current version is not the one this workflow runs")
        if args.get("policy") and Policy.from_data(json.loads(args["policy"])).hash != version.policy_hash:
            raise GovernanceError(
                f"plan {row.id} was checked against another policy than the one this workflow carries"
            )
        ledger.right_to_run(store, row, version)


@activity.defn(name="plangate.step")
def run_step(args: dict[str, Any]) -> str:
    stepper, store = _stepper(args)
    try:
        return str(stepper.one(int(args["step_id"])))
    finally:
        stepper.spans.close()  # a step span left open by a raise ends here
        store.close()


@activity.defn(name="plangate.finish")
def finish(args: dict[str, Any]) -> str:
    stepper, store = _stepper(args)
    try:
        return str(stepper.finish().status)
    finally:
        store.close()


@workflow.defn(name="plangate.Plan")
class PlanWorkflow:
    """Steps as activities, in dependency order; the first failure stops new steps."""

    @workflow.run
    async def run(self, args: dict[str, Any]) -> str:
        budgets: dict[str, float] = args.get("budgets", {})  # absent from workflows started before there were limits
        deps: dict[int, set[int]] = {int(k): set(v) for k, v in args["deps"].items()}
        done: set[int] = set()
        halted = False
        while not halted and len(done) < len(deps):
            ready = [s for s in args["order"] if s not in done and deps[s] <= done]
            if not ready:
                break
            results = await asyncio.gather(
                *(
                    workflow.execute_activity(
                        run_step,
                        {**args, "step_id": s},
                        activity_id=f"{args['plan_id']}:{s}",
                        start_to_close_timeout=timedelta(seconds=budgets.get(str(s), 540.0) + _MARGIN_SECONDS),
                        retry_policy=RetryPolicy(maximum_attempts=5),
                    )
                    for s in ready
                )
            )
            for step_id, status in zip(ready, results, strict=True):
                if status in ("succeeded", "skipped", "failed_optional"):
                    done.add(step_id)
                else:
                    halted = True
        # Recording the end is plangate's own bookkeeping, not a step: a local activity, no round trip.
        return str(
            await workflow.execute_local_activity(
                finish, args, start_to_close_timeout=timedelta(minutes=1), retry_policy=RetryPolicy(maximum_attempts=5)
            )
        )


def workflow_args(db: str, tools: str, claim: Claim, catalogue: Catalogue) -> dict[str, Any]:
    """The workflow's input for a claimed run: the approved text and hash travel in Temporal's history.

    The steps' order is the engine's (:func:`plangate.graph.run_deps`): data flow, and effects as barriers.
    """
    from plangate import timeouts
    from plangate.graph import run_deps

    deps = run_deps(claim.body, lambda name: catalogue[name].effect if name in catalogue else None)
    budgets = {
        str(s.id): timeouts.budget(catalogue[s.tool], claim.policy) for s in claim.body.steps if s.tool in catalogue
    }
    return {
        "db": db,
        "tools": tools,
        "plan_id": claim.plan.id,
        "version": claim.plan.version,
        "body": claim.body.canonical_json(),
        "hash": claim.body.hash,
        "owner": claim.owner,
        "order": [step.id for step in claim.body.steps],
        "deps": {str(k): sorted(v) for k, v in deps.items()},
        "budgets": budgets,
        "policy": claim.policy.canonical_json() if claim.policy is not None else None,
    }


async def serve(
    address: str, db: str, tools: str, *, drain: bool = False, poll: float = 1.0, name: str | None = None
) -> int:
    """Host the workflow and activities, and start a workflow for each approved plan. Returns plans run."""
    from plangate import lifecycle

    name = name or lifecycle.runner("temporal-worker")
    from temporalio.client import Client, WorkflowFailureError
    from temporalio.common import WorkflowIDReusePolicy
    from temporalio.exceptions import WorkflowAlreadyStartedError
    from temporalio.worker import Worker

    client = await Client.connect(address)
    catalogue = Catalogue.from_spec(tools)
    refused: list[str] = []
    ran = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        async with Worker(
            client,
            task_queue=TASK_QUEUE,
            workflows=[PlanWorkflow],
            activities=[run_step, finish],
            activity_executor=pool,
        ):
            while True:
                store = open_store(db)
                plan_id = store.claim(name, _now(), _now(minutes=60), skip=refused)
                if plan_id is None:
                    store.close()
                    if drain:
                        return ran
                    await asyncio.sleep(poll)
                    continue
                # The same claim as any runner: the exact approved text, under this worker's lease.
                runtime = Runtime(catalogue, db=store, lease_seconds=_LEASE_SECONDS)
                try:
                    claim = runtime.start(plan_id, actor="temporal", owner=name)
                except GovernanceError:
                    refused.append(plan_id)
                    store.release(plan_id, name)
                    store.close()
                    continue
                store.close()
                # The run's span is this worker's; each step's, in whichever worker runs its activity, joins it.
                spans = tracing.default().run(plan_id, claim.plan.version, claim.body, actor="temporal")
                with spans:
                    try:
                        status = await client.execute_workflow(
                            PlanWorkflow.run,
                            {**workflow_args(db, tools, claim, catalogue), "traceparent": spans.run_traceparent()},
                            id=plan_id,
                            task_queue=TASK_QUEUE,
                            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                        )
                    except (WorkflowAlreadyStartedError, WorkflowFailureError) as failed:
                        spans.close(failed)
                        # It stays running under this worker's lease for a person to look at, and is
                        # not claimed again by this worker (a workflow id is never reused).
                        refused.append(plan_id)
                        continue
                    spans.end(status)
                ran += 1


def _now(minutes: int = 0) -> str:
    from plangate._clock import iso

    return iso(SystemClock().now() + timedelta(minutes=minutes))
