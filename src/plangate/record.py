"""What callers get back about a plan: its record, and the claim on a run that has started."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from plangate.errors import InputError
from plangate.plan import Plan
from plangate.policy import Policy
from plangate.store import PlanRow, PlanStatus, StepRow, VersionRow
from plangate.violations import Violation


@dataclass(frozen=True, kw_only=True)
class PlanRecord:
    """A submitted plan as the store knows it: identity, status, and what it still needs."""

    id: str
    version: int
    hash: str
    status: PlanStatus
    task: str
    category: str
    requested_by: str
    role: str | None
    plan: Plan | None
    violations: tuple[Violation, ...] = ()
    decision: dict[str, Any] | None = None
    needs: tuple[str, ...] = ()
    kind: str = "plan"
    action: dict[str, Any] | None = None
    purged: str | None = None
    """When a retention purge removed the plan's payloads (its text among them: ``plan`` is then None)."""

    @classmethod
    def of(cls, plan: PlanRow, version: VersionRow | None, needs: Sequence[str] = ()) -> PlanRecord:
        """The record of a plan from its rows (``version`` None: a ReAct run with no pending action)."""
        record = cls(
            id=plan.id,
            version=plan.version,
            hash=plan.hash,
            status=plan.status,
            task=plan.task,
            category=plan.category,
            requested_by=plan.requested_by,
            role=plan.role,
            kind=plan.kind,
            plan=None,
            purged=plan.purged_at,
        )
        if version is None:
            return record
        return replace(
            record,
            plan=None if plan.kind == "react" or plan.purged_at else Plan.parse(version.body),
            violations=tuple(Violation(**v) for v in version.check.violations),
            decision=version.check.policy,
            needs=tuple(needs),
            action=version.check.action,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "version": self.version,
            "hash": self.hash,
            "status": self.status,
            "task": self.task,
            "category": self.category,
            "requested_by": self.requested_by,
            "role": self.role,
            "kind": self.kind,
            "needs": list(self.needs),
            "violations": [v.to_dict() for v in self.violations],
            "policy": self.decision,
            "plan": self.plan.data() if self.plan else None,
            "action": self.action,
            "purged": self.purged,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlanRecord:
        """The record as :meth:`to_dict` gave it (the JSON API's reply), for a client to show as a local one.

        The plan's hash is computed again here: a reply whose plan is not the one its hash
        names is refused, so what a remote reviewer reads is what the hash they approve covers.
        """
        plan = Plan.parse(data["plan"]) if data.get("plan") else None
        if plan is not None and plan.hash != data["hash"]:
            raise InputError(f"the reply's plan {data['id']} does not match its hash {str(data['hash'])[:12]}…")
        return cls(
            id=data["id"],
            version=data["version"],
            hash=data["hash"],
            status=data["status"],
            task=data["task"],
            category=data["category"],
            requested_by=data["requested_by"],
            role=data.get("role"),
            plan=plan,
            violations=tuple(Violation(**v) for v in data.get("violations", ())),
            decision=data.get("policy"),
            needs=tuple(data.get("needs", ())),
            kind=data.get("kind", "plan"),
            action=data.get("action"),
            purged=data.get("purged"),
        )

    def __str__(self) -> str:
        what = "ReAct run" if self.kind == "react" else "plan"
        text = f"{what} {self.id} v{self.version} {self.hash[:12]}: {self.status}"
        if self.purged:
            text += f" (payloads purged on {self.purged[:10]})"
        if self.status == "pending_approval" and self.needs:
            text += f" (needs approval by {' and by '.join(self.needs)})"
        if self.violations:
            text += f" ({len(self.violations)} violation{'s' if len(self.violations) != 1 else ''})"
        return text


@dataclass(frozen=True, kw_only=True)
class Claim:
    """A run that has started: the plan as claimed, the exact plan text, and who holds the lease."""

    plan: PlanRow
    body: Plan
    policy: Policy | None
    owner: str
    """The lease's owner: the name the run was given (or made for it), with a token of this claim's own."""
    actor: str
    rows: Mapping[int, StepRow] | None = None
    """The plan's step rows as the claim read them and held against its audit log (None: not read)."""
    failed: tuple[int, ...] = ()
    """Steps whose failure the run this claim takes over recorded before it died, with no halt after it:
    the run halts on them, as that run would have, and does not call them again (see :func:`ledger.unhalted`)."""
