"""Drift: the tools or the policy a plan was approved under are not the ones it would run under.

Each version records a fingerprint of the contracts of the tools it uses (effect, external,
idempotent, scopes, schemas) and the hash of the policy it was held against. Before a run
starts, :func:`recheck` compares them with the tools and the policy in force; when either
differs the plan is checked again, and the runtime records the new check and refuses the
run, or sends the plan back for approval, when the plan no longer passes or needs
approvals it lacks.
"""

from __future__ import annotations

from plangate.check import CheckResult, check
from plangate.errors import GovernanceError
from plangate.plan import Plan
from plangate.policy import Policy
from plangate.store import CheckRecord, PlanRow, VersionRow
from plangate.tools import Catalogue
from plangate.violations import Violation


def record(result: CheckResult, catalogue: Catalogue, plan: Plan, recheck: str | None = None) -> CheckRecord:
    """What to record of a check: its verdict, the policy's decision, and the tools' fingerprint."""
    data = result.to_dict()
    return CheckRecord(
        ok=data["ok"],
        violations=tuple(data["violations"]),
        policy=data["policy"],
        plan_hash=data["plan_hash"],
        catalogue=fingerprint(catalogue, plan),
        recheck=recheck,
    )


def fingerprint(catalogue: Catalogue, plan: Plan) -> str:
    """The contracts of the tools the plan uses: if they change, the plan is checked again."""
    return catalogue.fingerprint(step.tool for step in plan.steps)


def recheck(
    plan: PlanRow, version: VersionRow, body: Plan, catalogue: Catalogue, policy: Policy | None
) -> CheckRecord | None:
    """A new check when the tools' contracts or the policy differ from the version's; else None."""
    same_tools = version.check.catalogue == fingerprint(catalogue, body)
    same_policy = (policy.hash if policy else None) == version.policy_hash
    if same_tools and same_policy:
        return None
    changed = " and ".join(name for name, same in (("the tools", same_tools), ("the policy", same_policy)) if not same)
    result = check(body, catalogue, policy, user=plan.requested_by)  # the role this policy gives them
    return record(result, catalogue, body, recheck=f"{changed} changed since v{version.version} was checked")


def check_tools_module(
    plan: PlanRow, version: VersionRow, body: Plan, catalogue: Catalogue, module: str | None
) -> None:
    """Tools from another module than the one on record run the plan only if their contracts are the same."""
    if module is None or plan.tools is None or module == plan.tools:
        return
    if version.check.catalogue != fingerprint(catalogue, body):
        raise GovernanceError(
            f"plan {plan.id} was submitted with the tools of {plan.tools}; the tools of {module} "
            "differ in what the plan's tools do (effects, scopes or schemas), so they may not run it"
        )


def first_violation(checked: CheckRecord) -> str:
    found = list(checked.violations) or list((checked.policy or {}).get("violations") or [])
    return str(Violation(**found[0])) if found else "no violation was recorded"
