"""`plangate governance`: export the artefacts an auditor asks for, and verify an export."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from plangate.cli._common import db_option, open_runtime
from plangate.cli._errors import EXIT_VIOLATIONS


@click.group("governance")
def governance_group() -> None:
    """Governance exports: the plan schema, the policy's rules and history, the approval log, a trace per
    plan, the auto-approval register with its evidence, the incidents and their runbook (docs/governance.md)."""


@governance_group.command("export")
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The folder to write (made if missing; it must be empty).",
)
@click.option("--since", metavar="DATE", help="Only plans created at or after DATE (YYYY-MM-DD, or an ISO time, UTC).")
@click.option(
    "--tools",
    "tools_spec",
    metavar="MODULE",
    help="Tools (a module, mcp:... or FILE.yaml) that say which tools have effects (default: each plan's on record).",
)
@click.option("--force", is_flag=True, help="Replace an earlier export in --out.")
@db_option
def governance_export_command(
    *, out: Path, since: str | None, tools_spec: str | None, force: bool, db: str | None
) -> None:
    """Write the governance export to --out, from the store alone, with a manifest of every file's SHA-256.

    Prints a line per plan as it goes. The manifest names the audit log's head at the time
    of the export: check the folder later with `plangate governance verify`.
    """
    from plangate.governance import export, parse_since
    from plangate.tools import Catalogue

    when = parse_since(since)
    catalogue = Catalogue.from_spec(tools_spec) if tools_spec else None
    runtime = open_runtime(db)
    try:
        done = export(runtime.store, out, since=when, catalogue=catalogue, force=force, progress=click.echo)
    finally:
        runtime.close()
    click.echo(str(done))


@governance_group.command("verify")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--db", "db", metavar="URL", help="Also check the manifest's audit head against this store.")
@click.option(
    "--manifest-sha256",
    "expected",
    metavar="HEX",
    help="The manifest's SHA-256 as the export printed it, kept elsewhere: catches a rewritten manifest.",
)
def governance_verify_command(*, folder: Path, db: str | None, expected: str | None) -> None:
    """Check an export: every file's SHA-256, no file missing or extra; with --db, its audit head in the store.

    The manifest vouches for every other file; to vouch for the manifest itself, keep the
    SHA-256 that the export printed somewhere else and give it with --manifest-sha256.
    Exit 0 when it verifies; 1 naming the first file that does not (and what); 2 when FOLDER
    is not an export.
    """
    from plangate.governance import verify

    runtime = open_runtime(db) if db else None
    try:
        verdict = verify(folder, runtime.store if runtime is not None else None, manifest_sha256=expected)
    finally:
        if runtime is not None:
            runtime.close()
    click.echo(str(verdict))
    sys.exit(0 if verdict.ok else EXIT_VIOLATIONS)


COMMANDS = (governance_group,)
