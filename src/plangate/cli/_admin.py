"""The server and governance: serve, the auto-approval register, the approvals report."""

from __future__ import annotations

from pathlib import Path

import click

from plangate._extras import need
from plangate.cli import _remote
from plangate.cli._common import (
    acting,
    db_option,
    identity_options,
    open_runtime,
    policy_option,
    token_option,
    tools_option,
)
from plangate.cli._remote import server_option
from plangate.policy import Policy
from plangate.tools import Catalogue


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--port", default=8420, show_default=True, help="Port to listen on.")
@tools_option
@policy_option
@db_option
@click.option("--session-hours", default=8.0, show_default=True, help="How long a login lasts.")
@click.option("--api-docs", is_flag=True, help="Serve the API's docs at /docs and /openapi.json (to logged-in users).")
@click.option(
    "--metrics/--no-metrics",
    default=True,
    show_default=True,
    help="Serve Prometheus metrics at /metrics (no login; set PLANGATE_METRICS_TOKEN to require a bearer token).",
)
def serve_command(
    *,
    host: str,
    port: int,
    tools_spec: str,
    policy_file: Path | None,
    db: str | None,
    session_hours: float,
    api_docs: bool,
    metrics: bool,
) -> None:
    """Serve the dashboard, the JSON API and Prometheus metrics (/metrics).

    The session-signing secret comes from PLANGATE_SECRET_KEY or its key file
    (~/.config/plangate/secret.key, made on first start, mode 0600), never the database.

    Chat notifications: set PLANGATE_SLACK_WEBHOOK (an incoming-webhook URL),
    PLANGATE_SLACK_SIGNING_SECRET (to accept the approve/reject buttons at /slack/actions)
    and PLANGATE_BASE_URL (for links to plan pages).

    Metrics: /metrics needs no login unless PLANGATE_METRICS_TOKEN is set (then a scrape
    sends it as a bearer token); --no-metrics turns it off.
    """
    import os

    need("server", "serve")
    import uvicorn

    from plangate.notify import SlackNotifier
    from plangate.server import create_app

    catalogue = Catalogue.from_spec(tools_spec)
    policy = Policy.load(policy_file) if policy_file else None
    loopback = host in ("127.0.0.1", "localhost", "::1")
    webhook = os.environ.get("PLANGATE_SLACK_WEBHOOK")
    public = os.environ.get("PLANGATE_BASE_URL")
    base = public or f"http://{host}:{port}"
    notify = SlackNotifier(webhook_url=webhook, base_url=base) if webhook else None
    app = create_app(
        catalogue,
        policy,
        db=db,
        session_hours=session_hours,
        secure_cookies=not loopback,
        notify=notify,
        slack_signing_secret=os.environ.get("PLANGATE_SLACK_SIGNING_SECRET"),
        api_docs=api_docs,
        origins=(_origin(public),) if public else (),
        metrics=metrics,
        metrics_token=os.environ.get("PLANGATE_METRICS_TOKEN") or None,
    )
    click.echo(f"plangate serving on http://{host}:{port}" + (" (API docs at /docs)" if api_docs else ""))
    uvicorn.run(app, host=host, port=port, log_level="warning")


def _origin(url: str) -> str:
    """The origin (scheme://host[:port]) of a public address that may carry a path."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


@click.group("register")
def register_group() -> None:
    """The auto-approval register: which categories governance has cleared for automatic approval."""


@register_group.command("set")
@click.argument("category")
@click.argument("state", type=click.Choice(["on", "off"]))
@identity_options
@click.option("--reason", required=True, help="Why (recorded).")
@policy_option
@click.option("--force", is_flag=True, help="Turn it on even though the policy never approves CATEGORY automatically.")
@db_option
@server_option
def register_set_command(
    *,
    category: str,
    state: str,
    user: str | None,
    token: str | None,
    reason: str,
    policy_file: Path | None,
    force: bool,
    db: str | None,
    server: str | None,
) -> None:
    """Turn automatic approval of CATEGORY on or off (never beyond what the policy allows); governance only.

    Turning on a category the policy (--policy; the server's own with --server) always sends
    to a person, or does not define, is refused (exit 4): the register would say "on" for
    plans that never go without a person. --force records it anyway.
    """
    from plangate.register import Entry, Register

    if server:
        body = {"category": category, "state": state, "reason": reason, "force": force}
        entry = Entry(**_remote.client(server, token).call("POST", "/register", body))
    else:
        runtime = open_runtime(db, policy_file=policy_file)
        person = acting(runtime, user, token, "register")
        entry = Register(runtime.store, runtime.clock).set(
            category, state == "on", by=person, reason=reason, policy=runtime.policy, force=force
        )
    click.echo(
        f"{entry.category}: automatic approval {'on' if entry.auto else 'off'} (by {entry.changed_by}: {entry.reason})"
    )


@register_group.command("list")
@db_option
@server_option
@token_option
def register_list_command(*, db: str | None, server: str | None, token: str | None) -> None:
    """Show the register."""
    from plangate.register import Entry, Register

    if server:
        entries = [Entry(**e) for e in _remote.client(server, token).call("GET", "/register")["entries"]]
    else:
        entries = Register(open_runtime(db).store).all()
    for e in entries:
        click.echo(f"{e.category:<16} {'on ' if e.auto else 'off'}  {e.changed_at[:16]}  {e.changed_by}: {e.reason}")
    if not entries:
        click.echo("the register is empty: every category follows the policy")


@click.group("approvals")
def approvals_group() -> None:
    """Evidence about approvals."""


@approvals_group.command("report")
@click.option("--days", default=90, show_default=True, help="The window to look at.")
@click.option("--min-plans", default=5, show_default=True, help="Decisions needed before a category is a candidate.")
@db_option
def approvals_report_command(*, days: int, min_plans: int, db: str | None) -> None:
    """Per category: plans, approval rate, edit rate, time to decision, and the candidates for auto-approval."""
    from plangate._display import printable
    from plangate.register import report

    evidence = report(open_runtime(db).store, days=days, min_plans=min_plans)
    click.echo(
        f"{'CATEGORY':<16} {'PLANS':>5} {'APPROVED':>8} {'REJECTED':>8} {'APPROVAL':>8} {'EDITED':>6} "
        f"{'MEDIAN MIN':>10}  CANDIDATE"
    )
    for r in evidence.categories:
        rate = f"{r.approval_rate:.0%}" if r.approval_rate is not None else "-"
        median = f"{r.median_minutes:.1f}" if r.median_minutes is not None else "-"
        click.echo(
            f"{r.category:<16} {r.plans:>5} {r.approved:>8} {r.rejected:>8} {rate:>8} {r.edited:>6} "
            f"{median:>10}  {'yes' if r.candidate else 'no'}"
        )
    if not evidence.categories:
        click.echo(f"no plans in the last {days} days")
    click.echo(f"a candidate has at least {min_plans} decisions, all approvals, and no edits")
    if evidence.left_out:
        click.echo(f"{len(evidence.left_out)} plan(s) left out, so no category is a candidate:")
        for line in evidence.named:
            click.echo(f"  {printable(line)}")  # a plan id from the store: a row anyone could write


COMMANDS = (serve_command, register_group, approvals_group)
