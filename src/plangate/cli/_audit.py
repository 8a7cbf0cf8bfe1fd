"""`plangate audit`: verify the hash-chained audit log and the tables against it, print its head."""

from __future__ import annotations

import json
import re
import sys
from typing import TYPE_CHECKING

import click

from plangate.cli import _remote
from plangate.cli._common import db_option, json_option, open_runtime, token_option
from plangate.cli._errors import EXIT_VIOLATIONS
from plangate.cli._remote import server_option
from plangate.errors import GovernanceError, UsageError

if TYPE_CHECKING:
    from plangate.runtime import Runtime


@click.group("audit")
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
@click.option(
    "--plan",
    "plan_id",
    metavar="ID",
    help="Also verify this plan's own chain of events and list the calls it proves: each step's tool, "
    "and for an MCP tool its server and its name there.",
)
@db_option
@server_option
@token_option
def audit_verify_command(
    *, anchor: tuple[int, str] | None, plan_id: str | None, db: str | None, server: str | None, token: str | None
) -> None:
    """Check the whole audit log and the tables against it: exit 0 if intact, 1 naming what does not fit.

    The chain first (the first event that does not fit), then every stored plan, version,
    approval, policy and step row that disagrees with what the log recorded. Also 1 when
    the log cannot be checked: written with another key, or before the log was keyed.
    """
    from plangate import ledger

    if server:
        if anchor is not None or plan_id is not None:
            raise UsageError("--head and --plan are checked where the log is: run audit verify on the server's machine")
        reply = _remote.client(server, token).call("GET", "/audit/verify")
        click.echo(reply["summary"])
        sys.exit(0 if reply["ok"] else EXIT_VIOLATIONS)
    runtime = open_runtime(db)
    try:
        report = ledger.verify(runtime.store, anchor)
        calls = _proven_calls(runtime, plan_id) if plan_id is not None and report.ok else None
    finally:
        runtime.close()
    click.echo(str(report))
    if calls is not None:
        click.echo("\n".join(calls))
    sys.exit(0 if report.ok else EXIT_VIOLATIONS)


def _proven_calls(runtime: Runtime, plan_id: str) -> list[str]:
    """A plan's events, verified as its own chain, and the calls they record: tool, attempt, key, MCP origin."""
    record = runtime.get(plan_id)
    events, broken = runtime.store.plan_events(record.id)
    if broken is not None:
        raise GovernanceError(f"plan {record.id}'s own chain of events does not verify: {broken}")
    from plangate._overrides import told_origin

    lines = [f"plan {record.id}: {len(events)} events verified as its own chain; the calls they record:"]
    for event in events:
        if event.kind != "step.started":
            continue
        data = event.data
        origin = told_origin(data)
        where = f" = {origin} ({data['source']})" if origin else ""
        lines.append(
            f"  v{event.version} step {event.step_id}: {data.get('tool')}{where}, attempt {data.get('attempt', 1)}, "
            f"key {data.get('idempotency_key')}, at {event.at}"
        )
    if len(lines) == 1:
        lines.append("  none: it never ran")
    return lines


@audit_group.command("head")
@db_option
@json_option
def audit_head_command(*, db: str | None, as_json: bool) -> None:
    """Print the audit log's head, SEQ HASH: keep it elsewhere, then `audit verify --head SEQ:HASH`."""
    runtime = open_runtime(db)
    try:
        seq, digest = runtime.store.audit_head()
    finally:
        runtime.close()
    click.echo(json.dumps({"seq": seq, "hash": digest}) if as_json else f"{seq} {digest}")


COMMANDS = (audit_group,)
