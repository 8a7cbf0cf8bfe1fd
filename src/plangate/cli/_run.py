"""Running approved plans and putting halted ones right: execute, resume, settle, compensate, close, worker."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from plangate import timeouts, tracing
from plangate._extras import need
from plangate.cli import _remote
from plangate.cli._common import (
    absolute,
    acting,
    db_option,
    identity_options,
    open_runtime,
    policy_option,
    print_progress,
    recorded_tools_option,
    token_option,
    with_tools,
)
from plangate.cli._errors import EXIT_HALTED
from plangate.cli._remote import server_option
from plangate.errors import UsageError
from plangate.policy import Policy
from plangate.tools import Catalogue

if TYPE_CHECKING:
    from plangate.worker import Worker


def finite(value: float) -> float:
    """A number of seconds that is a number: NaN passes every range check, so it is refused here."""
    if math.isnan(value):
        raise click.BadParameter("not a number of seconds")
    return value


def _run_command(
    method: str,
    *,
    plan_id: str,
    tools_spec: str | None,
    policy_file: Path | None,
    db: str | None,
    user: str | None,
    token: str | None,
    server: str | None,
) -> None:
    if server:
        api = _remote.client(server, token)
        record = _remote.record(api, plan_id)
        click.echo(f"{method} plan {record.id} v{record.version}: {record.task} (on {api.url})")
        ok, text = _remote.run(api, record.id, method)
        click.echo(text)
        sys.exit(0 if ok else EXIT_HALTED)
    # Closed on the way out: its connection then may be one made again after the store went away mid-run.
    with closing(open_runtime(db, policy_file=policy_file)) as runtime:
        record = with_tools(runtime, plan_id, tools_spec)
        runner = acting(
            runtime,
            user,
            token,
            "execute",
            category=record.category,
            requested_by=record.requested_by,
            default="engine",
        )
        click.echo(f"{method} plan {record.id} v{record.version}: {record.task}")
        result = getattr(runtime, method)(record.id, actor=runner, progress=print_progress)
    click.echo(str(result))
    sys.exit(0 if result.ok else EXIT_HALTED)


def _run_options(verb: str) -> Callable[[Callable[..., None]], click.Command]:
    """The command ``execute`` or ``resume``: the same options, one way of running."""

    def command(fn: Callable[..., None]) -> click.Command:
        for option in (
            server_option,
            db_option,
            token_option,
            click.option(
                "--as",
                "user",
                metavar="USER",
                help=f"Who {verb} the run (local mode: recorded, default 'engine'; with accounts: your token's).",
            ),
            policy_option,
            recorded_tools_option,
            click.argument("plan_id", metavar="ID"),
        ):
            fn = option(fn)
        return click.command(fn.__name__.removesuffix("_command"))(fn)

    return command


@_run_options("starts")
def execute(**options: Any) -> None:
    """Execute approved plan ID. Exit 0 when it succeeds, 3 when it halts, 4 when it may not run.

    A finished plan is not run again: its recorded result is shown. The exact text that was
    approved runs, or nothing: a plan whose stored text, rows or approvals disagree with the
    audit log is refused. When the tools' contracts or the policy (--policy) changed since
    the plan was checked, it is checked again, and sent back for approval if it must be.
    """
    _run_command("execute", **options)


@_run_options("resumes")
def resume(**options: Any) -> None:
    """Resume plan ID after a halt or a crash: finished steps are kept, never run again.

    A step that started but has no recorded outcome is run again only if its tool is
    idempotent (with the same idempotency key); otherwise the run halts for a person.
    """
    _run_command("resume", **options)


@click.command("settle")
@click.argument("plan_id", metavar="ID")
@click.argument("step", type=int)
@click.option("--done/--not-done", required=True, help="Whether the step's effect happened.")
@click.option("--output", "output_json", metavar="JSON", help="With --done: the output you observed, as JSON.")
@click.option("--note", help="What you checked (recorded).")
@click.option("--undo", is_flag=True, help="Settle the undo of STEP (a rollback's call cut off), not the step.")
@identity_options
@recorded_tools_option
@db_option
@server_option
def settle_command(
    *,
    plan_id: str,
    step: int,
    undo: bool,
    done: bool,
    output_json: str | None,
    note: str | None,
    user: str | None,
    token: str | None,
    tools_spec: str | None,
    db: str | None,
    server: str | None,
) -> None:
    """Settle a step whose outcome is unknown: it happened (--done) or it did not (--not-done, safe to run again).

    Then `plangate resume ID` carries on. With --undo, the undo of STEP: a rollback's
    compensating call cut off with no outcome; done, it counts as undone; not done, the next
    `plangate compensate` calls it again.
    """
    if step < 1:
        raise UsageError(f"STEP is a step's id, a positive number, not {step} (its undo: STEP --undo)")
    step = -step if undo else step
    try:
        output = json.loads(output_json) if output_json else None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--output is not JSON: {exc}") from None
    if server:
        body = {"step": step, "done": done, "output": output, "note": note}
        record = _remote.decide(_remote.client(server, token), plan_id, "settle", body)
        click.echo(_settled(step, done, record.id))
        return
    runtime = open_runtime(db)
    record = with_tools(runtime, plan_id, tools_spec, required=False)
    person = acting(runtime, user, token, "decide", category=record.category)
    record = runtime.settle(record.id, step, done=done, actor=person, output=output, note=note)
    click.echo(_settled(step, done, record.id))


def _settled(step: int, done: bool, plan_id: str) -> str:
    said = "done" if done else "not done"
    if step > 0:
        return f"step {step} settled as {said}; now: plangate resume {plan_id[:8]}"
    return f"the undo of step {-step} settled as {said}; now: plangate compensate {plan_id[:8]} (or close it)"


@click.command("compensate")
@click.argument("plan_id", metavar="ID")
@identity_options
@click.option("--reason", required=True, help="Why the plan is rolled back (recorded).")
@recorded_tools_option
@db_option
@server_option
def compensate_command(
    *,
    plan_id: str,
    user: str | None,
    token: str | None,
    reason: str,
    tools_spec: str | None,
    db: str | None,
    server: str | None,
) -> None:
    """Roll back halted plan ID: completed steps with a compensating tool are undone, last first."""
    if server:
        api = _remote.client(server, token)
        reply = api.call("POST", api.plan_path(plan_id, "compensate"), {"reason": reason})
        click.echo(reply["summary"])
        sys.exit(0 if reply["status"] == "compensated" else EXIT_HALTED)
    runtime = open_runtime(db)
    record = with_tools(runtime, plan_id, tools_spec)
    person = acting(runtime, user, token, "decide", category=record.category)
    result = runtime.compensate(record.id, actor=person, reason=reason)
    click.echo(str(result))
    sys.exit(0 if result.status == "compensated" else EXIT_HALTED)


@click.command("close")
@click.argument("plan_id", metavar="ID")
@identity_options
@click.option("--reason", required=True, help="Why the plan ends here (required, recorded).")
@db_option
@server_option
def close_command(
    *, plan_id: str, user: str | None, token: str | None, reason: str, db: str | None, server: str | None
) -> None:
    """Close halted plan ID for good: it will not be resumed, and nothing of it runs again.

    What ran stays as it is (to undo it, use compensate). A decision like a rollback: never
    the requester or an author. A step whose outcome is unknown is settled first. A rollback
    that could not undo everything (compensation_incomplete) may be closed too.
    """
    if server:
        record = _remote.decide(_remote.client(server, token), plan_id, "close", {"reason": reason})
    else:
        runtime = open_runtime(db)
        record = runtime.get(plan_id)
        person = acting(runtime, user, token, "decide", category=record.category)
        record = runtime.close_plan(record.id, actor=person, reason=reason)
    click.echo(f"{record}\n  closed: {reason}")


@click.command("worker")
@click.option(
    "--tools",
    "tools_spec",
    envvar="PLANGATE_TOOLS",
    metavar="MODULE",
    help="Tools the claimed plans run with: a module (pkg.tools or a .py file), mcp:... or FILE.yaml (required). "
    "Env: PLANGATE_TOOLS.",
)
@policy_option
@db_option
@click.option(
    "--lease",
    "lease_seconds",
    type=click.FloatRange(min=timeouts.LEAST_LEASE_SECONDS, max=timeouts.MOST_SECONDS),
    callback=lambda _ctx, _param, value: finite(value),
    default=30.0,
    show_default=True,
    help="Seconds a claimed plan stays this worker's without renewal (at least 1; renewed every third of it).",
)
@click.option(
    "--drain",
    is_flag=True,
    help="Exit when no plan is left to run (with --temporal: and no workflow of this store's plans still runs).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 1024),
    default=8,
    show_default=True,
    help="Plans this worker runs at once, each under its own lease, on its own store connection.",
)
@click.option(
    "--drain-timeout",
    type=click.FloatRange(0, timeouts.MOST_SECONDS),
    callback=lambda _ctx, _param, value: finite(value),
    default=30.0,
    show_default=True,
    help="On SIGTERM: stop claiming and let running plans go on this many seconds; then release their leases.",
)
@click.option("--name", help="This worker's name (default: host and process).")
@click.option(
    "--temporal",
    "temporal_address",
    metavar="HOST:PORT",
    help="Run plans as Temporal workflows (each step an activity) on this Temporal server.",
)
@click.option(
    "--heartbeat-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="With --temporal: how long a step's activity may go without a heartbeat (sent each second while "
    "the step runs) before Temporal runs it again on another worker: how soon a killed worker's step resumes.",
)
@click.option(
    "--start-to-close-margin",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="With --temporal: an activity's start-to-close timeout over its step's own time limit, which ends "
    "a hung call first.",
)
@click.option(
    "--max-activities",
    type=click.IntRange(min=1),
    metavar="N",
    default=16,
    show_default=True,
    help="With --temporal: steps this worker runs at once.",
)
@click.option(
    "--max-workflow-tasks",
    type=click.IntRange(min=2),
    metavar="N",
    default=16,
    show_default=True,
    help="With --temporal: workflow tasks this worker runs at once.",
)
@click.option(
    "--activity-threads",
    type=click.IntRange(min=2),
    metavar="N",
    help="With --temporal: threads the steps' activities run on (default: --max-activities plus 2 for the "
    "plans' ends; more than --max-activities).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    metavar="PORT",
    help="Serve this worker's Prometheus metrics at http://HOST:PORT/metrics (needs the metrics extra).",
)
@click.option(
    "--metrics-host", default="127.0.0.1", show_default=True, help="Address the metrics listen on (--metrics-port)."
)
def worker_command(
    *,
    tools_spec: str | None,
    policy_file: Path | None,
    db: str | None,
    lease_seconds: float,
    drain: bool,
    concurrency: int,
    drain_timeout: float,
    name: str | None,
    temporal_address: str | None,
    metrics_port: int | None,
    metrics_host: str,
    **temporal: Any,
) -> None:
    """Claim approved plans and run them; several workers (on several machines) share the work.

    Use a PostgreSQL store (--db postgresql://...) to share it across machines. A killed
    worker's plan is taken over by another once its lease expires. SIGTERM (or Ctrl-C) drains:
    no new claims, running plans finish (up to --drain-timeout), leases of the rest are released
    for the next worker, exit 0. With --metrics-port, the worker serves its own Prometheus
    metrics (no login: keep it on loopback or a private network).
    """

    from plangate import lifecycle
    from plangate.worker import Worker

    if tools_spec is None:
        raise UsageError("a worker needs --tools (or PLANGATE_TOOLS)")
    if metrics_port is not None:
        _serve_metrics(db, metrics_host, metrics_port)
    if temporal_address:
        _serve_temporal(temporal_address, db, absolute(tools_spec) or tools_spec, drain, name, **temporal)
    worker = Worker(
        Catalogue.from_spec(tools_spec),
        db=db,
        policy=Policy.load(policy_file) if policy_file else None,
        lease_seconds=lease_seconds,
        name=lifecycle.runner(name or "worker"),
        concurrency=concurrency,
        drain_timeout=drain_timeout,
    )
    _serve_plans(worker, drain=drain)


def _serve_plans(worker: Worker, *, drain: bool) -> NoReturn:
    """Serve until drained or stopped by SIGTERM / SIGINT, then leave at once (see _leave_now)."""
    import signal

    stopping: list[int] = []

    def stop(signum: int, _: object) -> None:
        # A second signal may land inside the first one's handler, whose stop() holds a lock: once is enough.
        if stopping:
            return
        stopping.append(signum)
        worker.stop()
        os.write(2, b"worker: stopping: no new claims; draining the plans running\n")  # no lock a handler may hold

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    # A run's transaction holds the audit log's lock across round trips; each answer from the
    # store then waits for the interpreter's lock. Handing it over sooner shortens that hold.
    sys.setswitchinterval(0.0005)
    click.echo(f"worker {worker.name} on {worker.db or 'the default store'}, {worker.concurrency} at once", err=True)
    try:
        ran = worker.serve(drain=drain, on_result=lambda r: click.echo(f"{r.plan_id}: {r.status}"))
    finally:
        worker.close()
    for plan_id in worker.left:
        click.echo(f"worker {worker.name}: {plan_id} still running at the drain deadline: lease released", err=True)
    for problem in (worker.clock_problem, worker.store_problem):
        if problem:
            click.echo(f"worker {worker.name}: {problem}", err=True)
    click.echo(f"worker {worker.name}: {ran} plans run", err=True)
    _leave_now()


def _serve_temporal(
    address: str,
    db: str | None,
    tools: str,
    drain: bool,
    name: str | None,
    *,
    heartbeat_timeout: float,
    start_to_close_margin: float,
    max_activities: int,
    max_workflow_tasks: int,
    activity_threads: int | None,
) -> NoReturn:
    import asyncio

    from plangate import lifecycle

    need("temporal", "worker --temporal")

    from plangate.store import default_url
    from plangate.temporal import Settings, serve

    settings = Settings(
        heartbeat_seconds=heartbeat_timeout,
        margin_seconds=start_to_close_margin,
        max_activities=max_activities,
        max_workflow_tasks=max_workflow_tasks,
        activity_threads=activity_threads,
    )
    try:
        settings.check()
    except ValueError as bad:
        raise UsageError(f"worker --temporal: {bad}") from None
    ran = asyncio.run(
        serve(
            address,
            db or default_url(),
            tools,
            drain=drain,
            name=lifecycle.runner(name or "temporal-worker", process=False),  # the workflow outlives this process
            settings=settings,
        )
    )
    click.echo(f"temporal worker: {ran} plans run", err=True)
    _leave_now()


def _serve_metrics(db: str | None, host: str, port: int) -> None:
    need("metrics", "worker --metrics-port")
    from plangate import metrics
    from plangate.store import default_url

    try:
        metrics.serve_http(metrics.start(db or default_url()), host, port)
    except OSError as exc:
        raise UsageError(f"worker --metrics-port: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    click.echo(f"worker metrics on http://{host}:{port}/metrics", err=True)


COMMANDS = (execute, resume, settle_command, compensate_command, close_command, worker_command)


def _leave_now() -> NoReturn:
    """End the process without the interpreter's finalization, once everything is recorded.

    Temporal's core threads, and calls that overran their limit (a Python thread cannot be
    stopped), may still be alive; finalizing the interpreter around them can abort the
    process after its work is done. The worker's stores are closed by now.
    """
    tracing.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
