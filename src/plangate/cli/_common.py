"""What the commands share: their options, opening the runtime, reading a plan, printing results."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from plangate._display import printable
from plangate.answer import shown
from plangate.check import CheckResult
from plangate.cli._errors import EXIT_VIOLATIONS
from plangate.errors import UsageError
from plangate.plan import Plan
from plangate.policy import Policy
from plangate.review import badge, short
from plangate.tools import Catalogue

if TYPE_CHECKING:
    from plangate.identity import Doing

# -- options ---------------------------------------------------------------------------------

_Command = TypeVar("_Command", bound=Callable[..., Any])

TOOLS_HELP = (
    "Tools: a Python module (pkg.tools or a .py file), an MCP server (mcp:stdio:COMMAND ARGS... or "
    "mcp:http://HOST:PORT/PATH), or a tools file listing several (FILE.yaml)."
)
tools_option = click.option(
    "--tools",
    "tools_spec",
    required=True,
    envvar="PLANGATE_TOOLS",
    metavar="TOOLS",
    help=f"{TOOLS_HELP} Env: PLANGATE_TOOLS.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
policy_option = click.option(
    "--policy",
    "policy_file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="PLANGATE_POLICY",
    help="Policy YAML file to hold plans against. Env: PLANGATE_POLICY.",
)

db_option = click.option(
    "--db",
    "db",
    envvar="PLANGATE_DB",
    metavar="URL",
    help="Store URL (sqlite:///PATH). Default: ./.plangate/plangate.db. Env: PLANGATE_DB.",
)
as_option = click.option(
    "--as",
    "user",
    metavar="USER",
    help="Who you are. Local mode: the name recorded. With accounts: optional, and it must be your token's account.",
)
token_option = click.option(
    "--token",
    metavar="TOKEN",
    help="Your API token (needed once the store has accounts). Env: PLANGATE_TOKEN; "
    "default: the one `plangate login` kept.",
)


def identity_options(fn: Any) -> Any:
    """``--as`` and ``--token``: who acts, and the proof of it once the store has accounts."""
    return as_option(token_option(fn))


recorded_tools_option = click.option(
    "--tools",
    "tools_spec",
    envvar="PLANGATE_TOOLS",
    metavar="TOOLS",
    help="Tools: a module, mcp:... or FILE.yaml (default: the ones recorded when the plan was submitted).",
)


def model_option_saying(role: str) -> Callable[[_Command], _Command]:
    """``--model``, its help saying what the command does with a model (or without one)."""
    return click.option(
        "--model",
        "model_spec",
        envvar="PLANGATE_MODEL",
        metavar="PROVIDER:NAME",
        help="anthropic:MODEL, openai:MODEL, openai-compatible:MODEL (with --base-url) or llamacpp:PATH.gguf. "
        f"{role} Env: PLANGATE_MODEL.",
    )


model_option = model_option_saying("Without it only the plan library is used.")
base_url_option = click.option("--base-url", metavar="URL", help="Server URL for openai-compatible models.")
prices_option = click.option(
    "--prices",
    "prices_file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="PLANGATE_PRICES",
    help="Price table YAML (default: the bundled one).",
)


# -- the runtime and the files it is given -------------------------------------------------


def open_runtime(db: str | None, tools_spec: str | None = None, policy_file: Path | None = None) -> Any:
    """The runtime on the store at ``db`` (the default store when None), with these tools and this policy."""
    from plangate.runtime import Runtime

    catalogue = Catalogue.from_spec(tools_spec) if tools_spec else None
    policy = Policy.load(policy_file) if policy_file else None
    return Runtime(catalogue, policy, db=db, tools=absolute(tools_spec))


def absolute(spec: str | None) -> str | None:
    """A tools file is recorded by absolute path, so `execute` finds it from anywhere (an MCP spec as given)."""
    if spec is None or spec.startswith("mcp:"):
        return spec
    try:
        if spec and (spec.endswith((".py", ".yaml", ".yml")) or "/" in spec) and Path(spec).exists():
            return str(Path(spec).resolve())
    except OSError:
        pass  # a path that cannot even be looked at: loading the catalogue says why, plainly
    return spec


def with_tools(runtime: Any, plan_id: str, tools_spec: str | None, *, required: bool = True) -> Any:
    """The plan's record, with the runtime given the plan's tools (--tools, or the module on record).

    The module on record is read from the audit log before anything is imported, so a
    changed row cannot make plangate import another file.
    """
    record = runtime.get(plan_id)
    spec = absolute(tools_spec) or runtime.recorded_tools(record.id)
    if spec is None and required:
        raise UsageError("give --tools: the plan was submitted without a tools module on record")
    runtime.catalogue, runtime.tools = (Catalogue.from_spec(spec), spec) if spec else (None, None)
    return record


def read_plan(path: Path) -> Plan:
    """The plan in the file at ``path``: a regular file within the size limit, never read blindly (a FIFO,
    a device such as /dev/zero or a folder is refused at once); anything wrong is a PlanError naming it."""
    return Plan.load(path)


def acting(
    runtime: Any,
    user: str | None,
    token: str | None,
    doing: Doing,
    *,
    category: str | None = None,
    requested_by: str | None = None,
    default: str | None = None,
) -> str:
    """The name to record for this command, once it is shown that its account may do ``doing``.

    Local mode (no accounts): the name given with ``--as`` (or ``default``). Token mode: the
    token's account; a command without a live token is refused (exit 4).
    """
    from plangate import identity

    who = identity.actor(runtime.store, token=identity.find_token(token), claimed=user, default=default)
    identity.permit(who.user, doing, category, requested_by=requested_by)
    return who.name


# -- output ----------------------------------------------------------------------------------


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


def print_progress(event: Any) -> None:
    """One line for each step of a run as it happens."""
    if event.kind == "started":
        click.echo(f"  [{event.done}/{event.total}] step {event.step_id} {event.tool}: started")
    elif event.kind == "succeeded":
        click.echo(f"  [{event.done}/{event.total}] step {event.step_id} {event.tool}: succeeded in {event.ms:.1f} ms")
    elif event.kind in ("failed", "failed_optional", "outcome_unknown", "skipped"):
        click.echo(f"  [{event.done}/{event.total}] step {event.step_id} {event.tool}: {event.kind}: {event.detail}")
    elif event.kind == "reused":
        click.echo(f"  [{event.done}/{event.total}] step {event.step_id} {event.tool}: already {event.detail}, kept")


def show_recorded(record: Any, as_json: bool) -> None:
    """What ``submit`` and ``edit`` print about the version just recorded; exit 1 when it was rejected."""
    if as_json:
        click.echo(json.dumps(record.to_dict(), indent=2))
    else:
        click.echo(str(record))
        for violation in record.violations:
            click.echo(f"  {violation}")
        if record.status == "pending_approval":
            click.echo(f"  approve with: plangate approve {record.id[:8]} --as APPROVER --hash {record.hash}")
    if record.status == "rejected":
        sys.exit(EXIT_VIOLATIONS)


def purged_line(at: str) -> str:
    """What is said of a plan whose payloads a retention purge removed."""
    return (
        f"payloads purged on {at[:10]} (retention): step parameters and outputs and the plan's text are gone; "
        "its status, hashes and decisions remain"
    )


def show_record(record: Any, described: dict[str, Any] | None = None) -> None:
    """A plan (or a paused ReAct action) as a reviewer reads it before deciding.

    With ``described`` (:func:`plangate.review.review`, computed here or by the server): the
    policy's reasons, and each step's effect, rollback and, once it ran, where it stands.
    """
    what = "ReAct run" if record.kind == "react" else "plan"
    click.echo(f"{what} {record.id} v{record.version} ({record.status}), requested by {record.requested_by}")
    click.echo(f"  task: {printable(record.task)} [{record.category}]  hash: {record.hash}")
    if record.purged:
        click.echo(f"  {purged_line(record.purged)}")
    if record.plan is not None and record.plan.order == "dataflow":
        click.echo("  order: dataflow: a step starts once the steps it reads or names in 'after' are done;")
        click.echo("         the listed order is not the execution order")
    if described is not None:
        _show_policy(record.decision, described["reasons"])
    for violation in record.violations:
        click.echo(f"  violation: {violation}")
    if record.action is not None:
        action = record.action
        click.echo(f"  pending action {action['number']}: {action['tool']}({json.dumps(action['arguments'])})")
        click.echo(f"     why: {printable(action['thought'])}")  # a model wrote it after reading outputs
    _show_steps(record, described)
    if record.plan is not None and record.plan.answer is not None:
        _show_answer(record.plan.answer, (described or {}).get("answer"))
    if record.needs:
        click.echo(f"  needs approval by {' and by '.join(record.needs)}")


def _show_steps(record: Any, described: dict[str, Any] | None) -> None:
    about = {step["id"]: step for step in (described or {}).get("steps", ())}
    for step in record.plan.steps if record.plan is not None else ():
        when = f" if {step.condition}" if step.condition else ""
        when += f" after {', '.join(str(other) for other in step.after)}" if step.after else ""
        when += " [optional: if it fails, its output is null]" if step.on_failure == "continue" else ""
        click.echo(f"  {step.id}. {step.tool}({json.dumps(step.params, ensure_ascii=False)}){when}")
        if step.id in about:
            _show_step(about[step.id])
        click.echo(f"     why: {printable(step.rationale)}")
        if step.id in about and about[step.id]["status"] is not None:
            detail = about[step.id]["detail"]
            shown = f": {printable(short(detail))}" if detail else ""  # an output or error may carry escapes
            click.echo(f"     status: {about[step.id]['status']}{shown}")


def _show_answer(text: str, about: dict[str, Any] | None) -> None:
    """The plan's answer as written, where it reads from, and once it ran, what it said (untrusted parts marked)."""
    click.echo(f"  answer: {shown(text, lines=False)}")
    if about and about["from"]:
        click.echo(f"     reads: {'; '.join(badge(source) for source in about['from'])}")
    if about and about["marked"] is not None:
        click.echo(f"     said: {about['marked']}")


def _show_policy(decision: dict[str, Any] | None, reasons: list[str]) -> None:
    if decision is None:
        click.echo("  policy: none (checked without a policy)")
        return
    named = "".join(f" and by {name}" for name in decision.get("required_approvals") or ())
    says = "may be approved automatically" if decision["approval"] == "auto" else "needs approval by a person"
    click.echo(f"  policy {decision['policy']!r}: {says}{named}")
    for reason in reasons:
        click.echo(f"    - {reason}")


def _show_step(step: dict[str, Any]) -> None:
    effect = step["effect"] + (", external" if step["external"] else "")
    approvals = f"  approval: {', '.join(step['approvals'])}" if step["approvals"] else ""
    click.echo(f"     effect: {effect}  rollback: {step['rollback'] or 'none given'}{approvals}")
    for fed in step.get("sources", ()):
        mark = "UNTRUSTED " if fed["untrusted"] else ""
        through = f" via {', '.join(fed['refs'])}" if fed["refs"] else ""
        click.echo(f"     {mark}{fed['param']}: {'; '.join(badge(each) for each in fed['from'])}{through}")
