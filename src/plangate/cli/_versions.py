"""A plan's versions: edit (a new version, approved again) and diff (what changed between two)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from plangate.cli import _remote
from plangate.cli._common import (
    acting,
    db_option,
    identity_options,
    json_option,
    open_runtime,
    policy_option,
    read_plan,
    recorded_tools_option,
    show_recorded,
    token_option,
    with_tools,
)
from plangate.cli._remote import server_option
from plangate.errors import UsageError
from plangate.plandiff import PlanDiff
from plangate.rundiff import RunDiff

VERSION = click.IntRange(1, 1_000_000_000)


@click.command("edit")
@click.argument("plan_id", metavar="ID")
@click.argument("plan_file", metavar="PLAN.json", type=click.Path(dir_okay=False, path_type=Path))
@identity_options
@recorded_tools_option
@policy_option
@db_option
@server_option
@json_option
def edit_command(
    *,
    plan_id: str,
    plan_file: Path,
    user: str | None,
    token: str | None,
    tools_spec: str | None,
    policy_file: Path | None,
    db: str | None,
    server: str | None,
    as_json: bool,
) -> None:
    """Make PLAN.json the new version of plan ID: checked again, every earlier approval void.

    It goes back for approval as the policy says (automatic where it may be). A halted plan
    may be corrected this way: only steps that have not succeeded may change. Without
    --policy it is held against the policy the plan was under. Exit 0 when it waits for
    approval or was approved, 1 when it is rejected, 4 when the edit is refused.
    """
    plan = read_plan(plan_file)
    if server:
        record = _remote.edit(_remote.client(server, token), plan_id, json.loads(plan.canonical_json()))
    else:
        runtime = open_runtime(db, policy_file=policy_file)
        record = with_tools(runtime, plan_id, tools_spec)
        editor = acting(runtime, user, token, "edit", category=record.category, requested_by=record.requested_by)
        record = runtime.edit(record.id, plan, editor)
    show_recorded(record, as_json)


@click.command("diff")
@click.argument("plan_id", metavar="ID")
@click.argument("other", metavar="[OTHER_ID]", required=False)
@click.option("--from", "from_version", type=VERSION, metavar="V", help="The older version (default: the one before).")
@click.option("--to", "to_version", type=VERSION, metavar="V", help="The newer version (default: the latest).")
@db_option
@server_option
@token_option
@json_option
def diff_command(
    *,
    plan_id: str,
    other: str | None,
    from_version: int | None,
    to_version: int | None,
    db: str | None,
    server: str | None,
    token: str | None,
    as_json: bool,
) -> None:
    """Show what changed between two versions of plan ID, step by step; or, given OTHER_ID, two plans' runs.

    Two versions: steps added, removed or changed (each changed field, old -> new,
    parameters one by one), the task, the category and the order the steps are listed in.

    Two plans (ids or unique prefixes): each step matched by id, its status, parameters as
    resolved when it ran, output and duration in each run, with the change in duration.
    """
    if other is not None and (from_version or to_version):
        raise UsageError("--from and --to compare versions of one plan; give one ID with them")
    diff: PlanDiff | RunDiff
    if server:
        api = _remote.client(server, token)
        diff = _remote.compare(api, plan_id, other) if other else _remote.diff(api, plan_id, from_version, to_version)
    else:
        runtime = open_runtime(db)
        diff = runtime.compare(plan_id, other) if other else runtime.diff(plan_id, from_version, to_version)
    if as_json:
        click.echo(json.dumps(diff.to_dict(), indent=2, ensure_ascii=False))
        return
    for line in diff.lines():
        click.echo(line)


COMMANDS = (edit_command, diff_command)
