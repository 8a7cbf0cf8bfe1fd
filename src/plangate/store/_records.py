"""What the store holds, as plain records (the store's own rows, read back)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from plangate._patterns import matches_any
from plangate.names import canonical

PlanStatus = Literal[
    "rejected",
    "pending_approval",
    "approved",
    "running",
    "succeeded",
    "halted",
    "compensating",
    "compensated",
    "compensation_incomplete",
    "closed",
]
StepStatus = Literal["started", "succeeded", "failed", "failed_optional", "skipped", "outcome_unknown"]
"""``failed_optional``: a step whose ``on_failure`` is ``continue`` failed; its output is null and the plan went on."""
DONE: frozenset[str] = frozenset({"succeeded", "skipped", "failed_optional"})


@dataclass(frozen=True, kw_only=True)
class PlanRow:
    """A plan's identity and where it stands; its versions are :class:`VersionRow`."""

    id: str
    status: PlanStatus
    version: int
    hash: str
    task: str
    category: str
    requested_by: str
    role: str | None
    tools: str | None
    created_at: str
    updated_at: str
    kind: Literal["plan", "react"] = "plan"
    lease_owner: str | None = None
    lease_until: str | None = None
    purged_at: str | None = None
    """When a retention purge removed the plan's payloads (see :mod:`plangate.retention`)."""


@dataclass(frozen=True, kw_only=True)
class ReadScope:
    """The plans someone who may not read every plan may read: their own, and those of some categories."""

    requester: str
    """Their name, in canonical form: the plans whose ``requested_by`` is this name in that form."""
    categories: tuple[str, ...] = ()
    """Patterns (``refunds``, ``ref*``, ``*``): the plans of the categories they match."""

    def admits(self, *, category: str, requested_by: str) -> bool:
        return canonical(requested_by) == self.requester or matches_any(self.categories, category)


MAX_LISTED = 500
"""The most plans one page of a listing holds (the API's and the command line's ``limit``)."""


@dataclass(frozen=True, kw_only=True)
class PlanQuery:
    """Which plans a listing holds, in which order (:meth:`plangate.store.Store.list_plans`)."""

    status: str | None = None
    kind: str | None = None
    category: str | None = None
    scope: ReadScope | None = None
    """Only the plans it admits (None: every plan)."""
    order: Literal["oldest", "newest"] = "oldest"
    """By the time each plan was submitted (then by id)."""
    before: str | None = None
    """A plan's id: only the plans that come before it in time (to page on from the last one listed)."""
    after: str | None = None
    """A plan's id: only the plans that come after it in time."""


EVERY_PLAN = PlanQuery()
"""A listing of every plan, oldest first."""


@dataclass(frozen=True, kw_only=True)
class CheckRecord:
    """What the checker and the policy said about one version, as recorded with it (and in its event)."""

    ok: bool
    violations: tuple[dict[str, Any], ...] = ()
    policy: dict[str, Any] | None = None
    """The policy's decision (:meth:`plangate.policy.PolicyDecision.to_dict`), or None without a policy."""
    plan_hash: str | None = None
    catalogue: str | None = None
    """The fingerprint of the contracts of the tools the plan uses, when it was checked."""
    recheck: str | None = None
    """Why the version was checked again (the tools or the policy changed), if it was."""
    action: dict[str, Any] | None = None
    """A ReAct run's pending action."""

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"ok": self.ok, "violations": list(self.violations), "policy": self.policy}
        optional = {"plan_hash": self.plan_hash, "catalogue": self.catalogue, "recheck": self.recheck}
        data.update({name: value for name, value in {**optional, "action": self.action}.items() if value is not None})
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CheckRecord:
        return cls(**{**data, "violations": tuple(data.get("violations", ()))})

    @property
    def needs_person(self) -> bool:
        return self.policy is None or self.policy.get("approval") != "auto"


@dataclass(frozen=True, kw_only=True)
class VersionRow:
    """One version of a plan: its exact text, its author, and what the check and policy said."""

    plan_id: str
    version: int
    hash: str
    body: str
    author: str
    created_at: str
    check: CheckRecord
    policy_hash: str | None


@dataclass(frozen=True, kw_only=True)
class ApprovalRow:
    """A decision on one plan version, bound to its hash and the policy in force."""

    plan_id: str
    version: int
    plan_hash: str
    policy_hash: str | None
    decision: Literal["approved", "rejected"]
    actor: str
    role: str | None
    kind: Literal["person", "auto"]
    comment: str | None
    at: str
    void: bool = False


@dataclass(frozen=True, kw_only=True)
class StepRow:
    """The durable record of one step's execution."""

    plan_id: str
    step_id: int
    version: int
    status: StepStatus
    attempt: int
    idempotency_key: str
    params: Any = None
    output: Any = None
    error: str | None = None
    started_at: str | None = None
    finished_at: str | None = None


@dataclass(frozen=True, kw_only=True)
class Event:
    """One entry of the append-only, hash-chained audit log."""

    seq: int
    plan_id: str | None
    version: int | None
    step_id: int | None
    kind: str
    actor: str
    at: str
    data: dict[str, Any] = field(default_factory=dict)
    prev: str = ""
    hash: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "plan_id": self.plan_id,
            "version": self.version,
            "step_id": self.step_id,
            "kind": self.kind,
            "actor": self.actor,
            "at": self.at,
            "data": self.data,
            "prev": self.prev,
            "hash": self.hash,
        }


@dataclass(frozen=True, kw_only=True)
class CallRow:
    """One model call: what it was for, the budget it got, the tokens it used, what it cost."""

    id: str
    at: str
    plan_id: str | None
    task: str
    model: str
    purpose: str
    expected_steps: int | None
    budget: int | None
    effort: str | None
    input_tokens: int = 0
    output_tokens: int = 0
    thinking_tokens: int = 0
    cost: float | None = 0.0
    seconds: float = 0.0
    ok: bool = False
    """The defaults are a call as it starts: nothing used yet, not done."""
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class TemplateRow:
    """A plan saved for reuse, with typed slots filled from a new task's text."""

    name: str
    pattern: str
    slots: list[dict[str, Any]]
    body: str
    source_plan: str
    created_by: str
    created_at: str
