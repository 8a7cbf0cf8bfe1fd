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
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from plangate import _input
from plangate._clock import Clock, SystemClock, iso, parse_iso
from plangate.accounts import Accounts
from plangate.errors import GovernanceError, UsageError
from plangate.policy import Policy
from plangate.store import CheckRecord, Store


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


def report(store: Store, *, days: int = 90, min_plans: int = 5, clock: Clock | None = None) -> list[CategoryStats]:
    """Per category over the last ``days``: the evidence for (or against) automatic approval."""
    since = iso((clock or SystemClock()).now() - timedelta(days=days))
    plans = store.query(
        "SELECT id, category, version, created_at FROM plans WHERE kind = 'plan' AND created_at >= ?", (since,)
    )
    decisions = store.query("SELECT plan_id, decision, at FROM approvals WHERE kind = 'person' ORDER BY at")
    first: dict[str, tuple[str, str]] = {}
    for plan_id, decision, at in decisions:
        first.setdefault(plan_id, (decision, at))
    out = []
    for category in sorted({row[1] for row in plans}):
        rows = [r for r in plans if r[1] == category]
        decided = [(first[r[0]], r) for r in rows if r[0] in first]
        approved = sum(1 for (decision, _), _ in decided if decision == "approved")
        rejected = len(decided) - approved
        edited = sum(1 for r in rows if r[2] > 1)
        waits = [(parse_iso(at) - parse_iso(r[3])).total_seconds() / 60 for (_, at), r in decided]
        out.append(
            CategoryStats(
                category=category,
                plans=len(rows),
                approved=approved,
                rejected=rejected,
                edited=edited,
                median_minutes=statistics.median(waits) if waits else None,
                candidate=len(decided) >= min_plans and rejected == 0 and edited == 0,
            )
        )
    return out
