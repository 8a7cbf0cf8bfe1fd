"""The ``plangate`` command line.

Exit codes: 0 success; 1 the plan has violations; 2 the input could not be read
(a missing file, text that is not JSON, a plan of the wrong shape, a bad policy or
tools module).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from plangate import __version__
from plangate.check import RULES, CheckResult, check
from plangate.errors import PlanError, PlangateError
from plangate.plan import Plan, plan_json_schema
from plangate.policy import POLICY_RULES, Policy
from plangate.tools import Catalogue

EXIT_VIOLATIONS = 1
EXIT_BAD_INPUT = 2
F = TypeVar("F", bound=Callable[..., Any])


def _plain_errors(fn: F) -> F:
    """Turn plangate's own errors into a plain message and exit code 2, never a traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PlangateError as exc:
            click.echo(f"plangate: {exc}", err=True)
            sys.exit(EXIT_BAD_INPUT)

    return wrapper  # type: ignore[return-value]


tools_option = click.option(
    "--tools",
    "tools_spec",
    required=True,
    envvar="PLANGATE_TOOLS",
    metavar="MODULE",
    help="Tools module: an import path (pkg.tools) or a .py file. Env: PLANGATE_TOOLS.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="plangate")
def main() -> None:
    """plangate: a governed agent runtime. Plans are typed, checked, approved, then run."""


@main.command("check")
@click.argument("plan_file", metavar="PLAN.json", type=click.Path(dir_okay=False, path_type=Path))
@tools_option
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="PLANGATE_POLICY",
    help="Policy YAML file to hold the plan against. Env: PLANGATE_POLICY.",
)
@click.option("--as", "user", metavar="USER", help="Who is asking (the policy may map users to roles).")
@click.option("--role", metavar="ROLE", help="The requester's role (overrides the policy's user mapping).")
@json_option
@_plain_errors
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
    plan = _read_plan(plan_file)
    catalogue = Catalogue.from_module(tools_spec)
    policy = Policy.load(policy_file) if policy_file else None
    result = check(plan, catalogue, policy, user=user, role=role)
    if as_json:
        click.echo(json.dumps({**result.to_dict(), "summary": summary(plan, result)}, indent=2))
    else:
        for violation in result.violations:
            click.echo(str(violation))
        click.echo(summary(plan, result), err=not result.ok)
    sys.exit(0 if result.ok else EXIT_VIOLATIONS)


def _read_plan(path: Path) -> Plan:
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise PlanError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    try:
        return Plan.parse(text)
    except PlanError as exc:
        raise PlanError(f"{path}: {exc.summary}", list(exc.problems)) from None


def summary(plan: Plan, result: CheckResult) -> str:
    """The one-line verdict."""
    steps = f"{len(plan.steps)} step{'s' if len(plan.steps) != 1 else ''}"
    if not result.ok:
        count = len(result.violations)
        return f"rejected: {count} violation{'s' if count != 1 else ''} in plan {plan.hash} ({steps})"
    decision = result.decision
    if decision is None:
        return f"ok: plan {plan.hash} ({steps}) passes the check (no policy given)"
    who = "may be approved automatically" if decision.approval == "auto" else "needs approval by a person"
    named = f" and by {', '.join(decision.required_approvals)}" if decision.required_approvals else ""
    return (
        f"ok: plan {plan.hash} ({steps}) passes the check and policy {decision.policy!r}; "
        f"{who}{named}: {'; '.join(decision.reasons)}"
    )


@main.command("schema")
@click.option("--indent", default=2, show_default=True, help="Indentation of the JSON output.")
def schema_command(indent: int) -> None:
    """Print the plan's JSON Schema: the one a planning model is given."""
    click.echo(json.dumps(plan_json_schema(), indent=indent or None))


@main.command("tools")
@tools_option
@json_option
@_plain_errors
def tools_command(tools_spec: str, as_json: bool) -> None:
    """List the tools in a module with their effects, scopes and parameters."""
    catalogue = Catalogue.from_module(tools_spec)
    if as_json:
        click.echo(json.dumps(catalogue.describe(), indent=2))
        return
    rows = [("TOOL", "EFFECT", "IDEMPOTENT", "EXTERNAL", "SCOPES", "PARAMS")]
    for t in catalogue:
        flags = ("yes" if t.idempotent else "no", "yes" if t.external else "no")
        rows.append((t.name, t.effect, *flags, ",".join(t.scopes) or "-", ", ".join(t.param_names) or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])


@main.command("rules")
def rules_command() -> None:
    """List every rule name a violation can carry, and what it means."""
    width = max(len(name) for name in (*RULES, *POLICY_RULES))
    for title, rules in (("checker", RULES), ("policy", POLICY_RULES)):
        click.echo(f"{title}:")
        for name, meaning in rules.items():
            click.echo(f"  {name.ljust(width)}  {meaning}")
