"""The approval rules: who may decide on a plan version, and when it counts as approved.

Pure functions over stored records; the runtime applies them inside one transaction.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from typing import Any, get_args

from plangate.errors import GovernanceError, SelfApprovalError, StaleHashError, StateError
from plangate.names import canonical, same_person
from plangate.policy import Policy
from plangate.store import ApprovalRow, PlanRow, PlanStatus

A_PERSON = "a person"


def missing(
    decision: dict[str, Any] | None, approvals: Sequence[ApprovalRow], policy: Policy | None = None
) -> list[str]:
    """What the current version still needs: ``a person`` and any named approvals.

    Without a policy decision a person must approve; a decision of ``auto`` needs nobody.
    Each name in ``required_approvals`` must be met by an approval from that role; given
    ``policy`` (the one in force), only by someone it still gives that role: an approver
    moved out of a role since they decided counts as a person, no longer in the role.
    """
    standing = [a for a in approvals if not a.void and a.decision == "approved"]
    needs: list[str] = []
    if (decision is None or decision.get("approval") != "auto") and not any(a.kind == "person" for a in standing):
        needs.append(A_PERSON)
    roles = {a.role for a in standing if a.kind == "person" and (policy is None or role_of(policy, a.actor) == a.role)}
    needs.extend(name for name in (decision or {}).get("required_approvals", []) if name not in roles)
    return needs


def held_role(policy: Policy | None, user: str, claimed: str | None = None) -> str | None:
    """The role ``user`` acts in: the one the policy gives them. A claim may only name it.

    Roles come from the policy's ``users`` mapping (or its ``default_role``), never from
    what someone says about themselves: claiming a role the user does not hold is refused.
    """
    held = role_of(policy, user)
    if claimed is None or claimed == held:
        return held
    if policy is None:
        raise GovernanceError(f"{user} claims role {claimed!r}, but no policy is in force to give anyone a role")
    holds = f"holds role {held!r}" if held else "holds no role"
    raise GovernanceError(f"{user} {holds} under policy {policy.name!r}, not {claimed!r}: a role cannot be claimed")


def role_of(policy: Policy | None, user: str) -> str | None:
    if policy is None:
        return None
    return policy.users.get(canonical(user)) or policy.default_role


_AFTER_A_RUN = frozenset(get_args(PlanStatus)) - {"pending_approval", "approved", "rejected"}


def check_can_decide(plan: PlanRow, actor: str, plan_hash: str | None, version: int | None = None) -> None:
    """Refuse a decision on a plan that is not waiting for one, or on a version that is not current.

    ``version``, when given, must be the current one too: an edit that restores an earlier
    version's text gives it that version's hash again, and a decision sent for the earlier
    version (a chat button) is not one on the new version.
    """
    if plan.status in _AFTER_A_RUN:
        raise StateError(f"plan {plan.id} is {plan.status}: it was already executed, there is nothing to decide")
    if version is not None and version != plan.version:
        raise StaleHashError(
            f"the decision was sent for version v{version} of plan {plan.id}, whose current version is "
            f"v{plan.version}: review v{plan.version} and decide on it"
        )
    if plan_hash is not None and plan_hash != plan.hash:
        given, current = apart(plan_hash, plan.hash)
        if plan.hash.startswith(plan_hash):
            raise StaleHashError(
                f"the hash given ({given}) is only the start of plan {plan.id}'s current version v{plan.version} "
                f"({current}): give the whole hash"
            )
        raise StaleHashError(
            f"the hash given ({given}) is not plan {plan.id}'s current version v{plan.version} "
            f"({current}): review v{plan.version} and decide on its hash"
        )


def apart(given: str, current: str, least: int = 12) -> tuple[str, str]:
    """The two hashes cut to the shortest prefix (at least ``least`` characters) at which they differ."""
    shorter = min(len(given), len(current))
    same = next((i for i in range(shorter) if given[i] != current[i]), shorter)
    width = max(least, same + 1)

    def cut(text: str) -> str:
        return text if len(text) <= width else text[:width] + "…"

    return cut(given), cut(current)


def check_can_approve(plan: PlanRow, authors: Set[str], approver: str, approvals: Sequence[ApprovalRow]) -> None:
    """Refuse self-approval (the requester, or an author of any version), approving a rejected
    plan, and approving the same version twice."""
    if plan.status == "rejected":
        raise StateError(f"plan {plan.id} v{plan.version} is rejected; edit it (a new version) to submit it again")
    if plan.status == "approved":
        raise StateError(f"plan {plan.id} v{plan.version} is already approved")
    _check_four_eyes(plan, authors, approver, "approve")
    if any(same_person(a.actor, approver) and not a.void and a.decision == "approved" for a in approvals):
        raise StateError(f"{approver} has already approved plan {plan.id} v{plan.version}")


def check_may_decide(plan: PlanRow, authors: Set[str], actor: str, policy: Policy | None, doing: str) -> None:
    """Settling or undoing a step is a decision like an approval: the same people may make it."""
    _check_four_eyes(plan, authors, actor, doing)
    if policy is not None and (policy.users or policy.default_role) and role_of(policy, actor) is None:
        raise GovernanceError(f"{actor} holds no role under policy {policy.name!r} and may not {doing} plan {plan.id}")


def _check_four_eyes(plan: PlanRow, authors: Set[str], actor: str, doing: str) -> None:
    if same_person(actor, plan.requested_by):
        raise SelfApprovalError(f"{actor} requested plan {plan.id} and may not {doing} it")
    if any(same_person(actor, author) for author in authors):
        raise SelfApprovalError(f"{actor} wrote a version of plan {plan.id} and may not {doing} it")
