"""The approval rules: who may decide on a plan version, and when it counts as approved.

Pure functions over stored records; the runtime applies them inside one transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from plangate.errors import SelfApprovalError, StaleHashError, StateError
from plangate.store import ApprovalRow, PlanRow, VersionRow

A_PERSON = "a person"


def missing(decision: dict[str, Any] | None, approvals: Sequence[ApprovalRow]) -> list[str]:
    """What the current version still needs: ``a person`` and any named approvals.

    Without a policy decision a person must approve; a decision of ``auto`` needs nobody.
    Each name in ``required_approvals`` must be met by an approval from that role.
    """
    standing = [a for a in approvals if not a.void and a.decision == "approved"]
    needs: list[str] = []
    if (decision is None or decision.get("approval") != "auto") and not any(a.kind == "person" for a in standing):
        needs.append(A_PERSON)
    roles = {a.role for a in standing if a.kind == "person"}
    needs.extend(name for name in (decision or {}).get("required_approvals", []) if name not in roles)
    return needs


def check_can_decide(plan: PlanRow, version: VersionRow, actor: str, plan_hash: str | None) -> None:
    """Refuse a decision on a plan that is not waiting for one, or on a version that is not current."""
    if plan.status in ("running", "succeeded", "halted"):
        raise StateError(f"plan {plan.id} is {plan.status}: it was already executed, there is nothing to decide")
    if plan_hash is not None and plan_hash != plan.hash:
        raise StaleHashError(
            f"the hash given ({plan_hash[:12]}…) is not plan {plan.id}'s current version v{plan.version} "
            f"({plan.hash[:12]}…): review v{plan.version} and decide on its hash"
        )


def check_can_approve(plan: PlanRow, version: VersionRow, approver: str, approvals: Sequence[ApprovalRow]) -> None:
    """Refuse self-approval, approving a rejected plan, and approving the same version twice."""
    if plan.status == "rejected":
        raise StateError(f"plan {plan.id} v{plan.version} is rejected; edit it (a new version) to submit it again")
    if plan.status == "approved":
        raise StateError(f"plan {plan.id} v{plan.version} is already approved")
    if approver == plan.requested_by:
        raise SelfApprovalError(f"{approver} requested plan {plan.id} and may not approve it")
    if approver == version.author:
        raise SelfApprovalError(f"{approver} wrote version v{version.version} of plan {plan.id} and may not approve it")
    if any(a.actor == approver and not a.void and a.decision == "approved" for a in approvals):
        raise StateError(f"{approver} has already approved plan {plan.id} v{plan.version}")
