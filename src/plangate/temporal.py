"""The Temporal backend: an approved plan runs as a Temporal workflow, each step an activity.

The workflow walks the plan's dependency graph and starts an activity for every step
whose inputs are done, several at once where the plan allows; the activity's id is the
step's idempotency key, ``plan_id:step_id``. Each activity runs exactly one step through
plangate's own engine, so the audit events, the durable ``started`` record, and the rules
for halting and for unknown outcomes are the same as on the embedded engine: when
Temporal retries an activity whose worker died, a completed step is not run again, nor one
whose failure this run recorded, an idempotent one runs again under the same key, and any
other ends the run for a person.

A step's time limit and retries are the engine's: ``one()`` waits for the call up to its
limit and makes the retries itself, and each activity's ``start_to_close_timeout`` is that
budget plus a margin, so the engine's limit fires first. Temporal's retries are for an
activity whose worker was lost, whatever the tool: ``one()`` finds the ``started`` record
and never calls a tool that is not idempotent again (it records the unknown outcome, which
is what halts the run for a person), so they are kept for every step. A worker is known to
be lost by its heartbeats: while a step runs, a thread beside it tells Temporal the worker
is alive, and once they stop for the heartbeat timeout (seconds, not the step's budget)
Temporal runs the activity again on a worker that is. A step whose store went away after its tool
answered hands the outcome to Temporal's retry in its heartbeat's details, sealed under the audit key
and bound to the step, its attempt and the run's lease; the retry records it once (:func:`_unsealed`).

``plangate worker --temporal HOST:PORT`` hosts the workflow and the activities and starts
a workflow (id = plan id, never two at once) for each approved plan it claims, then hands
its claim to the workflow run Temporal started (:func:`start`): an activity acts only under
its own run's claim, so a workflow started by hand, whatever its input, runs no step. The
activities use their host's store and tools (:func:`hosted`); the workflow's input names the
plan. The worker's timeouts and how many activities and workflow tasks it runs at once are
:class:`Settings`.
Install with ``pip install 'plangate[temporal]'``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import dataclasses
import functools
import hmac
import json
import logging
import secrets
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from plangate import audit, ledger, lifecycle, timeouts, tracing
    from plangate._auditkey import audit_key
    from plangate._calls import Outcome
    from plangate._clock import SystemClock
    from plangate.engine import Engine, Unconfirmed
    from plangate.errors import GovernanceError, LeaseLostError, PlangateError, StoreLostError
    from plangate.plan import Plan, canonical
    from plangate.policy import Policy
    from plangate.record import Claim
    from plangate.runtime import Runtime
    from plangate.store import PlanQuery, StepRow, open_store
    from plangate.tools import Catalogue

TASK_QUEUE = "plangate"
_log = logging.getLogger("plangate.temporal")
_LEASE_SECONDS = 3600.0  # a workflow's lease: Temporal itself keeps the run going, not this process
_BEAT_SECONDS = 1.0  # how often a step's heartbeats go out (to Temporal too: the SDK's throttle is held to it)
_MARGIN_SECONDS = 60.0  # over a step's own budget: the engine's limit, not Temporal's, ends a hung call
_LOCAL_ACTIVITIES = 2  # plangate's own bookkeeping (a plan's end), on threads of its own beside the steps'
_HANDOVER_SECONDS = 600.0  # a run left without its claim (its worker died as it started it) ends, well within the lease
_STEP, _FINISH = "plangate.step", "plangate.finish"  # the activities' names: the host's own (hosted) answer to them


@dataclass(frozen=True)
class Settings:
    """How a Temporal worker runs activities; the timeouts travel in each workflow's input, so a retry uses them.

    ``heartbeat_seconds``: how long Temporal waits without a heartbeat from a step's activity before it
    runs the activity again elsewhere (a killed worker); ``margin_seconds``: the start-to-close timeout
    over the step's own budget; ``max_activities`` steps and ``max_workflow_tasks`` workflow tasks at once
    in this worker, the steps on ``activity_threads`` threads (default: one per step, plus room for the
    plans' ends).
    """

    heartbeat_seconds: float = 10.0
    margin_seconds: float = _MARGIN_SECONDS
    max_activities: int = 16
    max_workflow_tasks: int = 16
    activity_threads: int | None = None

    @property
    def threads(self) -> int:
        return self.activity_threads or self.max_activities + _LOCAL_ACTIVITIES

    def check(self) -> None:
        """Refuse settings under which a step could be lost or never start."""
        for seconds in (self.heartbeat_seconds, self.margin_seconds):
            # Not a number, infinite or beyond a duration: each workflow task would fail making the timeout.
            if not (0 < seconds <= timeouts.MOST_SECONDS):
                raise ValueError(
                    "the heartbeat timeout and the start-to-close margin must be more than 0 seconds "
                    f"and at most {timeouts.MOST_SECONDS:g} seconds"
                )
        if self.max_activities < 1 or self.max_workflow_tasks < 2:
            raise ValueError("a Temporal worker needs at least 1 activity and 2 workflow tasks at once")
        if self.threads <= self.max_activities:
            raise ValueError(
                f"{self.threads} activity threads for {self.max_activities} activities at once leave none "
                "for the plans' ends: give more threads than activities"
            )


def _run_lease(owner: str, run_id: str) -> str:
    """The lease a claim (``owner``) becomes once handed to the workflow run that carries it on: no other run's."""
    return f"{owner} (workflow run {run_id})"


def _activity_lease(args: dict[str, Any]) -> str:
    """The lease this activity may act under: its plan's claim, as handed to the workflow run it belongs to.

    Which run that is, Temporal says, not the input: a workflow started by hand (under any id,
    with a running plan's input copied) is another run, and finds the plan under a lease that
    is not its own.
    """
    info = activity.info()
    if info.workflow_id != args["plan_id"] or info.workflow_run_id is None:  # None: an activity of no workflow
        raise ApplicationError(  # plangate starts a plan's workflow under the plan's id, and only once
            f"workflow {info.workflow_id} is not plan {args['plan_id']}'s: it runs none of its steps",
            non_retryable=True,
        )
    return _run_lease(args["owner"], info.workflow_run_id)


def _stepper(db: str, tools: str, args: dict[str, Any], owner: str, known: Unconfirmed | None = None) -> Any:
    """The engine for one activity: the plan text claimed when the workflow started, never what the store holds now.

    The text travels in the workflow's own history with its approved hash. The step rows the engine
    acts on are the ones held against the audit log, read under the log's lock in the step's own
    transaction (:func:`_held`), so nothing changed in the store since the claim, or since the check,
    reaches a tool. ``known``: the outcome an earlier attempt of the step knew and could not record.
    """
    body = Plan.parse(args["body"])
    if body.hash != args["hash"]:
        raise ApplicationError(
            f"plan {args['plan_id']}: the workflow's plan text is not the approved one", non_retryable=True
        )
    policy = Policy.from_data(json.loads(args["policy"])) if args.get("policy") else None
    store = open_store(db)
    engine = Engine(store=store, catalogue=_catalogue(tools), clock=SystemClock(), policy=policy, owner=owner)
    stepper = engine.stepper(
        args["plan_id"],
        args["version"],
        body,
        actor="temporal",
        traceparent=args.get("traceparent"),
        held=functools.partial(_held, store, args, owner, policy),
        known=known,
    )
    return stepper, store


def _held(store: Any, args: dict[str, Any], owner: str, policy: Policy | None) -> Mapping[int, StepRow]:
    """The plan's step rows as held against its audit log, once the claim is checked (:func:`_check_claim`);
    and the workflow's lease renewed: one that runs longer than a lease is not taken over by another runner
    while its steps still start; one whose activities stopped for a whole lease may be."""
    rows = _check_claim(store, args, owner, policy)
    if not store.renew(args["plan_id"], owner, _now(seconds=_LEASE_SECONDS)):
        raise GovernanceError(f"plan {args['plan_id']} was taken over: it is no longer this workflow's")
    return rows


@contextlib.contextmanager
def _refusals(store: Any, args: dict[str, Any], owner: str) -> Iterator[None]:
    """A step or an end the claim's check refuses fails the activity for good, and gives the lease back, as a
    plain worker gives back a plan it may not run: its lease no longer hides it (for up to an hour) from the
    runners, whose claims are refused the same way and say why."""
    try:
        yield
    except GovernanceError as refused:
        with contextlib.suppress(Exception):
            store.release(args["plan_id"], owner)
        raise ApplicationError(str(refused), non_retryable=True) from None


@functools.lru_cache(maxsize=8)
def _catalogue(spec: str) -> Catalogue:
    """The activity's tools, opened once per worker process: an MCP server is not started for each step."""
    return Catalogue.from_spec(spec)


def _check_claim(store: Any, args: dict[str, Any], owner: str, policy: Policy | None) -> Mapping[int, StepRow]:
    """The plan must still be running under this workflow run's claim (``owner``), for the hash and the
    policy it carries, with the approvals the log holds and the steps it recorded; else nothing runs.
    The step rows as checked."""
    with store.snapshot():
        row = store.get_plan(args["plan_id"])
        if row is None or row.lease_owner != owner or row.status != "running":
            held = f"{row.status} under {row.lease_owner}" if row else "not there"
            raise GovernanceError(
                f"plan {args['plan_id']} is {held}, not under this workflow run's claim ({owner}): "
                "it runs none of its steps"
            )
        version = store.get_version(row.id, row.version)
        if version is None or (row.version, row.hash) != (args["version"], args["hash"]):
            raise GovernanceError(f"plan {row.id}'s current version is not the one this workflow runs")
        carried = policy.hash if policy is not None else None
        if carried != version.policy_hash:  # none carried is not the one either: the engine would hold no rule
            raise GovernanceError(
                f"plan {row.id} was checked against {_policy(version.policy_hash)}, and this workflow carries "
                f"{_policy(carried)}: it runs none of its steps"
            )
        rows = ledger.right_to_run(store, row, version)[1].rows
        assert rows is not None  # a plan's step rows are read to be held against its events
        return rows


def _policy(policy_hash: str | None) -> str:
    return f"policy {policy_hash[:12]}…" if policy_hash else "no policy"


class _Heartbeats:
    """Heartbeats to Temporal from a thread beside the step, whatever its tool does meanwhile.

    They stop when this process dies, and Temporal then runs the activity again once ``timeout``
    passes. A late one, after the activity ended, is dropped by the SDK. Each carries ``details``:
    none, or the outcome of the step's call that an attempt knew and could not record (:func:`_seal`),
    which the next attempt reads (``activity.info().heartbeat_details``) and records.
    """

    def __init__(self, timeout: float | None, details: tuple[Any, ...] = ()) -> None:
        self.timeout, self.details = timeout, details
        self.stop = threading.Event()
        self.context = contextvars.copy_context()  # the activity's: activity.heartbeat() finds it there
        # One heartbeat at a time: a context is entered by one thread at once (Python refuses a second), and
        # the SDK keeps a heartbeat's context entered until the worker's event loop takes it, seconds when busy.
        self.sending = threading.Lock()

    def __enter__(self) -> _Heartbeats:
        if self.timeout:  # none: a workflow started before there were heartbeats
            threading.Thread(target=self._beat, name="plangate-heartbeat", daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()

    def _beat(self) -> None:
        assert self.timeout
        while not self.stop.wait(min(_BEAT_SECONDS, self.timeout / 4)):
            try:
                self._send()
            except Exception:  # noqa: BLE001 -- the worker is shutting down: the step's own outcome decides
                return

    def _send(self) -> None:
        # The details are read under the lock: none sent after carry()'s can be older. The SDK waits 10 s for the
        # worker's loop to take a thread's heartbeat, then raises; it still goes out once the loop gets to it, and
        # the step's go on (were they to stop, Temporal would run the step again beside itself, however long a
        # heartbeat timeout the worker was given for a busy moment).
        with self.sending, contextlib.suppress(TimeoutError):
            self.context.run(activity.heartbeat, *self.details)

    def carry(self, details: dict[str, Any]) -> None:
        """Send ``details`` as the attempt's last heartbeat, after the one in flight if any, before it fails.
        The SDK sends at most one heartbeat per throttle interval, holding a later one back, and hands the
        last one's details to Temporal with the attempt's failure (``last_heartbeat_details``), where the
        retry reads them: the attempt need not wait for them to go out."""
        self.details = (details,)
        self._send()


def _seal(args: dict[str, Any], owner: str, known: Unconfirmed) -> dict[str, Any]:
    """What a step's attempt knew of its call and could not record, bound to the plan, its version and text,
    the step, the call's attempt and the run's lease, and sealed under the audit key: Temporal's history is
    outside plangate's trust, and no outcome a tool did not give may come back from it."""
    (attempt, outcome), *_ = known.outcomes
    told = {**_binding(args, owner), "attempt": attempt, "outcome": dataclasses.asdict(outcome)}
    return {**told, "seal": _chain().seal_text(_sealed_text(told))}


def _unsealed(args: dict[str, Any], owner: str) -> Unconfirmed | None:
    """The outcome an earlier attempt of this step knew, from its heartbeat's details, if plangate sealed it
    for this very step of this run; else None (details from anywhere else are ignored, and said so)."""
    details = activity.info().heartbeat_details
    if not details:
        return None
    told = details[0]
    try:
        seal, told = told["seal"], {k: v for k, v in told.items() if k != "seal"}
        sealed = hmac.compare_digest(str(seal), _chain().seal_text(_sealed_text(told)))
        outcome = Outcome(**told["outcome"])
        bound = sealed and {k: told[k] for k in _binding(args, owner)} == _binding(args, owner)
        bound = bound and outcome.step_id == int(args["step_id"]) and isinstance(told["attempt"], int)
    except (TypeError, KeyError, AttributeError, ValueError):
        bound = False
    if not bound:
        _log.warning(
            "plan %s step %s: a heartbeat's details that plangate did not seal for this step of this run "
            "are ignored: no outcome is taken from them",
            args["plan_id"],
            args["step_id"],
        )
        return None
    return Unconfirmed(((told["attempt"], outcome),))


def _binding(args: dict[str, Any], owner: str) -> dict[str, Any]:
    keys = ("plan_id", "version", "hash", "step_id")
    return {**{key: args[key] for key in keys}, "lease": owner}


def _sealed_text(told: dict[str, Any]) -> str:
    return f"temporal step outcome\n{canonical(told)}"  # a text no other seal under the key can have


@functools.lru_cache(maxsize=1)
def _chain() -> audit.Chain:
    return audit.Chain(audit_key())


def _run_step(db: str, tools: str, args: dict[str, Any]) -> str:
    owner = _activity_lease(args)
    known = _unsealed(args, owner)
    carried = () if known is None else tuple(activity.info().heartbeat_details)  # until recorded: this may fail too
    with _Heartbeats(args.get("heartbeat_seconds"), carried) as beats:
        stepper, store = _stepper(db, tools, args, owner, known)
        # The lease, renewed while the step runs, as on any runner: a step longer than the lease keeps it,
        # and one that lost it makes no more retries.
        keeper = lifecycle.LeaseKeeper(
            store, args["plan_id"], owner, _LEASE_SECONDS, lambda: _now(seconds=_LEASE_SECONDS)
        )
        stepper.e.lease_lost = keeper.lost
        try:
            with keeper, _refusals(store, args, owner):
                return str(stepper.one(int(args["step_id"])))
        except StoreLostError as cut:  # the next attempt records what the call gave (Temporal retries it)
            beats.carry(_seal(args, owner, cut.known))
            raise
        finally:
            stepper.spans.close()  # a step span left open by a raise ends here
            store.close()


def _finish(db: str, tools: str, args: dict[str, Any]) -> str:
    owner = _activity_lease(args)
    stepper, store = _stepper(db, tools, args, owner)
    try:
        with _refusals(store, args, owner):
            return str(stepper.finish().status)
    except ApplicationError:
        ended = _ended(db, args)  # a retry of a finish whose first attempt recorded the end: said again
        if ended is None:
            raise
        return ended
    finally:
        store.close()


def _ended(db: str, args: dict[str, Any]) -> str | None:
    """How the plan ended, when it ended with this workflow's version and text (None: it did not)."""
    store = open_store(db)
    try:
        row = store.get_plan(args["plan_id"])
    finally:
        store.close()
    same = row is not None and (row.version, row.hash) == (args["version"], args["hash"])
    return row.status if same and row is not None and row.status in ("succeeded", "halted") else None


def hosted(db: str, tools: str) -> list[Callable[[dict[str, Any]], str]]:
    """The workflow's activities (a step, a plan's end) for a host that answers to ``db`` and ``tools`` only.

    These are the only activities there are: the workflow's input names the plan, never a store
    or tools file (or MCP command), so whoever can start a workflow on the Temporal cluster cannot
    choose the code that runs an approved plan's steps, nor the store it answers to. :func:`serve`
    hosts these; an application hosting plangate's activities in its own Temporal worker does too.
    """

    # A cancel (the attempt timed out, the worker shuts down) is not raised into the step's thread: an
    # exception at any point of the engine's bookkeeping is worse than an attempt whose result is ignored.
    @activity.defn(name=_STEP, no_thread_cancel_exception=True)
    def run_step(args: dict[str, Any]) -> str:
        return _run_step(db, tools, args)

    @activity.defn(name=_FINISH)
    def finish(args: dict[str, Any]) -> str:
        return _finish(db, tools, args)

    return [run_step, finish]


@workflow.defn(name="plangate.Plan")
class PlanWorkflow:
    """Steps as activities, in dependency order; the first failure stops new steps.

    Nothing starts before the worker that started this run says the plan's claim is the run's
    (:meth:`claimed`): its activities would be refused. A run whose worker died before it could
    say so ends without a step, and the plan's next claim starts a workflow of its own.
    """

    def __init__(self) -> None:
        self.handed = False

    @workflow.signal(name="plangate.claimed")
    def claimed(self) -> None:
        """The plan's claim was handed to this run (:func:`start`). Anyone may say so; only the lease decides."""
        self.handed = True

    async def _wait_for_claim(self, plan_id: str) -> None:
        try:
            await workflow.wait_condition(lambda: self.handed, timeout=timedelta(seconds=_HANDOVER_SECONDS))
        except TimeoutError:
            raise ApplicationError(
                f"plan {plan_id}: no claim was handed to this workflow run within {_HANDOVER_SECONDS:g} s: "
                "it runs none of its steps",
                non_retryable=True,
            ) from None

    @workflow.run
    async def run(self, args: dict[str, Any]) -> str:
        await self._wait_for_claim(args["plan_id"])
        budgets: dict[str, float] = args.get("budgets", {})  # absent from workflows started before there were limits
        margin = float(args.get("margin_seconds", _MARGIN_SECONDS))
        heartbeat = args.get("heartbeat_seconds")  # absent from workflows started before there were heartbeats
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
                        _STEP,
                        {**args, "step_id": s},
                        activity_id=f"{args['plan_id']}:{s}",
                        start_to_close_timeout=timedelta(seconds=budgets.get(str(s), 540.0) + margin),
                        heartbeat_timeout=timedelta(seconds=heartbeat) if heartbeat else None,
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
                _FINISH, args, start_to_close_timeout=timedelta(minutes=1), retry_policy=RetryPolicy(maximum_attempts=5)
            )
        )


def workflow_args(claim: Claim, catalogue: Catalogue, settings: Settings = Settings()) -> dict[str, Any]:
    """The workflow's input for a claimed run: the approved text and hash travel in Temporal's history,
    with the activities' timeouts, so an activity retried on another worker keeps them. It names no
    store and no tools: the activities' host has its own (:func:`hosted`).

    The steps' order is the engine's (:func:`plangate.graph.run_deps`): data flow, and effects as barriers,
    each tool's effect as the claim's policy says it is, as the engine holds it.
    """
    from plangate import timeouts
    from plangate._overrides import governed
    from plangate.graph import run_deps

    catalogue = governed(catalogue, claim.policy)
    deps = run_deps(claim.body, lambda name: catalogue[name].effect if name in catalogue else None)
    # Held to a year: a tool may declare any limit, and a longer budget is beyond a Temporal duration (each of the
    # workflow's tasks would fail making the timeout, for ever); the engine's own limit still ends the call.
    budgets = {
        str(s.id): min(timeouts.budget(catalogue[s.tool], claim.policy), timeouts.MOST_SECONDS)
        for s in claim.body.steps
        if s.tool in catalogue
    }
    return {
        "plan_id": claim.plan.id,
        "version": claim.plan.version,
        "body": claim.body.canonical_json(),
        "hash": claim.body.hash,
        "owner": claim.owner,
        "order": [step.id for step in claim.body.steps],
        "deps": {str(k): sorted(v) for k, v in deps.items()},
        "budgets": budgets,
        "heartbeat_seconds": settings.heartbeat_seconds,
        "margin_seconds": settings.margin_seconds,
        "policy": claim.policy.canonical_json() if claim.policy is not None else None,
    }


async def serve(
    address: str,
    db: str,
    tools: str,
    *,
    drain: bool = False,
    poll: float = 1.0,
    name: str | None = None,
    settings: Settings = Settings(),
) -> int:
    """Host the workflow and activities, and start a workflow for each approved plan. Returns plans run.

    With ``drain``, return once no plan is left to claim and no workflow of a plan in this store is
    still running: a worker started after another was killed runs what Temporal retries.
    """
    from plangate import lifecycle

    settings.check()
    # The lease names no process: the workflow, whose activities any worker runs, outlives this one.
    name = name or lifecycle.runner("temporal-worker", process=False)
    from temporalio.client import Client
    from temporalio.worker import Worker

    client = await Client.connect(address)
    catalogue = Catalogue.from_spec(tools)
    refused: list[str] = []
    ran = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=settings.threads) as pool:
        async with Worker(
            client,
            task_queue=TASK_QUEUE,
            workflows=[PlanWorkflow],
            activities=hosted(db, tools),
            activity_executor=pool,
            max_concurrent_activities=settings.max_activities,
            max_concurrent_local_activities=settings.threads - settings.max_activities,
            max_concurrent_workflow_tasks=settings.max_workflow_tasks,
            # The SDK sends one heartbeat per 0.8 of the timeout at most, holding the others back: a live worker's
            # pause of a fifth of the timeout at the wrong moment had Temporal run a step still running elsewhere.
            max_heartbeat_throttle_interval=timedelta(seconds=_BEAT_SECONDS),
        ):
            outage = timeouts.Outage(_log, f"worker {name}")
            while True:
                try:
                    claim = _claim(db, catalogue, name, refused)
                except Exception as exc:  # noqa: BLE001 - a store out of reach (a restart, a cut) is waited out
                    await asyncio.sleep(outage.failed(exc))
                    continue
                outage.over()
                if claim is not None:
                    ran += await _run(client, db, claim, workflow_args(claim, catalogue, settings), refused)
                elif drain and not await _running(client, db):
                    return ran
                else:
                    await asyncio.sleep(poll)


def _claim(db: str, catalogue: Catalogue, name: str, refused: list[str]) -> Claim | None:
    """The same claim as any runner: the exact approved text, under a lease of this worker's that names this
    claim alone. The run's activities are fenced by it; were it the worker's name, an attempt of an earlier
    run of the same plan (a corrected version claimed again by this worker) would pass the new run's fence."""
    while True:
        owner = f"{name}/{secrets.token_hex(4)}"
        store = open_store(db)
        try:
            plan_id = store.claim(owner, _now(), _now(minutes=60), skip=refused)
            if plan_id is None:
                return None
            try:
                return Runtime(catalogue, db=store, lease_seconds=_LEASE_SECONDS).start(
                    plan_id, actor="temporal", owner=owner, leased=True
                )
            except PlangateError as exc:  # refused, or a record that cannot be read: not this process's to run
                refused.append(plan_id)
                _log.error("plan %s: not run by this worker: %s", plan_id, exc)
                store.release(plan_id, owner)
            except BaseException:  # the store failed (waited out by serve): the lease would hide the plan an hour
                with contextlib.suppress(Exception):
                    store.release(plan_id, owner)
                raise
        finally:
            store.close()


async def start(client: Any, db: str, claim: Claim, args: dict[str, Any]) -> Any:
    """Start the claimed plan's workflow (id = plan id, never two at once) and hand the claim to the run
    Temporal started, then tell the run so; its handle. The claim leaves this worker for that run alone:
    no other run's activities act on the plan, whatever their input says.

    A claim lost meanwhile (:class:`~plangate.errors.LeaseLostError`) ends the run before it starts a step.
    """
    from temporalio.common import WorkflowIDReusePolicy

    started = await client.start_workflow(
        PlanWorkflow.run,
        args,
        id=claim.plan.id,
        task_queue=TASK_QUEUE,
        # Temporal never starts a second workflow under the id while one runs; once the plan's last one
        # ended (halted, or failed and its lease run out), the claim, which only one runner holds,
        # decides: a plan corrected after a halt (a new version, approved) runs under the same id.
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
    )
    run = client.get_workflow_handle(claim.plan.id, run_id=started.first_execution_run_id)
    try:
        _hand_over(db, claim, run.run_id)
    except BaseException:
        with contextlib.suppress(Exception):  # not left waiting for a claim that never comes
            await run.terminate(reason="its claim was not handed to it")
        raise
    await run.signal(PlanWorkflow.claimed)
    return run


def _hand_over(db: str, claim: Claim, run_id: str) -> None:
    store = open_store(db)
    try:
        until = _now(seconds=_LEASE_SECONDS)
        if not store.hand_over(claim.plan.id, claim.owner, _run_lease(claim.owner, run_id), until):
            raise LeaseLostError(f"{claim.owner} no longer holds its claim on plan {claim.plan.id}: its workflow ended")
    finally:
        store.close()


async def _run(client: Any, db: str, claim: Claim, args: dict[str, Any], refused: list[str]) -> int:
    """Start the plan's workflow and wait for its end; 1 if it ended."""
    from temporalio.client import WorkflowFailureError
    from temporalio.exceptions import WorkflowAlreadyStartedError

    plan_id = claim.plan.id
    # The run's span is this worker's; each step's, in whichever worker runs its activity, joins it.
    spans = tracing.default().run(plan_id, claim.plan.version, claim.body, actor="temporal")
    with spans:
        try:
            run = await start(client, db, claim, {**args, "traceparent": spans.run_traceparent()})
            status = await run.result()
        except (WorkflowAlreadyStartedError, WorkflowFailureError, LeaseLostError) as failed:
            spans.close(failed)
            # It stays running under this worker's lease for a person to look at, and is not
            # claimed again by this worker; once the lease runs out, another runner resumes it.
            refused.append(plan_id)
            return 0
        spans.end(status)
    return 1


async def _running(client: Any, db: str) -> bool:
    """Whether a plan this store holds as running still has a running workflow (its first worker may be dead)."""
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError

    store = open_store(db)
    try:
        plan_ids = [row.id for row in store.list_plans(PlanQuery(status="running"), limit=10_000)]
    finally:
        store.close()
    for plan_id in plan_ids:
        try:
            found = await client.get_workflow_handle(plan_id).describe()
        except RPCError:  # not a workflow: a plain worker's plan
            continue
        if found.status == WorkflowExecutionStatus.RUNNING:
            return True
    return False


def _now(minutes: int = 0, seconds: float = 0.0) -> str:
    from plangate._clock import iso

    return iso(SystemClock().now() + timedelta(minutes=minutes, seconds=seconds))
