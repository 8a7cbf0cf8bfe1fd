"""The auto-approval register, and the evidence for it.

The policy says which categories *may* be approved automatically; the register says
which ones governance has actually cleared. A category with no entry follows the policy;
an entry turns automatic approval on (never beyond what the policy allows) or off. Only
an account with the ``governance`` role changes the register, and every change is an
audit event with who, when and why.

``report`` gives, per category over a window, the evidence for such a decision: how
many plans, how many a person approved or rejected, how many were edited before the
decision, the median time to a decision, and whether the category is *consistently
approved without modification* (enough plans, every decision an approval, no edits).
Like the register, it is read from the audit log (each plan's events, checked under the
key), never from the tables, which only mirror it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from plangate import _input, audit, ledger
from plangate._clock import Clock, SystemClock, iso, parse_iso
from plangate.accounts import Accounts
from plangate.errors import GovernanceError, UsageError
from plangate.policy import Policy
from plangate.store import ApprovalRow, CheckRecord, Event, Store


@dataclass(frozen=True, kw_only=True)
class Entry:
    category: str
    auto: bool
    changed_by: str
    changed_at: str
    reason: str


class Register:
    def __init__(self, store: Store, clock: Clock | None = None) -> None:
        self.store = store
        self.clock = clock or SystemClock()

    def get(self, category: str) -> Entry | None:
        """The entry for ``category``, as the audit log records its last change (the table only mirrors it)."""
        return self._entries().get(category)

    def _entries(self) -> dict[str, Entry]:
        """Every category's last change, from the register's events, each checked under the audit key.

        A register row changed, added or deleted in the database changes nothing here; an
        event changed there is refused (:class:`~plangate.errors.StoreError`).
        """
        entries: dict[str, Entry] = {}
        for event in self.store.verified_events("register.changed"):
            category = str(event.data["category"])
            entries[category] = Entry(
                category=category,
                auto=bool(event.data["auto"]),
                changed_by=event.actor,
                changed_at=event.at,
                reason=str(event.data["reason"]),
            )
        return entries

    def holding(self, category: str) -> str | None:
        """Why the register holds ``category`` for people; None where it does not (no entry, or cleared)."""
        entry = self.get(category)
        if entry is None or entry.auto:
            return None
        return f"the auto-approval register holds category {category!r} for people ({entry.reason})"

    def hold(self, category: str, checked: CheckRecord) -> CheckRecord:
        """The check, with an automatic approval turned into a person's when the register holds the category."""
        decision = checked.policy
        if decision is None or decision["approval"] != "auto":
            return checked
        held = self.holding(category)
        if held is None:
            return checked
        return replace(checked, policy={**decision, "approval": "human", "reasons": [*decision["reasons"], held]})

    def all(self) -> list[Entry]:
        return [entry for _, entry in sorted(self._entries().items())]

    def set(
        self, category: str, auto: bool, *, by: str, reason: str, policy: Policy | None = None, force: bool = False
    ) -> Entry:
        """Clear (or stop clearing) a category for automatic approval; governance only, with a reason.

        Turning a category on that ``policy`` never approves automatically is refused unless
        ``force``: the register would say "on" for plans that always wait for a person.
        """
        user = Accounts(self.store).active(by)
        if user is None or user.role != "governance":
            raise GovernanceError(
                f"only governance may change the auto-approval register; {by} is "
                f"{user.role if user else 'not a known user'}"
            )
        never = policy.never_automatic(category) if auto and policy is not None else None
        if never is not None and not force:
            raise GovernanceError(
                f"{never}: turning it on would change nothing and mislead whoever reads the register; "
                "change the policy first, or force it"
            )
        _input.check_text(category, "category", what="register change")
        if not _input.check_text(reason, "reason", what="register change").strip():
            raise UsageError("say why the register changes (--reason)")
        at = iso(self.clock.now())
        entry = Entry(category=category, auto=auto, changed_by=by, changed_at=at, reason=reason)
        with self.store.transaction():
            self.store.append_event(
                plan_id=None,
                version=None,
                step_id=None,
                kind="register.changed",
                actor=by,
                at=at,
                data={"category": category, "auto": auto, "reason": reason},
            )
            self.store.command(
                "INSERT INTO register (category, auto, changed_by, changed_at, reason) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (category) DO UPDATE SET auto = excluded.auto, changed_by = excluded.changed_by,"
                " changed_at = excluded.changed_at, reason = excluded.reason",
                (category, int(auto), by, at, reason),
            )
        return entry


def _entry(row: tuple[Any, ...]) -> Entry:
    return Entry(category=row[0], auto=bool(row[1]), changed_by=row[2], changed_at=row[3], reason=row[4])


@dataclass(frozen=True, kw_only=True)
class CategoryStats:
    category: str
    plans: int
    approved: int
    rejected: int
    edited: int
    median_minutes: float | None
    candidate: bool

    @property
    def approval_rate(self) -> float | None:
        decided = self.approved + self.rejected
        return self.approved / decided if decided else None

    @property
    def edit_rate(self) -> float | None:
        return self.edited / self.plans if self.plans else None


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """The approvals report: each category's evidence, and the plans left out of it, each with why."""

    categories: tuple[CategoryStats, ...]
    left_out: tuple[tuple[str, str], ...]
    """``(plan ID, why)``: a plan whose audit events do not verify (or a row no event records). While any plan is
    left out, no category is a candidate: the one it belongs to cannot be known."""

    @property
    def named(self) -> list[str]:
        """Each plan left out, as ``plan ID: why`` (to whoever may see every plan: see the dashboard's register)."""
        return [f"plan {plan_id}: {why}" for plan_id, why in self.left_out]


@dataclass(frozen=True)
class _Plan:
    """One plan of the window as its verified events tell it."""

    category: str
    submitted: str
    edited: bool
    first: ApprovalRow | None
    """The first decision a person made on it (any version), if any."""


def report(store: Store, *, days: int = 90, min_plans: int = 5, clock: Clock | None = None) -> Evidence:
    """Per category over the last ``days``: the evidence for (or against) automatic approval.

    Read from each plan's own audit events, verified under the key, never from the plans or
    approvals tables, which anyone who can write the database can change. A plan whose events
    do not verify is left out and named; its category cannot be known, so while any plan is
    left out no category is a candidate.
    """
    since = iso((clock or SystemClock()).now() - timedelta(days=days))
    categories: dict[str, list[_Plan]] = {}
    left_out: list[tuple[str, str]] = []
    with store.snapshot():
        for plan_id, events, broken in store.plans_events(_in_window(store, since)):
            if broken is not None or not events:
                left_out.append((plan_id, _unverified(broken)))
            elif (plan := _plan(plan_id, events)) is not None and plan.submitted >= since:
                categories.setdefault(plan.category, []).append(plan)
    stats = (_stats(name, plans, min_plans, complete=not left_out) for name, plans in sorted(categories.items()))
    return Evidence(categories=tuple(stats), left_out=tuple(left_out))


def _in_window(store: Store, since: str) -> list[str]:
    """The plans submitted since ``since``, by their first event or by their row: a plan dated out of the window
    in one of them (which breaks its event's hash) is still read, and left out if it does not verify."""
    rows = store.query(
        "SELECT plan_id FROM events WHERE plan_prev = ? AND kind = 'plan.submitted' AND at >= ?"
        " UNION SELECT id FROM plans WHERE kind = 'plan' AND created_at >= ? ORDER BY 1",
        (audit.GENESIS, since, since),
    )
    return [str(row[0]) for row in rows]


def _unverified(broken: str | None) -> str:
    if broken is None:
        return "a row in plans that no audit event records"
    return f"its audit events do not verify ({broken}); see plangate audit verify"


def _plan(plan_id: str, events: list[Event]) -> _Plan | None:
    """The plan as its events tell it; None for a ReAct run."""
    story = ledger.fold(plan_id, events)
    if story.kind != "plan" or story.category is None:
        return None
    first = next((d for d in story.decisions if d.kind == "person"), None)
    return _Plan(category=story.category, submitted=events[0].at, edited=story.current > 1, first=first)


def _stats(category: str, plans: list[_Plan], min_plans: int, *, complete: bool) -> CategoryStats:
    decided = [(plan.first, plan) for plan in plans if plan.first is not None]
    approved = sum(1 for decision, _ in decided if decision.decision == "approved")
    rejected = len(decided) - approved
    edited = sum(1 for plan in plans if plan.edited)
    waits = [(parse_iso(d.at) - parse_iso(plan.submitted)).total_seconds() / 60 for d, plan in decided]
    return CategoryStats(
        category=category,
        plans=len(plans),
        approved=approved,
        rejected=rejected,
        edited=edited,
        median_minutes=statistics.median(waits) if waits else None,
        candidate=complete and len(decided) >= min_plans and rejected == 0 and edited == 0,
    )
