"""The ``plangate`` command line.

Exit codes: 0 success; 1 the plan has violations (or was rejected); 2 the input could
not be read (a missing file, text that is not JSON, a plan of the wrong shape, a bad
policy or tools module); 3 the run halted; 4 the request was refused by a governance
rule (self-approval, a stale hash, executing an unapproved plan...).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click

from plangate import __version__
from plangate._clock import iso
from plangate.check import RULES, CheckResult, check
from plangate.errors import GovernanceError, PlanError, PlangateError, UsageError
from plangate.lifecycle import TRANSITIONS
from plangate.plan import Plan, plan_json_schema
from plangate.policy import POLICY_RULES, Policy
from plangate.tools import Catalogue

EXIT_VIOLATIONS = 1
EXIT_BAD_INPUT = 2
EXIT_HALTED = 3
EXIT_REFUSED = 4
F = TypeVar("F", bound=Callable[..., Any])


def _plain_errors(fn: F) -> F:
    """Turn plangate's own errors into a plain message and exit code 2, never a traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except GovernanceError as exc:
            click.echo(f"plangate: refused: {exc}", err=True)
            sys.exit(EXIT_REFUSED)
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
policy_option = click.option(
    "--policy",
    "policy_file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="PLANGATE_POLICY",
    help="Policy YAML file to hold plans against. Env: PLANGATE_POLICY.",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="plangate")
def main() -> None:
    """plangate: a governed agent runtime. Plans are typed, checked, approved, then run."""


@main.command("check")
@click.argument("plan_file", metavar="PLAN.json", type=click.Path(dir_okay=False, path_type=Path))
@tools_option
@policy_option
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


# -- the governed path: submit, approve, execute, trace -------------------------------------

db_option = click.option(
    "--db",
    "db",
    envvar="PLANGATE_DB",
    metavar="URL",
    help="Store URL (sqlite:///PATH). Default: ./.plangate/plangate.db. Env: PLANGATE_DB.",
)
as_option = click.option("--as", "user", required=True, metavar="USER", help="Who you are (recorded in the audit).")


def _runtime(db: str | None, tools_spec: str | None = None, policy_file: Path | None = None) -> Any:
    from plangate.runtime import Runtime

    catalogue = Catalogue.from_module(tools_spec) if tools_spec else None
    policy = Policy.load(policy_file) if policy_file else None
    return Runtime(catalogue, policy, db=db, tools=_absolute(tools_spec))


def _absolute(spec: str | None) -> str | None:
    """A tools file is recorded by absolute path, so `execute` finds it from anywhere."""
    if spec and (spec.endswith(".py") or "/" in spec) and Path(spec).exists():
        return str(Path(spec).resolve())
    return spec


@main.command("submit")
@click.argument("plan_file", metavar="PLAN.json", type=click.Path(dir_okay=False, path_type=Path))
@tools_option
@policy_option
@as_option
@click.option("--role", metavar="ROLE", help="The role you act in: only one the policy gives you (a claim is refused).")
@db_option
@json_option
@_plain_errors
def submit_command(
    *,
    plan_file: Path,
    tools_spec: str,
    policy_file: Path | None,
    user: str,
    role: str | None,
    db: str | None,
    as_json: bool,
) -> None:
    """Submit PLAN.json: check it, hold it against the policy, record it; print its id and status.

    Exit 0 when it is waiting for approval or approved automatically, 1 when rejected.
    """
    plan = _read_plan(plan_file)
    runtime = _runtime(db, tools_spec, policy_file)
    record = runtime.submit(plan, requested_by=user, role=role)
    if as_json:
        click.echo(json.dumps(record.to_dict(), indent=2))
    else:
        click.echo(str(record))
        for violation in record.violations:
            click.echo(f"  {violation}")
        if record.status == "pending_approval":
            click.echo(f"  approve with: plangate approve {record.id[:8]} --as APPROVER --hash {record.hash}")
    sys.exit(EXIT_VIOLATIONS if record.status == "rejected" else 0)


@main.command("approve")
@click.argument("plan_id", metavar="ID")
@as_option
@click.option(
    "--hash",
    "plan_hash",
    metavar="HASH",
    help="The hash of the version you reviewed (required unless you confirm at a terminal).",
)
@click.option("--comment", help="Why you approve (recorded).")
@click.option("--role", metavar="ROLE", help="The role you approve in, when the policy does not map you to one.")
@db_option
@_plain_errors
def approve_command(
    *, plan_id: str, user: str, plan_hash: str | None, comment: str | None, role: str | None, db: str | None
) -> None:
    """Approve plan ID. Your approval is bound to the exact version (its hash) you reviewed."""
    runtime = _runtime(db)
    record = runtime.get(plan_id)
    if plan_hash is None:
        if not sys.stdin.isatty():
            raise UsageError(f"give --hash with the hash you reviewed (current: {record.hash})")
        _show(record)
        click.confirm(f"approve plan {record.id} v{record.version} ({record.hash[:12]})?", abort=True)
        plan_hash = record.hash
    record = runtime.approve(record.id, user, plan_hash, comment=comment, role=role)
    click.echo(str(record))


@main.command("reject")
@click.argument("plan_id", metavar="ID")
@as_option
@click.option("--comment", required=True, help="Why you reject it (required, recorded).")
@click.option("--hash", "plan_hash", metavar="HASH", help="The hash of the version you reviewed.")
@db_option
@_plain_errors
def reject_command(*, plan_id: str, user: str, comment: str, plan_hash: str | None, db: str | None) -> None:
    """Reject plan ID, with a comment saying why."""
    runtime = _runtime(db)
    click.echo(str(runtime.reject(plan_id, user, comment, plan_hash=plan_hash)))


recorded_tools_option = click.option(
    "--tools",
    "tools_spec",
    envvar="PLANGATE_TOOLS",
    metavar="MODULE",
    help="Tools module (default: the one recorded when the plan was submitted).",
)


def _progress(event: Any) -> None:
    if event.kind == "started":
        click.echo(f"  [{event.done}/{event.total}] step {event.step_id} {event.tool}: started")
    elif event.kind == "succeeded":
        click.echo(f"  [{event.done}/{event.total}] step {event.step_id} {event.tool}: succeeded in {event.ms:.1f} ms")
    elif event.kind in ("failed", "outcome_unknown", "skipped"):
        click.echo(f"  [{event.done}/{event.total}] step {event.step_id} {event.tool}: {event.kind}: {event.detail}")
    elif event.kind == "reused":
        click.echo(f"  [{event.done}/{event.total}] step {event.step_id} {event.tool}: already {event.detail}, kept")


def _with_tools(runtime: Any, plan_id: str, tools_spec: str | None, *, required: bool = True) -> Any:
    """The plan's record, with the runtime given the plan's tools (--tools, or the module on record).

    The module on record is read from the audit log before anything is imported, so a
    changed row cannot make plangate import another file.
    """
    record = runtime.get(plan_id)
    spec = _absolute(tools_spec) or runtime.recorded_tools(record.id)
    if spec is None and required:
        raise UsageError("give --tools: the plan was submitted without a tools module on record")
    runtime.catalogue, runtime.tools = (Catalogue.from_module(spec), spec) if spec else (None, None)
    return record


def _run_command(
    method: str, plan_id: str, *, tools_spec: str | None, policy_file: Path | None, db: str | None, user: str | None
) -> None:
    runtime = _runtime(db, policy_file=policy_file)
    record = _with_tools(runtime, plan_id, tools_spec)
    click.echo(f"{method} plan {record.id} v{record.version}: {record.task}")
    result = getattr(runtime, method)(record.id, actor=user or "engine", progress=_progress)
    click.echo(str(result))
    sys.exit(0 if result.ok else EXIT_HALTED)


@main.command("execute")
@click.argument("plan_id", metavar="ID")
@recorded_tools_option
@policy_option
@click.option("--as", "user", metavar="USER", help="Who starts the run (recorded; default 'engine').")
@db_option
@_plain_errors
def execute_command(
    *, plan_id: str, tools_spec: str | None, policy_file: Path | None, user: str | None, db: str | None
) -> None:
    """Execute approved plan ID. Exit 0 when it succeeds, 3 when it halts, 4 when it may not run.

    A finished plan is not run again: its recorded result is shown. The exact text that was
    approved runs, or nothing: a plan whose stored text, rows or approvals disagree with the
    audit log is refused. When the tools' contracts or the policy (--policy) changed since
    the plan was checked, it is checked again, and sent back for approval if it must be.
    """
    _run_command("execute", plan_id, tools_spec=tools_spec, policy_file=policy_file, db=db, user=user)


@main.command("resume")
@click.argument("plan_id", metavar="ID")
@recorded_tools_option
@policy_option
@click.option("--as", "user", metavar="USER", help="Who resumes the run (recorded; default 'engine').")
@db_option
@_plain_errors
def resume_command(
    *, plan_id: str, tools_spec: str | None, policy_file: Path | None, user: str | None, db: str | None
) -> None:
    """Resume plan ID after a halt or a crash: finished steps are kept, never run again.

    A step that started but has no recorded outcome is run again only if its tool is
    idempotent (with the same idempotency key); otherwise the run halts for a person.
    """
    _run_command("resume", plan_id, tools_spec=tools_spec, policy_file=policy_file, db=db, user=user)


@main.command("list")
@click.option(
    "--status",
    type=click.Choice(sorted(TRANSITIONS)),
    help="Only plans in this state.",
)
@db_option
@json_option
@_plain_errors
def list_command(*, status: str | None, db: str | None, as_json: bool) -> None:
    """List plans, oldest first."""
    rows = _runtime(db).list_plans(status)
    if as_json:
        click.echo(json.dumps([row.__dict__ for row in rows], indent=2))
        return
    for row in rows:
        click.echo(
            f"{row.id[:8]}  v{row.version}  {row.status:<16} {row.category:<12} {row.requested_by:<10} {row.task}"
        )
    if not rows:
        click.echo("no plans" + (f" with status {status}" if status else ""))


def _show(record: Any) -> None:
    what = "ReAct run" if record.kind == "react" else "plan"
    click.echo(f"{what} {record.id} v{record.version} ({record.status}), requested by {record.requested_by}")
    click.echo(f"  task: {record.task} [{record.category}]  hash: {record.hash}")
    if record.action is not None:
        action = record.action
        click.echo(f"  pending action {action['number']}: {action['tool']}({json.dumps(action['arguments'])})")
        click.echo(f"     why: {action['thought']}")
    for step in record.plan.steps if record.plan is not None else ():
        when = f" if {step.condition}" if step.condition else ""
        click.echo(f"  {step.id}. {step.tool}({json.dumps(step.params, ensure_ascii=False)}){when}")
        click.echo(f"     why: {step.rationale}")
    if record.needs:
        click.echo(f"  needs approval by {' and by '.join(record.needs)}")


@main.command("show")
@click.argument("plan_id", metavar="ID")
@db_option
@_plain_errors
def show_command(*, plan_id: str, db: str | None) -> None:
    """Show plan ID: its steps, why each is there, its status and what it still needs."""
    _show(_runtime(db).get(plan_id))


@main.command("trace")
@click.argument("plan_id", metavar="ID")
@db_option
@json_option
@_plain_errors
def trace_command(*, plan_id: str, db: str | None, as_json: bool) -> None:
    """Print plan ID's whole story from the audit log: check, policy, approvals, every step."""
    from plangate.story import tell

    runtime = _runtime(db)
    events = runtime.trace(plan_id)
    if as_json:
        click.echo(json.dumps([e.to_dict() for e in events], indent=2, ensure_ascii=False))
        return
    record = runtime.get(plan_id)
    click.echo(f"plan {record.id}: {record.task!r} ({record.category}), now {record.status}")
    for line in tell(events):
        click.echo(line)


@main.group("audit")
def audit_group() -> None:
    """The audit log, hash-chained under a key kept outside the database.

    The key: PLANGATE_AUDIT_KEY (the key itself), else the file PLANGATE_AUDIT_KEY_FILE,
    by default ~/.config/plangate/audit.key (made on first use, mode 0600).
    """


def _anchor(_ctx: click.Context, _param: click.Parameter, value: str | None) -> tuple[int, str] | None:
    """``--head SEQ:HASH``; ``SEQ HASH``, as ``plangate audit head`` prints it, is taken too."""
    if value is None:
        return None
    match = re.fullmatch(r"\s*(\d+)(?::|\s+)([0-9a-fA-F]{64})\s*", value)
    if match is None:
        raise click.BadParameter(f"{value!r} is not SEQ:HASH (a sequence number, a colon, 64 hex digits)")
    return int(match[1]), match[2].lower()


@audit_group.command("verify")
@click.option(
    "--head",
    "anchor",
    metavar="SEQ:HASH",
    callback=_anchor,
    help="A head kept elsewhere (from `plangate audit head`; `SEQ HASH` is taken too): the log must still "
    "hold that event with that hash.",
)
@db_option
@_plain_errors
def audit_verify_command(*, anchor: tuple[int, str] | None, db: str | None) -> None:
    """Check the whole audit log and the tables against it: exit 0 if intact, 1 naming what does not fit.

    The chain first (the first event that does not fit), then every stored plan, version,
    approval, policy and step row that disagrees with what the log recorded. Also 1 when
    the log cannot be checked: written with another key, or before the log was keyed.
    """
    from plangate import ledger

    runtime = _runtime(db)
    try:
        report = ledger.verify(runtime.store, anchor)
    finally:
        runtime.close()
    click.echo(str(report))
    sys.exit(0 if report.ok else EXIT_VIOLATIONS)


@audit_group.command("head")
@db_option
@json_option
@_plain_errors
def audit_head_command(*, db: str | None, as_json: bool) -> None:
    """Print the audit log's head, SEQ HASH: keep it elsewhere, then `audit verify --head SEQ:HASH`."""
    runtime = _runtime(db)
    try:
        seq, digest = runtime.store.audit_head()
    finally:
        runtime.close()
    click.echo(json.dumps({"seq": seq, "hash": digest}) if as_json else f"{seq} {digest}")


# -- planning: plan, run, usage, library ----------------------------------------------------

model_option = click.option(
    "--model",
    "model_spec",
    envvar="PLANGATE_MODEL",
    metavar="PROVIDER:NAME",
    help="anthropic:MODEL, openai:MODEL, openai-compatible:MODEL (with --base-url) or llamacpp:PATH.gguf. "
    "Without it only the plan library is used. Env: PLANGATE_MODEL.",
)
base_url_option = click.option("--base-url", metavar="URL", help="Server URL for openai-compatible models.")
prices_option = click.option(
    "--prices",
    "prices_file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="PLANGATE_PRICES",
    help="Price table YAML (default: the bundled one).",
)
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


@main.command("plan")
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
@_plain_errors
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

    runtime = _runtime(db, tools_spec, policy_file)
    try:
        result = _planner(runtime, model_spec, base_url, prices_file, max_tokens).plan(task)
    except PlanningError as exc:
        raise UsageError(str(exc)) from None
    checked = check(result.plan, runtime.catalogue, runtime.policy, user=user)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "plan": json.loads(result.plan.canonical_json()),
                    "planning": result.record(),
                    "check": checked.to_dict(),
                },
                indent=2,
            )
        )
    else:
        click.echo(json.dumps(json.loads(result.plan.canonical_json()), indent=2, ensure_ascii=False))
        click.echo(_planning_summary(result))
        for violation in checked.violations:
            click.echo(str(violation))
        click.echo(summary(result.plan, checked))
    sys.exit(0 if checked.ok else EXIT_VIOLATIONS)


@main.command("run")
@click.argument("task")
@tools_option
@policy_option
@model_option
@base_url_option
@prices_option
@max_tokens_option
@as_option
@click.option("--approver", metavar="USER", help="Approve at this terminal as USER (you are shown the plan first).")
@click.option(
    "--wait",
    default=0,
    show_default=True,
    metavar="SECONDS",
    help="How long to wait for approvals given elsewhere (plangate approve, the dashboard).",
)
@db_option
@_plain_errors
def run_command(
    *,
    task: str,
    tools_spec: str,
    policy_file: Path | None,
    model_spec: str | None,
    base_url: str | None,
    prices_file: Path | None,
    max_tokens: int,
    user: str,
    approver: str | None,
    wait: int,
    db: str | None,
) -> None:
    """Plan TASK, submit it, get it approved, execute it, and show what happened.

    Exit 0 when it succeeds (or is left waiting for approval), 1 when rejected, 3 when it
    halts, 2 when no plan came out.
    """
    import time

    from plangate.planner import PlanningError
    from plangate.story import tell

    runtime = _runtime(db, tools_spec, policy_file)
    try:
        result = _planner(runtime, model_spec, base_url, prices_file, max_tokens).plan(task)
    except PlanningError as exc:
        raise UsageError(str(exc)) from None
    click.echo(_planning_summary(result))
    record = runtime.submit(result, requested_by=user)
    click.echo(str(record))
    for violation in record.violations:
        click.echo(f"  {violation}")
    if record.status == "rejected":
        sys.exit(EXIT_VIOLATIONS)
    if record.status == "pending_approval" and approver:
        if not sys.stdin.isatty():
            raise UsageError("--approver needs a terminal to show the plan and ask; approve with plangate approve")
        _show(record)
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
    outcome = runtime.execute(record.id, actor=user, progress=_progress)
    click.echo(str(outcome))
    for line in tell(e for e in runtime.trace(record.id) if e.kind.startswith(("run.", "plan.approv"))):
        click.echo(line)
    sys.exit(0 if outcome.ok else EXIT_HALTED)


@main.command("usage")
@click.option("--days", default=30, show_default=True, help="Look back this many days.")
@db_option
@_plain_errors
def usage_command(*, days: int, db: str | None) -> None:
    """Planning calls by expected step count: thinking budget given vs tokens used, and cost.

    The numbers to calibrate the budget allocator from (docs/planning.md).
    """
    from datetime import timedelta

    runtime = _runtime(db)
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


@main.group("library")
def library_group() -> None:
    """The plan library: approved plans kept as templates, filled from new tasks without a model."""


@library_group.command("add")
@click.argument("plan_id", metavar="ID")
@click.option("--name", help="The template's name (default: derived from the task).")
@click.option("--as", "user", default="library", metavar="USER", help="Who adds it (recorded).")
@db_option
@_plain_errors
def library_add_command(*, plan_id: str, name: str | None, user: str, db: str | None) -> None:
    """Keep approved plan ID as a template; its task's values become typed slots."""
    from plangate.library import template_from

    runtime = _runtime(db)
    record = runtime.get(plan_id)
    if record.status not in ("approved", "running", "succeeded"):
        raise UsageError(f"plan {record.id} is {record.status}: only an approved plan can become a template")
    chosen = name or re.sub(r"[^a-z0-9]+", "-", record.task.lower()).strip("-")[:60]
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
@_plain_errors
def library_list_command(*, db: str | None) -> None:
    """List the templates."""
    templates = _runtime(db).store.templates()
    for template in templates:
        slots = ", ".join(f"{s['name']} ({s['type']})" for s in template.slots)
        click.echo(f"{template.name}: {template.pattern}  [slots: {slots}; from plan {template.source_plan[:8]}]")
    if not templates:
        click.echo("the library is empty: plangate library add PLAN_ID")


@library_group.command("remove")
@click.argument("name")
@db_option
@_plain_errors
def library_remove_command(*, name: str, db: str | None) -> None:
    """Remove template NAME."""
    runtime = _runtime(db)
    with runtime.store.transaction():
        removed = runtime.store.delete_template(name)
    if not removed:
        raise UsageError(f"no template named {name!r}")
    click.echo(f"removed template {name!r}")


# -- ReAct and the comparison ---------------------------------------------------------------


@main.command("react")
@click.argument("question", required=False)
@tools_option
@model_option
@base_url_option
@policy_option
@click.option("--as", "user", default="react", show_default=True, metavar="USER", help="Who asks (recorded).")
@click.option("--role", metavar="ROLE", help="The asker's role, for the policy.")
@click.option(
    "--mode",
    type=click.Choice(["text", "native"]),
    default="text",
    show_default=True,
    help="text: Thought/Action/Observation; native: the provider's tool calling.",
)
@click.option("--max-steps", default=10, show_default=True, help="Stop after this many turns.")
@click.option("--max-tokens", default=1024, show_default=True, help="The most tokens per model turn.")
@click.option("--resume", "resume_id", metavar="ID", help="Carry on a run paused for an approval.")
@prices_option
@db_option
@_plain_errors
def react_command(
    *,
    question: str | None,
    tools_spec: str,
    model_spec: str | None,
    base_url: str | None,
    policy_file: Path | None,
    user: str,
    role: str | None,
    mode: str,
    max_steps: int,
    max_tokens: int,
    resume_id: str | None,
    prices_file: Path | None,
    db: str | None,
) -> None:
    """Answer QUESTION with a ReAct loop, printing each step as it happens and the answer last.

    Write actions pause for an approval (plangate approve RUN_ID ...), then --resume RUN_ID.
    Exit 0 when answered (or paused), 3 when stopped (max steps, a loop, unparseable output).
    """
    from plangate.costs import PriceTable
    from plangate.models import from_spec
    from plangate.react import ReActAgent

    if not model_spec:
        raise UsageError("ReAct needs a model: --model PROVIDER:NAME")
    if (question is None) == (resume_id is None):
        raise UsageError("give a QUESTION, or --resume RUN_ID")
    runtime = _runtime(db, tools_spec, policy_file)
    agent = ReActAgent(
        from_spec(model_spec, base_url=base_url),
        runtime.catalogue,
        runtime.store,
        policy=runtime.policy,
        clock=runtime.clock,
        prices=PriceTable.load(prices_file),
        mode="native" if mode == "native" else "text",
        max_steps=max_steps,
        max_tokens=max_tokens,
        user=user,
        role=role,
        on_step=_print_step,
    )
    result = agent.resume(runtime.resolve_id(resume_id)) if resume_id else agent.run(question or "")
    click.echo(
        f"run {result.run_id}: {result.model_calls} model calls, {result.usage.input} input and "
        f"{result.usage.output} output tokens, {result.tool_calls} tool calls"
    )
    if result.status == "answered":
        click.echo(f"Final answer: {result.answer}")
    elif result.status == "paused":
        click.echo(
            f"{result.reason}\n  approve with: plangate approve {result.run_id[:8]} --as APPROVER --hash "
            f"{result.pending_hash}\n  then: plangate react --resume {result.run_id[:8]} --tools ... --model ..."
        )
    else:
        click.echo(f"stopped: {result.reason}")
    sys.exit(EXIT_HALTED if result.status == "stopped" else 0)


def _print_step(step: Any) -> None:
    if step.thought:
        click.echo(f"[{step.number}] Thought: {step.thought}")
    if step.tool:
        click.echo(f"[{step.number}] Action: {step.tool} {json.dumps(step.arguments, ensure_ascii=False)}")
    if step.kind in ("action", "refused", "unparsed"):
        text = step.observation if len(step.observation) <= 300 else step.observation[:297] + "..."
        click.echo(f"[{step.number}] Observation: {text}")


@main.command("compare")
@click.argument("tasks_file", metavar="TASKS.yaml", type=click.Path(dir_okay=False, path_type=Path))
@tools_option
@model_option
@base_url_option
@policy_option
@click.option("--max-tokens", default=2048, show_default=True, help="The most tokens per model call.")
@prices_option
@db_option
@_plain_errors
def compare_command(
    *,
    tasks_file: Path,
    tools_spec: str,
    model_spec: str | None,
    base_url: str | None,
    policy_file: Path | None,
    max_tokens: int,
    prices_file: Path | None,
    db: str | None,
) -> None:
    """Run each task in plan mode and in ReAct mode with the same model and tools; print a table."""
    from plangate.compare import Comparison, load_tasks, table
    from plangate.costs import PriceTable
    from plangate.models import from_spec

    if not model_spec:
        raise UsageError("the comparison needs a model: --model PROVIDER:NAME")
    tasks = load_tasks(tasks_file)
    runtime = _runtime(db, tools_spec, policy_file)
    comparison = Comparison(
        model=from_spec(model_spec, base_url=base_url),
        catalogue=runtime.catalogue,
        store=runtime.store,
        policy=runtime.policy,
        clock=runtime.clock,
        prices=PriceTable.load(prices_file),
        max_tokens=max_tokens,
    )
    for line in table(comparison.run(tasks)):
        click.echo(line)


# -- the server and its accounts ------------------------------------------------------------


@main.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--port", default=8420, show_default=True, help="Port to listen on.")
@tools_option
@policy_option
@db_option
@click.option("--session-hours", default=8.0, show_default=True, help="How long a login lasts.")
@_plain_errors
def serve_command(
    *, host: str, port: int, tools_spec: str, policy_file: Path | None, db: str | None, session_hours: float
) -> None:
    """Serve the dashboard and the JSON API (OpenAPI docs at /docs).

    Chat notifications: set PLANGATE_SLACK_WEBHOOK (an incoming-webhook URL),
    PLANGATE_SLACK_SIGNING_SECRET (to accept the approve/reject buttons at /slack/actions)
    and PLANGATE_BASE_URL (for links to plan pages).
    """
    import os

    import uvicorn

    from plangate.notify import SlackNotifier
    from plangate.server import create_app

    catalogue = Catalogue.from_module(tools_spec)
    policy = Policy.load(policy_file) if policy_file else None
    loopback = host in ("127.0.0.1", "localhost", "::1")
    webhook = os.environ.get("PLANGATE_SLACK_WEBHOOK")
    base = os.environ.get("PLANGATE_BASE_URL") or f"http://{host}:{port}"
    notify = SlackNotifier(webhook_url=webhook, base_url=base) if webhook else None
    app = create_app(
        catalogue,
        policy,
        db=db,
        session_hours=session_hours,
        secure_cookies=not loopback,
        notify=notify,
        slack_signing_secret=os.environ.get("PLANGATE_SLACK_SIGNING_SECRET"),
    )
    click.echo(f"plangate serving on http://{host}:{port} (API docs at /docs)")
    uvicorn.run(app, host=host, port=port, log_level="warning")


@main.group("users")
def users_group() -> None:
    """Accounts for the dashboard and the API."""


@users_group.command("add")
@click.argument("name")
@click.option("--role", required=True, type=click.Choice(["requester", "approver", "governance", "auditor"]))
@click.option(
    "--category",
    "categories",
    multiple=True,
    metavar="PATTERN",
    help="Plan categories an approver may decide on (repeat; '*' for all).",
)
@click.option("--password-stdin", is_flag=True, help="Read the password from standard input.")
@db_option
@_plain_errors
def users_add_command(
    *, name: str, role: str, categories: tuple[str, ...], password_stdin: bool, db: str | None
) -> None:
    """Add (or update) user NAME with a role; asks for a password at a terminal."""
    from plangate.accounts import Accounts

    if password_stdin:
        password: str | None = sys.stdin.readline().rstrip("\n")
    elif sys.stdin.isatty():
        password = click.prompt("password", hide_input=True, confirmation_prompt=True)
    else:
        password = None
    runtime = _runtime(db)
    user = Accounts(runtime.store).add(
        name, role, password=password, categories=categories, at=iso(runtime.clock.now())
    )
    scope = f", may decide on {', '.join(categories)}" if categories else ""
    click.echo(f"user {user.name}: {user.role}{scope}" + ("" if password else " (no password: API tokens only)"))


@users_group.command("token")
@click.argument("name")
@click.option("--label", default="api", show_default=True, help="What the token is for.")
@db_option
@_plain_errors
def users_token_command(*, name: str, label: str, db: str | None) -> None:
    """Issue an API token for NAME (shown once; only its digest is kept)."""
    from plangate.accounts import Accounts

    runtime = _runtime(db)
    click.echo(Accounts(runtime.store).issue_token(name, label, at=iso(runtime.clock.now())))


@main.group("register")
def register_group() -> None:
    """The auto-approval register: which categories governance has cleared for automatic approval."""


@register_group.command("set")
@click.argument("category")
@click.argument("state", type=click.Choice(["on", "off"]))
@click.option("--as", "user", required=True, metavar="USER", help="A governance account.")
@click.option("--reason", required=True, help="Why (recorded).")
@db_option
@_plain_errors
def register_set_command(*, category: str, state: str, user: str, reason: str, db: str | None) -> None:
    """Turn automatic approval of CATEGORY on or off (never beyond what the policy allows)."""
    from plangate.register import Register

    runtime = _runtime(db)
    entry = Register(runtime.store, runtime.clock).set(category, state == "on", by=user, reason=reason)
    click.echo(
        f"{entry.category}: automatic approval {'on' if entry.auto else 'off'} (by {entry.changed_by}: {entry.reason})"
    )


@register_group.command("list")
@db_option
@_plain_errors
def register_list_command(*, db: str | None) -> None:
    """Show the register."""
    from plangate.register import Register

    entries = Register(_runtime(db).store).all()
    for e in entries:
        click.echo(f"{e.category:<16} {'on ' if e.auto else 'off'}  {e.changed_at[:16]}  {e.changed_by}: {e.reason}")
    if not entries:
        click.echo("the register is empty: every category follows the policy")


@main.group("approvals")
def approvals_group() -> None:
    """Evidence about approvals."""


@approvals_group.command("report")
@click.option("--days", default=90, show_default=True, help="The window to look at.")
@click.option("--min-plans", default=5, show_default=True, help="Decisions needed before a category is a candidate.")
@db_option
@_plain_errors
def approvals_report_command(*, days: int, min_plans: int, db: str | None) -> None:
    """Per category: plans, approval rate, edit rate, time to decision, and the candidates for auto-approval."""
    from plangate.register import report

    rows = report(_runtime(db).store, days=days, min_plans=min_plans)
    click.echo(
        f"{'CATEGORY':<16} {'PLANS':>5} {'APPROVED':>8} {'REJECTED':>8} {'APPROVAL':>8} {'EDITED':>6} "
        f"{'MEDIAN MIN':>10}  CANDIDATE"
    )
    for r in rows:
        rate = f"{r.approval_rate:.0%}" if r.approval_rate is not None else "-"
        median = f"{r.median_minutes:.1f}" if r.median_minutes is not None else "-"
        click.echo(
            f"{r.category:<16} {r.plans:>5} {r.approved:>8} {r.rejected:>8} {rate:>8} {r.edited:>6} "
            f"{median:>10}  {'yes' if r.candidate else 'no'}"
        )
    if not rows:
        click.echo(f"no plans in the last {days} days")
    click.echo(f"a candidate has at least {min_plans} decisions, all approvals, and no edits")


@main.command("settle")
@click.argument("plan_id", metavar="ID")
@click.argument("step", type=int)
@click.option("--done/--not-done", required=True, help="Whether the step's effect happened.")
@click.option("--output", "output_json", metavar="JSON", help="With --done: the output you observed, as JSON.")
@click.option("--note", help="What you checked (recorded).")
@as_option
@recorded_tools_option
@db_option
@_plain_errors
def settle_command(
    *,
    plan_id: str,
    step: int,
    done: bool,
    output_json: str | None,
    note: str | None,
    user: str,
    tools_spec: str | None,
    db: str | None,
) -> None:
    """Settle a step whose outcome is unknown: it happened (--done) or it did not (--not-done, safe to run again).

    Then `plangate resume ID` carries on.
    """
    runtime = _runtime(db)
    record = _with_tools(runtime, plan_id, tools_spec, required=False)
    try:
        output = json.loads(output_json) if output_json else None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--output is not JSON: {exc}") from None
    record = runtime.settle(record.id, step, done=done, actor=user, output=output, note=note)
    click.echo(f"step {step} settled as {'done' if done else 'not done'}; now: plangate resume {record.id[:8]}")


@main.command("compensate")
@click.argument("plan_id", metavar="ID")
@as_option
@click.option("--reason", required=True, help="Why the plan is rolled back (recorded).")
@recorded_tools_option
@db_option
@_plain_errors
def compensate_command(*, plan_id: str, user: str, reason: str, tools_spec: str | None, db: str | None) -> None:
    """Roll back halted plan ID: completed steps with a compensating tool are undone, last first."""
    runtime = _runtime(db)
    record = _with_tools(runtime, plan_id, tools_spec)
    result = runtime.compensate(record.id, actor=user, reason=reason)
    click.echo(str(result))
    sys.exit(0 if result.status == "compensated" else EXIT_HALTED)


@main.command("worker")
@recorded_tools_option
@policy_option
@db_option
@click.option(
    "--lease",
    "lease_seconds",
    default=30.0,
    show_default=True,
    help="Seconds a claimed plan stays this worker's without renewal.",
)
@click.option("--drain", is_flag=True, help="Exit when no plan is left to run.")
@click.option("--name", help="This worker's name (default: host and process).")
@click.option(
    "--temporal",
    "temporal_address",
    metavar="HOST:PORT",
    help="Run plans as Temporal workflows (each step an activity) on this Temporal server.",
)
@_plain_errors
def worker_command(
    *,
    tools_spec: str | None,
    policy_file: Path | None,
    db: str | None,
    lease_seconds: float,
    drain: bool,
    name: str | None,
    temporal_address: str | None,
) -> None:
    """Claim approved plans and run them; several workers (on several machines) share the work.

    Use a PostgreSQL store (--db postgresql://...) to share it across machines. A killed
    worker's plan is taken over by another once its lease expires.
    """

    from plangate import lifecycle
    from plangate.worker import Worker

    if tools_spec is None:
        raise UsageError("a worker needs --tools (or PLANGATE_TOOLS)")
    if temporal_address:
        import asyncio

        from plangate.store import default_url
        from plangate.temporal import serve

        ran = asyncio.run(
            serve(
                temporal_address,
                db or default_url(),
                _absolute(tools_spec) or tools_spec,
                drain=drain,
                name=lifecycle.runner(name or "temporal-worker"),
            )
        )
        click.echo(f"temporal worker: {ran} plans run", err=True)
        return
    worker = Worker(
        Catalogue.from_module(tools_spec),
        db=db,
        policy=Policy.load(policy_file) if policy_file else None,
        lease_seconds=lease_seconds,
        name=lifecycle.runner(name or "worker"),
    )
    click.echo(f"worker {worker.name} on {worker.db or 'the default store'}", err=True)
    ran = worker.serve(drain=drain, on_result=lambda r: click.echo(f"{r.plan_id}: {r.status}"))
    click.echo(f"worker {worker.name}: {ran} plans run", err=True)
