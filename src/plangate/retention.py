"""Retention: remove the payloads of finished plans after a time, and keep the audit chain verifiable.

A purge takes the plans that are finished for good (succeeded, rejected, compensated,
closed) and whose last event is older than the limit, and removes their payloads (see
:mod:`plangate._purged`): from their events, their step rows and their plan texts, the
cost ledger's words about their model calls (an extraction's instructions, an error), and
the library's templates made from them (a template is a copy of its plan's text). What
governance needs stays: status, versions and hashes, decisions, checks, transitions.
Each purged event keeps its hash, which covers the digest of its data as first written,
and is sealed under the audit key, so ``plangate audit verify`` still passes and an
unsealed blanking is still caught. A plan is purged only if its events verify and its rows
agree with them (a purge never launders a change made outside plangate), and only if its
events were written with data digests (events written before cannot be purged).

The limit never goes under :data:`~plangate.policy.RETENTION_FLOOR_DAYS`, nor under the
policy's ``retention.min_days``. Each batch of plans is one transaction that ends with a
``retention.purged`` event: who, when, the limit, which plans, how many events, which
templates went with them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from plangate import _purged, ledger
from plangate._clock import iso
from plangate.errors import UsageError
from plangate.policy import RETENTION_FLOOR_DAYS, Policy
from plangate.store import Store

FINISHED = ("succeeded", "rejected", "compensated", "closed")
"""The states a plan never leaves: only these are purged."""

_CANDIDATES = (
    "SELECT p.id FROM plans p JOIN events e ON e.plan_id = p.id"
    f" WHERE p.purged_at IS NULL AND p.status IN ({', '.join(repr(s) for s in FINISHED)})"
    " GROUP BY p.id HAVING MAX(e.at) < ? ORDER BY p.id"
)
_LEDGER_TASKS = "UPDATE model_calls SET task = ? WHERE plan_id = ? AND purpose = 'extract'"
_LEDGER_ERRORS = "UPDATE model_calls SET error = ? WHERE plan_id = ? AND error IS NOT NULL"
_TEMPLATES = "SELECT name FROM templates WHERE source_plan = ? ORDER BY name"


def floor(policy: Policy | None) -> int:
    """The fewest days a limit may be: the policy's ``retention.min_days``, else the built-in floor."""
    return policy.retention.min_days if policy is not None and policy.retention is not None else RETENTION_FLOOR_DAYS


def cutoff(now: datetime, days: int, policy: Policy | None) -> str:
    """The time before which a finished plan's last event must lie; a limit under the floor is refused."""
    least = floor(policy)
    if days < least:
        where = "the policy's retention.min_days" if least > RETENTION_FLOOR_DAYS else "plangate's floor"
        raise UsageError(f"--older-than {days} is under {where} of {least} days: nothing was purged")
    try:
        return iso(now - timedelta(days=days))
    except OverflowError:  # further back than the calendar goes
        raise UsageError(f"--older-than {days} reaches before the year 1: nothing was purged") from None


@dataclass(frozen=True, kw_only=True)
class Purged:
    """What a purge did (or, dry, would do)."""

    cutoff: str
    plans: tuple[str, ...]
    events: int
    refused: tuple[str, ...] = ()
    """Plans left whole, each with why (their events do not verify, or predate data digests)."""
    templates: tuple[str, ...] = ()
    """The library's templates removed with the plans they were made from."""
    dry_run: bool = False


def candidates(store: Store, before: str) -> list[str]:
    """The finished, not yet purged plans whose last event is older than ``before``."""
    return [str(row[0]) for row in store.query(_CANDIDATES, (before,))]


def purge(
    store: Store,
    *,
    days: int,
    policy: Policy | None,
    now: datetime,
    actor: str,
    dry_run: bool = False,
    batch: int = 100,
    progress: Callable[[int, int], None] | None = None,
) -> Purged:
    """Purge the payloads of finished plans older than ``days``; ``progress(done, total)`` after each batch."""
    before, at = cutoff(now, days, policy), iso(now)
    ids = candidates(store, before)
    plans: list[str] = []
    refused: list[str] = []
    templates: list[str] = []
    events = 0
    for start in range(0, len(ids), batch):
        with store.transaction():
            store.lock_log()
            done, count = _batch(store, ids[start : start + batch], refused, before=before, at=at, dry_run=dry_run)
            gone = _templates(store, done, dry_run=dry_run)
            if done and not dry_run:
                data = {"older_than_days": days, "cutoff": before, "plans": done, "events": count, "templates": gone}
                store.append_event(
                    plan_id=None, version=None, step_id=None, kind="retention.purged", actor=actor, at=at, data=data
                )
        plans, events, templates = plans + done, events + count, templates + gone
        if progress is not None:
            progress(min(start + batch, len(ids)), len(ids))
    return Purged(
        cutoff=before,
        plans=tuple(plans),
        events=events,
        refused=tuple(refused),
        templates=tuple(templates),
        dry_run=dry_run,
    )


def _templates(store: Store, plans: list[str], *, dry_run: bool) -> list[str]:
    """Remove the templates made from these purged plans (inside the batch's transaction): their names.

    A template keeps its plan's text, the values its slots do not take included, so it
    cannot outlive the plan's payloads.
    """
    names = [str(row[0]) for plan_id in plans for row in store.query(_TEMPLATES, (plan_id,))]
    if not dry_run:
        for name in names:
            store.delete_template(name)
    return names


def _batch(
    store: Store, ids: list[str], refused: list[str], *, before: str, at: str, dry_run: bool
) -> tuple[list[str], int]:
    """Purge each plan that may be (inside the batch's transaction): the plans purged and the events changed."""
    done: list[str] = []
    events = 0
    for plan_id in ids:
        changed = _plan(store, plan_id, before, at, dry_run)
        if isinstance(changed, str):
            refused.append(f"plan {plan_id}: {changed}")
        else:
            done.append(plan_id)
            events += changed
    return done, events


def _plan(store: Store, plan_id: str, before: str, at: str, dry_run: bool) -> int | str:
    """Purge one plan: how many of its events changed, or why it is left whole.

    The plan was listed before its batch took the log's lock: it is held again to the
    listing's terms here, from its verified events (a rejected plan may be edited meanwhile).
    """
    events, broken = store.plan_events(plan_id)
    if broken is not None:
        return f"its events do not verify ({broken}); see plangate audit verify"
    told = ledger.fold(plan_id, events)
    if found := ledger.problems(store, told):
        return f"its rows disagree with its events ({found[0]}); see plangate audit verify"
    if told.status not in FINISHED:
        return f"it is {told.status} now, not finished: it changed after the purge listed it"
    if (last := max((e.at for e in events), default="")) >= before:
        return f"its last event ({last}) is after the cutoff: it changed after the purge listed it"
    unhashed = store.query("SELECT COUNT(*) FROM events WHERE plan_id = ? AND data_hash IS NULL", (plan_id,))
    if unhashed[0][0]:
        return "its events were written before plangate kept data digests, so their payloads cannot be purged"
    marked = [e for number, e in enumerate(events) if number == 0 or _purged.PAYLOADS & e.data.keys()]
    if dry_run:
        return len(marked)
    for event in marked:
        store.purge_event(event.seq, {k: v for k, v in event.data.items() if k not in _purged.PAYLOADS}, at)
    store.command("UPDATE steps SET params = NULL, output = NULL, error = NULL WHERE plan_id = ?", (plan_id,))
    store.command("UPDATE plan_versions SET body = ? WHERE plan_id = ?", (_purged.body(at), plan_id))
    # The cost ledger keeps its counts and costs; an extraction's task is its instructions (a
    # step parameter), and a failed call's error may quote what the model was sent.
    store.command(_LEDGER_TASKS, (_purged.SHOWN, plan_id))
    store.command(_LEDGER_ERRORS, (_purged.SHOWN, plan_id))
    store.command("UPDATE plans SET purged_at = ? WHERE id = ?", (at, plan_id))
    return len(marked)
