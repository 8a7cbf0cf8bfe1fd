"""Plans and their tools: check, schema, tools, rules, submit, approve, reject, list, show, trace."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, get_args

import click

from plangate.check import RULES, check
from plangate.cli import _remote
from plangate.cli._common import (
    acting,
    db_option,
    identity_options,
    json_option,
    open_runtime,
    policy_option,
    purged_line,
    read_plan,
    show_record,
    show_recorded,
    summary,
    token_option,
    tools_option,
)
from plangate.cli._errors import EXIT_VIOLATIONS
from plangate.cli._remote import server_option
from plangate.errors import PlangateError, UsageError
from plangate.plan import plan_json_schema
from plangate.policy import POLICY_RULES, Policy
from plangate.review import review
from plangate.store import MAX_LISTED, PlanQuery, PlanStatus
from plangate.tools import Catalogue


@click.command("check")
@click.argument("plan_file", metavar="PLAN.json", type=click.Path(dir_okay=False, path_type=Path))
@tools_option
@policy_option
@click.option("--as", "user", metavar="USER", help="Who is asking (the policy may map users to roles).")
@click.option("--role", metavar="ROLE", help="The requester's role (overrides the policy's user mapping).")
@json_option
def check_command(
    *, plan_file: Path, tools_spec: str, policy_file: Path | None, user: str | None, role: str | None, as_json: bool
) -> None:
    """Check PLAN.json against the tools (and a policy): every violation, one per line.

    Exit 0 when clean, 1 with violations, 2 when an input cannot be read.

    \b
    Example:
      plangate check examples/plans/refund.json --tools examples/business.py \\
          --policy examples/policy.yaml --as alice
    """
    plan = read_plan(plan_file)
    with Catalogue.from_spec(tools_spec) as catalogue:
        policy = Policy.load(policy_file) if policy_file else None
        result = check(plan, catalogue, policy, user=user, role=role)
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "summary": summary(plan, result)}, indent=2))
    else:
        for violation in result.violations:
            click.echo(str(violation))
        click.echo(summary(plan, result), err=not result.ok)
    sys.exit(0 if result.ok else EXIT_VIOLATIONS)


@click.command("schema")
@click.option("--indent", default=2, show_default=True, help="Indentation of the JSON output.")
def schema_command(indent: int) -> None:
    """Print the plan's JSON Schema: the one a planning model is given."""
    click.echo(json.dumps(plan_json_schema(), indent=indent or None))


@click.command("tools")
@tools_option
@policy_option
@json_option
def tools_command(tools_spec: str, policy_file: Path | None, as_json: bool) -> None:
    """List the tools with their effects, time limits, retries, scopes, parameters and source.

    TIMEOUT "-": the policy's limits.tool_timeout applies, else 300 s. With --policy, the
    tools are shown as the policy's tools section sets them, and a value it set is marked "*".

    \b
    Example:
      plangate tools --tools "mcp:stdio:python -m mcp_server_time"
    """
    from plangate._overrides import governed

    given = Catalogue.from_spec(tools_spec)
    try:
        catalogue = governed(given, Policy.load(policy_file) if policy_file else None)
        if as_json:
            click.echo(json.dumps(catalogue.describe(), indent=2))
            return
        _tools_table(catalogue)
    finally:
        given.close()


def _tools_table(catalogue: Catalogue) -> None:
    rows = [("TOOL", "EFFECT", "IDEMPOTENT", "EXTERNAL", "TIMEOUT", "RETRIES", "SCOPES", "SOURCE", "PARAMS")]
    for t in catalogue:
        set_here = set(t.overridden)

        def cell(name: str, text: str, set_here: set[str] = set_here) -> str:
            return text + "*" if name in set_here else text

        flags = (cell("idempotent", "yes" if t.idempotent else "no"), cell("external", "yes" if t.external else "no"))
        limits = (f"{t.timeout:g}s" if t.timeout is not None else "-", str(t.retries))
        scopes = cell("scopes", ",".join(t.scopes) or "-")
        source = t.origin.get("source", "-") if t.origin else "python"
        params = ", ".join(t.param_names) or "-"
        rows.append((t.name, cell("effect", t.effect), *flags, *limits, scopes, source, params))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])
    if any(t.overridden for t in catalogue):
        click.echo("* set by the policy's tools section")


@click.command("rules")
def rules_command() -> None:
    """List every rule name a violation can carry, and what it means."""
    width = max(len(name) for name in (*RULES, *POLICY_RULES))
    for title, rules in (("checker", RULES), ("policy", POLICY_RULES)):
        click.echo(f"{title}:")
        for name, meaning in rules.items():
            click.echo(f"  {name.ljust(width)}  {meaning}")


@click.command("submit")
@click.argument("plan_file", metavar="PLAN.json", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--tools",
    "tools_spec",
    envvar="PLANGATE_TOOLS",
    metavar="MODULE",
    help="Tools: a module (pkg.tools or a .py file), mcp:... or FILE.yaml (not with --server). Env: PLANGATE_TOOLS.",
)
@policy_option
@identity_options
@click.option("--role", metavar="ROLE", help="The role you act in: only one the policy gives you (a claim is refused).")
@db_option
@server_option
@json_option
def submit_command(
    *,
    plan_file: Path,
    tools_spec: str | None,
    policy_file: Path | None,
    server: str | None,
    user: str | None,
    token: str | None,
    role: str | None,
    db: str | None,
    as_json: bool,
) -> None:
    """Submit PLAN.json: check it, hold it against the policy, record it; print its id and status.

    Exit 0 when it is waiting for approval or approved automatically, 1 when rejected.
    """
    plan = read_plan(plan_file)
    if server:
        record = _remote.submit(_remote.client(server, token), plan.data())
    else:
        if not tools_spec:
            raise UsageError("give --tools (or PLANGATE_TOOLS): the module whose tools the plan calls")
        runtime = open_runtime(db, tools_spec, policy_file)
        requester = acting(runtime, user, token, "submit")
        record = runtime.submit(plan, requested_by=requester, role=role)
    show_recorded(record, as_json)


@click.command("approve")
@click.argument("plan_id", metavar="ID")
@identity_options
@click.option(
    "--hash",
    "plan_hash",
    metavar="HASH",
    help="The hash of the version you reviewed (required unless you confirm at a terminal).",
)
@click.option("--comment", help="Why you approve (recorded).")
@click.option("--role", metavar="ROLE", help="The role you approve in, when the policy does not map you to one.")
@db_option
@server_option
def approve_command(
    *,
    server: str | None,
    plan_id: str,
    user: str | None,
    token: str | None,
    plan_hash: str | None,
    comment: str | None,
    role: str | None,
    db: str | None,
) -> None:
    """Approve plan ID. Your approval is bound to the exact version (its hash) you reviewed."""
    if server:
        api = _remote.client(server, token)
        reviewed = _reviewed(_remote.record(api, plan_id), plan_hash)
        click.echo(str(_remote.decide(api, plan_id, "approve", {"hash": reviewed, "comment": comment})))
        return
    runtime = open_runtime(db)
    record = runtime.get(plan_id)
    approver = acting(runtime, user, token, "decide", category=record.category)
    reviewed = _reviewed(record, plan_hash)
    click.echo(str(runtime.approve(record.id, approver, reviewed, comment=comment, role=role)))


def _reviewed(record: Any, plan_hash: str | None) -> str:
    """The hash the approver reviewed: given, or confirmed at a terminal after seeing the plan."""
    if plan_hash is not None:
        return plan_hash
    if not sys.stdin.isatty():
        raise UsageError(f"give --hash with the hash you reviewed (current: {record.hash})")
    show_record(record)
    click.confirm(f"approve plan {record.id} v{record.version} ({record.hash[:12]})?", abort=True)
    return str(record.hash)


@click.command("reject")
@click.argument("plan_id", metavar="ID")
@identity_options
@click.option("--comment", required=True, help="Why you reject it (required, recorded).")
@click.option("--hash", "plan_hash", metavar="HASH", help="The hash of the version you reviewed.")
@db_option
@server_option
def reject_command(
    *,
    plan_id: str,
    user: str | None,
    token: str | None,
    comment: str,
    plan_hash: str | None,
    db: str | None,
    server: str | None,
) -> None:
    """Reject plan ID, with a comment saying why."""
    if server:
        api = _remote.client(server, token)
        click.echo(str(_remote.decide(api, plan_id, "reject", {"comment": comment, "hash": plan_hash})))
        return
    runtime = open_runtime(db)
    record = runtime.get(plan_id)
    person = acting(runtime, user, token, "decide", category=record.category)
    click.echo(str(runtime.reject(record.id, person, comment, plan_hash=plan_hash)))


@click.command("list")
@click.option(
    "--status",
    type=click.Choice(sorted(get_args(PlanStatus))),
    help="Only plans in this state.",
)
@click.option("--order", type=click.Choice(["newest", "oldest"]), default="newest", show_default=True)
@click.option("--limit", type=click.IntRange(1, MAX_LISTED), default=100, show_default=True)
@click.option("--before", metavar="ID", help="Only plans submitted before plan ID (to page on, newest first).")
@click.option("--after", metavar="ID", help="Only plans submitted after plan ID (to page on, oldest first).")
@db_option
@server_option
@token_option
@json_option
def list_command(*, db: str | None, server: str | None, token: str | None, as_json: bool, **options: Any) -> None:
    """List plans, newest first (from a server: the plans you may see)."""
    limit = options.pop("limit")
    query = PlanQuery(**options)
    if server:
        rows = _remote.rows(_remote.client(server, token), query, limit)
    else:
        runtime = open_runtime(db)
        before, after = (None if end is None else runtime.resolve_id(end) for end in (query.before, query.after))
        rows = runtime.list_plans(replace(query, before=before, after=after), limit)
    if as_json:
        click.echo(json.dumps([row.__dict__ for row in rows], indent=2))
        return
    for row in rows:
        click.echo(
            f"{row.id[:8]}  v{row.version}  {row.status:<16} {row.category:<12} {row.requested_by:<10} {row.task}"
        )
    if not rows:
        click.echo("no plans" + (f" with status {query.status}" if query.status else ""))
    elif len(rows) == limit:
        end = "before" if query.order == "newest" else "after"
        click.echo(f"(the first {limit}; for the next ones: --{end} {rows[-1].id})")


@click.command("show")
@click.argument("plan_id", metavar="ID")
@click.option(
    "--tools",
    "tools_spec",
    envvar="PLANGATE_TOOLS",
    metavar="MODULE",
    help="Tools (a module, mcp:... or FILE.yaml) for the steps' effects "
    "(default: the ones on record; not with --server, whose tools count).",
)
@db_option
@server_option
@token_option
def show_command(
    *, plan_id: str, tools_spec: str | None, db: str | None, server: str | None, token: str | None
) -> None:
    """Show plan ID: its steps, why each is there, its status and what it still needs.

    Each step's effect (read, write, irreversible; unknown without the tools) and rollback,
    the policy's reasons, and once the plan has run, each step's status and output.
    """
    if server:
        api = _remote.client(server, token)
        record = _remote.record(api, plan_id)
        show_record(record, api.call("GET", api.plan_path(record.id, "review")))
        return
    runtime = open_runtime(db)
    try:
        record = runtime.get(plan_id)
        show_record(record, review(runtime.store, record, _catalogue(runtime, record.id, tools_spec)))
    finally:
        runtime.close()


def _catalogue(runtime: Any, plan_id: str, tools_spec: str | None) -> Catalogue | None:
    """The tools to describe the steps with: --tools, else the module on record, if it can be loaded."""
    if tools_spec:
        return Catalogue.from_spec(tools_spec)
    try:
        spec = runtime.recorded_tools(plan_id)
        return Catalogue.from_spec(spec) if spec else None
    except PlangateError:  # showing a plan does not need its tools: its effects are then "unknown"
        return None


@click.command("trace")
@click.argument("plan_id", metavar="ID")
@db_option
@server_option
@token_option
@json_option
def trace_command(*, plan_id: str, db: str | None, server: str | None, token: str | None, as_json: bool) -> None:
    """Print plan ID's whole story from the audit log: check, policy, approvals, every step."""
    from plangate.story import tell

    if server:
        api = _remote.client(server, token)
        record, events = _remote.record(api, plan_id), _remote.events(api, plan_id)
    else:
        runtime = open_runtime(db)
        try:
            record, events = runtime.get(plan_id), runtime.trace(plan_id)
        finally:
            runtime.close()
    if as_json:
        click.echo(json.dumps([e.to_dict() for e in events], indent=2, ensure_ascii=False))
        return
    click.echo(f"plan {record.id}: {record.task!r} ({record.category}), now {record.status}")
    if record.purged:
        click.echo(purged_line(record.purged))
    for line in tell(events):
        click.echo(line)


COMMANDS = (
    check_command,
    schema_command,
    tools_command,
    rules_command,
    submit_command,
    approve_command,
    reject_command,
    list_command,
    show_command,
    trace_command,
)
