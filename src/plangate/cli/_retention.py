"""`plangate retention purge`: remove the payloads of finished plans after a time (see plangate.retention)."""

from __future__ import annotations

from pathlib import Path

import click

from plangate.cli._common import acting, db_option, identity_options, open_runtime, policy_option


@click.group("retention")
def retention_group() -> None:
    """How long finished plans keep their payloads (step parameters and outputs, plan texts)."""


@retention_group.command("purge")
@click.option(
    "--older-than", "days", type=int, required=True, metavar="DAYS", help="Purge plans whose last event is older."
)
@click.option("--dry-run", is_flag=True, help="Say what would be purged; change nothing.")
@click.option("--yes", is_flag=True, help="Do not ask before purging.")
@click.option("--batch", type=click.IntRange(1, 10_000), default=100, show_default=True, help="Plans per transaction.")
@policy_option
@db_option
@identity_options
def purge_command(
    *,
    days: int,
    dry_run: bool,
    yes: bool,
    batch: int,
    policy_file: Path | None,
    db: str | None,
    user: str | None,
    token: str | None,
) -> None:
    """Remove the payloads of finished plans (succeeded, rejected, compensated, closed) whose
    last event is older than DAYS.

    Step parameters, outputs and errors, the plan's text, a ReAct run's thoughts and the
    library's templates made from the plan go; the status, versions, hashes, checks and
    decisions stay, and the audit chain still verifies. DAYS may not be under 90, nor under
    the policy's retention.min_days (exit 2). Each batch is one transaction, recorded as a
    retention.purged audit event. Governance only, once the store has accounts.
    """
    from plangate import retention

    runtime = open_runtime(db, policy_file=policy_file)
    try:
        now = runtime.clock.now()
        before = retention.cutoff(now, days, runtime.policy)  # refused under the floor before anything is read
        if not dry_run:
            actor = acting(runtime, user, token, "retention", default="retention")
            if not yes:
                count = len(retention.candidates(runtime.store, before))
                question = f"purge the payloads of {count} finished plan(s) last touched before {before}?"
                click.confirm(question, abort=True)
        else:
            actor = user or "retention"

        def progress(done: int, total: int) -> None:
            click.echo(f"  {done}/{total} plans looked at")

        purged = retention.purge(
            runtime.store,
            days=days,
            policy=runtime.policy,
            now=now,
            actor=actor,
            dry_run=dry_run,
            batch=batch,
            progress=progress,
        )
    finally:
        runtime.close()
    verb = "would purge" if dry_run else "purged"
    click.echo(f"{verb} {len(purged.plans)} plan(s), {purged.events} event(s), last touched before {purged.cutoff}")
    for name in purged.templates:
        click.echo(f"  {'would remove' if dry_run else 'removed'} template {name!r}: it holds a purged plan's text")
    for why in purged.refused:
        click.echo(f"  left whole: {why}")


COMMANDS = (retention_group,)
