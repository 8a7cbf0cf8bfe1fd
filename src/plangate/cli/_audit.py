"""`plangate audit`: verify the hash-chained audit log and the tables against it, print its head."""

from __future__ import annotations

import json
import re
import sys

import click

from plangate.cli import _remote
from plangate.cli._common import db_option, json_option, open_runtime, token_option
from plangate.cli._errors import EXIT_VIOLATIONS
from plangate.cli._remote import server_option
from plangate.errors import UsageError


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
@db_option
@server_option
@token_option
def audit_verify_command(
    *, anchor: tuple[int, str] | None, db: str | None, server: str | None, token: str | None
) -> None:
    """Check the whole audit log and the tables against it: exit 0 if intact, 1 naming what does not fit.

    The chain first (the first event that does not fit), then every stored plan, version,
    approval, policy and step row that disagrees with what the log recorded. Also 1 when
    the log cannot be checked: written with another key, or before the log was keyed.
    """
    from plangate import ledger

    if server:
        if anchor is not None:
            raise UsageError("--head is checked where the log is: run audit verify --head on the server's machine")
        reply = _remote.client(server, token).call("GET", "/audit/verify")
        click.echo(reply["summary"])
        sys.exit(0 if reply["ok"] else EXIT_VIOLATIONS)
    runtime = open_runtime(db)
    try:
        report = ledger.verify(runtime.store, anchor)
    finally:
        runtime.close()
    click.echo(str(report))
    sys.exit(0 if report.ok else EXIT_VIOLATIONS)


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
