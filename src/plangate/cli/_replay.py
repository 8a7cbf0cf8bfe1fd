"""`plangate replay`: a plan's runs replayed over their recorded outputs, calling no tool."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from plangate.cli._common import db_option, json_option, open_runtime, with_tools
from plangate.cli._errors import EXIT_VIOLATIONS
from plangate.policy import Policy


@click.command("replay")
@click.argument("plan_id", metavar="ID")
@click.option(
    "--tools",
    "tools_spec",
    metavar="MODULE",
    help="Replay against these tools instead (default: the module recorded when the plan was submitted).",
)
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Replay against this policy instead (default: the policy each run was under, as recorded).",
)
@db_option
@json_option
def replay_command(
    *, plan_id: str, tools_spec: str | None, policy_file: Path | None, db: str | None, as_json: bool
) -> None:
    """Make the engine's decisions for plan ID again over its recorded outputs, calling no tool.

    For every run (and resume, and rollback) as the audit log records it: each condition,
    each parameter resolved from the recorded outputs, the tool's schema, the policy's deny
    and require rules, each skip, the run order and why the run halted, held against what
    was recorded; and the stored rows against the log. Exit 0 when everything matches, 1
    naming the first divergence (--json: all of them), 2 for an unknown plan or one that
    never ran.

    With --tools or --policy it answers the incident question, what would have differed:
    a step a new deny rule would have refused, a recorded parameter a changed schema no
    longer accepts, a changed effect that would need another approval.
    """
    runtime = open_runtime(db)
    record = with_tools(runtime, plan_id, tools_spec)
    policy = Policy.load(policy_file) if policy_file else None
    against = [f"tools {tools_spec}"] * bool(tools_spec) + [f"policy {policy_file}"] * bool(policy_file)
    result = runtime.replay(record.id, policy=policy, against=against)
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, ensure_ascii=False, default=str))
    elif result.ok:
        click.echo(str(result))
    else:
        click.echo(str(result).splitlines()[0])
        click.echo(f"first divergence: {result.divergences[0]}")
    if not result.ok:
        sys.exit(EXIT_VIOLATIONS)


COMMANDS = (replay_command,)
