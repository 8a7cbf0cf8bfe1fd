"""Planning from a task: plan, run, usage, and the plan library."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import click

from plangate._clock import iso
from plangate._input import check_text
from plangate.check import check
from plangate.cli._common import (
    acting,
    base_url_option,
    db_option,
    identity_options,
    json_option,
    model_option,
    open_runtime,
    policy_option,
    prices_option,
    print_progress,
    show_record,
    summary,
    token_option,
    tools_option,
)
from plangate.cli._errors import EXIT_HALTED, EXIT_VIOLATIONS
from plangate.errors import NotPermittedError, UsageError

max_tokens_option = click.option(
    "--max-tokens", default=8192, show_default=True, help="The most tokens the model may write for the plan."
)


def _planner(
    runtime: Any, model_spec: str | None, base_url: str | None, prices_file: Path | None, max_tokens: int
) -> Any:
    from plangate.costs import PriceTable
    from plangate.models import from_spec
    from plangate.planner import Planner

    model = from_spec(model_spec, base_url=base_url) if model_spec else None
    return Planner(
        runtime.catalogue,
        model=model,
        store=runtime.store,
        policy=runtime.policy,
        prices=PriceTable.load(prices_file),
        clock=runtime.clock,
        max_tokens=max_tokens,
    )


def _planning_summary(result: Any) -> str:
    if result.source == "library":
        return f"planned from the library: template {result.template!r}, slots {result.slots} (no model call)"
    usage, cost = result.usage, result.cost
    money = f"{cost:.4f} USD" if cost is not None else "cost unknown (no price for this model)"
    return (
        f"planned by {result.model} in {len(result.calls)} call(s), {result.seconds:.1f} s: {usage.input} input, "
        f"{usage.output} output ({usage.thinking} thinking) tokens, budget {result.budget.tokens} "
        f"({result.budget.effort}, {result.budget.expected_steps} expected steps); {money}"
    )


@click.command("plan")
@click.argument("task")
@tools_option
@policy_option
@model_option
@base_url_option
@prices_option
@max_tokens_option
@click.option("--as", "user", metavar="USER", help="Who asks (for the policy's role rules).")
@db_option
@json_option
def plan_command(
    *,
    task: str,
    tools_spec: str,
    policy_file: Path | None,
    model_spec: str | None,
    base_url: str | None,
    prices_file: Path | None,
    max_tokens: int,
    user: str | None,
    db: str | None,
    as_json: bool,
) -> None:
    """Plan TASK: from the plan library, or with a model. Prints the plan, its check and policy
    result, tokens and cost. Nothing is submitted or run.

    Exit 0 when the plan passes, 1 when it has violations, 2 when no plan came out.
    """
    from plangate.planner import PlanningError

    runtime = open_runtime(db, tools_spec, policy_file)
    try:
        result = _planner(runtime, model_spec, base_url, prices_file, max_tokens).plan(task)
    except PlanningError as exc:
        raise UsageError(str(exc)) from None
    checked = check(result.plan, runtime.catalogue, runtime.policy, user=user)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "plan": result.plan.data(),
                    "planning": result.record(),
                    "check": checked.to_dict(),
                },
                indent=2,
            )
        )
    else:
        click.echo(json.dumps(result.plan.data(), indent=2, ensure_ascii=False))
        click.echo(_planning_summary(result))
        for violation in checked.violations:
            click.echo(str(violation))
        click.echo(summary(result.plan, checked))
    sys.exit(0 if checked.ok else EXIT_VIOLATIONS)


@click.command("run")
@click.argument("task")
@tools_option
@policy_option
@model_option
@base_url_option
@prices_option
@max_tokens_option
@identity_options
@click.option("--approver", metavar="USER", help="Approve at this terminal as USER (you are shown the plan first).")
@click.option(
    "--wait",
    default=0,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait for approvals given elsewhere (plangate approve, the dashboard).",
)
@db_option
def run_command(
    *,
    task: str,
    tools_spec: str,
    policy_file: Path | None,
    model_spec: str | None,
    base_url: str | None,
    prices_file: Path | None,
    max_tokens: int,
    user: str | None,
    token: str | None,
    approver: str | None,
    wait: int,
    db: str | None,
) -> None:
    """Plan TASK, submit it, get it approved, execute it, and show what happened.

    Exit 0 when it succeeds (or is left waiting for approval), 1 when rejected, 3 when it
    halts, 2 when no plan came out.
    """
    import time

    from plangate.accounts import Accounts
    from plangate.planner import PlanningError
    from plangate.story import tell

    runtime = open_runtime(db, tools_spec, policy_file)
    requester = acting(runtime, user, token, "submit")
    if approver and Accounts(runtime.store).any():  # each approver proves who they are with their own token
        raise NotPermittedError(
            "--approver is for local mode: with accounts, approvers sign in and run plangate approve"
        )
    try:
        result = _planner(runtime, model_spec, base_url, prices_file, max_tokens).plan(task)
    except PlanningError as exc:
        raise UsageError(str(exc)) from None
    click.echo(_planning_summary(result))
    record = runtime.submit(result, requested_by=requester)
    click.echo(str(record))
    for violation in record.violations:
        click.echo(f"  {violation}")
    if record.status == "rejected":
        sys.exit(EXIT_VIOLATIONS)
    if record.status == "pending_approval" and approver:
        if not sys.stdin.isatty():
            raise UsageError("--approver needs a terminal to show the plan and ask; approve with plangate approve")
        show_record(record)
        click.confirm(f"{approver}, approve plan {record.id[:8]} ({record.hash[:12]})?", abort=True)
        record = runtime.approve(record.id, approver, record.hash)
        click.echo(str(record))
    deadline = time.monotonic() + wait
    while record.status == "pending_approval" and time.monotonic() < deadline:
        time.sleep(1)
        record = runtime.get(record.id)
    if record.status != "approved":
        click.echo(
            f"waiting for approval by {' and by '.join(record.needs) or 'a person'}: "
            f"plangate approve {record.id[:8]} --as APPROVER --hash {record.hash}, then plangate execute"
        )
        sys.exit(0 if record.status == "pending_approval" else EXIT_VIOLATIONS)
    outcome = runtime.execute(record.id, actor=requester, progress=print_progress)
    click.echo(str(outcome))
    for line in tell(e for e in runtime.trace(record.id) if e.kind.startswith(("run.", "plan.approv"))):
        click.echo(line)
    sys.exit(0 if outcome.ok else EXIT_HALTED)


@click.command("usage")
@click.option("--days", default=30, show_default=True, help="Look back this many days.")
@db_option
def usage_command(*, days: int, db: str | None) -> None:
    """Planning calls by expected step count: thinking budget given vs tokens used, and cost.

    The numbers to calibrate the budget allocator from (docs/planning.md).
    """
    from datetime import timedelta

    runtime = open_runtime(db)
    since = iso(runtime.clock.now() - timedelta(days=days))
    calls = [c for c in runtime.store.calls(since=since) if c.ok]
    if not calls:
        click.echo(f"no model calls in the last {days} days")
        return
    click.echo(
        f"{'STEPS':>5}  {'CALLS':>5}  {'BUDGET':>7}  {'THINKING':>8}  {'USED/BUDGET':>11}  {'OUTPUT':>7}  "
        f"{'COST USD':>9}"
    )
    groups: dict[int, list[Any]] = {}
    for call in calls:
        groups.setdefault(call.expected_steps or 0, []).append(call)
    for steps, group in sorted(groups.items()):
        budget = sum(c.budget or 0 for c in group) / len(group)
        thinking = sum(c.thinking_tokens for c in group) / len(group)
        output = sum(c.output_tokens for c in group) / len(group)
        cost = sum(c.cost or 0.0 for c in group)
        ratio = f"{thinking / budget:.0%}" if budget else "-"
        click.echo(
            f"{steps:>5}  {len(group):>5}  {budget:>7.0f}  {thinking:>8.0f}  {ratio:>11}  {output:>7.0f}  {cost:>9.4f}"
        )
    total = sum(c.cost or 0.0 for c in calls)
    click.echo(f"{len(calls)} calls, {total:.4f} USD; unknown prices count as 0")


@click.group("library")
def library_group() -> None:
    """The plan library: approved plans kept as templates, filled from new tasks without a model."""


@library_group.command("add")
@click.argument("plan_id", metavar="ID")
@click.option("--name", help="The template's name (default: derived from the task).")
@click.option(
    "--as",
    "user",
    metavar="USER",
    help="Who adds it (local mode: recorded, default 'library'; with accounts: your token's account).",
)
@token_option
@db_option
def library_add_command(*, plan_id: str, name: str | None, user: str | None, token: str | None, db: str | None) -> None:
    """Keep approved plan ID as a template; its task's values become typed slots."""
    from plangate.library import template_from

    runtime = open_runtime(db)
    record = runtime.get(plan_id)
    user = acting(runtime, user, token, "library", category=record.category, default="library")
    if record.status not in ("approved", "running", "succeeded"):
        raise UsageError(f"plan {record.id} is {record.status}: only an approved plan can become a template")
    if record.plan is None:
        what = "is a ReAct run" if record.kind == "react" else "had its payloads purged"
        raise UsageError(f"plan {record.id} {what}: it has no plan text to keep as a template")
    chosen = check_text(name, "name", what="template") if name else None
    chosen = chosen or re.sub(r"[^a-z0-9]+", "-", record.task.lower()).strip("-")[:60]
    replaced = _source(runtime, chosen)
    if replaced is not None:  # a template of that name is removed: only by whoever may remove it
        acting(runtime, user, token, "library", category=replaced.category, default="library")
    template = template_from(
        record.plan, chosen, source_plan=record.id, created_by=user, created_at=iso(runtime.clock.now())
    )
    with runtime.store.transaction():
        runtime.store.save_template(template)
        runtime.store.append_event(
            plan_id=record.id,
            version=record.version,
            step_id=None,
            kind="library.added",
            actor=user,
            at=template.created_at,
            data={"template": chosen, "pattern": template.pattern, "slots": template.slots},
        )
    slots = ", ".join(f"{s['name']} ({s['type']})" for s in template.slots)
    click.echo(f"template {chosen!r}: {template.pattern}  [slots: {slots}]")


@library_group.command("list")
@db_option
def library_list_command(*, db: str | None) -> None:
    """List the templates."""
    templates = open_runtime(db).store.templates()
    for template in templates:
        slots = ", ".join(f"{s['name']} ({s['type']})" for s in template.slots)
        click.echo(f"{template.name}: {template.pattern}  [slots: {slots}; from plan {template.source_plan[:8]}]")
    if not templates:
        click.echo("the library is empty: plangate library add PLAN_ID")


@library_group.command("remove")
@click.argument("name")
@identity_options
@db_option
def library_remove_command(*, name: str, user: str | None, token: str | None, db: str | None) -> None:
    """Remove template NAME (with accounts: an approver of the category of the plan it came from)."""
    runtime = open_runtime(db)
    record = _source(runtime, name)
    if record is None:
        raise UsageError(f"no template named {name!r}")
    person = acting(runtime, user, token, "library", category=record.category, default="library")
    with runtime.store.transaction():
        runtime.store.delete_template(name)
        runtime.store.append_event(
            plan_id=record.id,
            version=record.version,
            step_id=None,
            kind="library.removed",
            actor=person,
            at=iso(runtime.clock.now()),
            data={"template": name},
        )
    click.echo(f"removed template {name!r}")


def _source(runtime: Any, name: str) -> Any:
    """The record of the plan template ``name`` was made from; None when there is no such template."""
    source = {t.name: t.source_plan for t in runtime.store.templates()}.get(name)
    return None if source is None else runtime.get(source)


COMMANDS = (plan_command, run_command, usage_command, library_group)
