"""The declarative policy: YAML rules held against a plan before anyone approves it.

Evaluation is a pure function of (plan, catalogue, policy, requester) that returns every
violation, plus the approval decision: whether a person must approve, and why. The
format is documented, with an example of every rule, in ``docs/policy.md``.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from plangate import _input, names
from plangate._frozen import Frozen, cached
from plangate._justified import Justified
from plangate._overrides import ToolOverride
from plangate._patterns import REMEMBERED, matches_any, star_match
from plangate._valuerules import RULE_NAME, DenyRule, RequireRule, plan_meter, value_violations
from plangate.errors import PolicyError, RefusedInputError
from plangate.graph import PlanGraph
from plangate.plan import Plan, Step, canonical
from plangate.tools import Catalogue, Effect, Tool
from plangate.tools._tool import problems
from plangate.violations import Violation

POLICY_FORMAT = 1
MAX_POLICY_BYTES = 1_048_576
Approval = Literal["human", "auto"]

POLICY_RULES: dict[str, str] = {
    "max-steps": "the plan has more steps than limits.max_steps",
    "max-external-calls": "more steps call outside than limits.max_external_calls",
    "tool-timeout": "the step's tool declares a timeout over limits.max_tool_timeout",
    "tool-retries": "the step's tool declares more retries than limits.max_retries",
    "unknown-role": "the requester has no role, or one the policy does not define",
    "tool-not-allowed": "the requester's role may not use the step's tool",
    "missing-scope": "the tool needs a scope the requester's role does not hold",
    "resource-conflict": "in a dataflow-order plan, two steps write the same resource and neither waits for the other",
    "deny:NAME": "a parameter value matches the deny rule NAME's pattern",
    "require:NAME": "a parameter value fails the require rule NAME's check (sql: read-only, decided by SQLite)",
    "sequence:NAME": "a step the sequence rule NAME forbids comes after (or uses) a step it names",
    "unknown-category": "the plan's category is not one the policy's categories define",
    "category-envelope": "the step's tool is outside what its category may do (tools, effects, external calls)",
}


class _Rules(Frozen):
    pass


class StepMatch(_Rules):
    """Which steps a rule is about; every field given must hold."""

    tools: tuple[str, ...] | None = None
    tags: tuple[str, ...] | None = None
    effects: tuple[Effect, ...] | None = None
    external: bool | None = None
    resources: tuple[str, ...] | None = None

    @cached
    def answers(self) -> dict[tuple[str, Tool | None, str | None], bool]:
        """Answers already given: a matcher sees the same few tools over and over."""
        return {}

    def matches(self, step: Step, tool: Tool | None, resource: str | None) -> bool:
        key = (step.tool, tool, resource)
        answer = self.answers.get(key)
        if answer is None:
            answer = self._matches(step, tool, resource)
            if len(self.answers) < 4096 and (resource is None or len(resource) <= REMEMBERED):
                self.answers[key] = answer
        return answer

    def _matches(self, step: Step, tool: Tool | None, resource: str | None) -> bool:
        if self.tools is not None and not matches_any(self.tools, step.tool):
            return False
        if tool is None:
            return (
                self.tools is not None and not (self.tags or self.effects or self.resources) and self.external is None
            )
        if self.tags is not None and not any(tag in tool.tags for tag in self.tags):
            return False
        if self.effects is not None and tool.effect not in self.effects:
            return False
        if self.external is not None and tool.external != self.external:
            return False
        return self.resources is None or (resource is not None and matches_any(self.resources, resource))


class Role(Justified):
    tools: tuple[str, ...] = Field(default=("*",), description="Tool name patterns this role may use.")
    scopes: tuple[str, ...] = Field(default=(), description="Scopes held; patterns such as 'invoices:*'.")
    description: str | None = None


class Limits(Justified):
    max_steps: int | None = Field(default=None, ge=1)
    max_external_calls: int | None = Field(default=None, ge=0)
    tool_timeout: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="Seconds a call may take when its tool declares none."
    )
    max_tool_timeout: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="The most seconds a tool may declare, or be given."
    )
    max_retries: int | None = Field(default=None, ge=0, description="The most retries a tool may declare.")

    @model_validator(mode="after")
    def _default_under_ceiling(self) -> Limits:
        default, ceiling = self.tool_timeout, self.max_tool_timeout
        if default is not None and ceiling is not None and default > ceiling:
            raise ValueError(
                f"tool_timeout {default:g} is over max_tool_timeout {ceiling:g}: the default breaks the ceiling"
            )
        return self


class SequenceRule(Justified):
    name: str = Field(pattern=RULE_NAME)
    after: StepMatch
    forbid: StepMatch
    scope: Literal["order", "dataflow"] = "order"
    unless_approved_by: str | None = None
    message: str | None = None


class Envelope(Justified):
    """What the plans of one category may do.

    A plan's category is its requester's own label, and approval rules key on it; the
    envelope is what keeps a lenient category from being borrowed for work it was never
    meant for. ``tools`` and ``effects`` are allow-lists (both must hold when both are
    given); ``external: false`` refuses every tool that calls outside.
    """

    tools: tuple[str, ...] | None = Field(default=None, min_length=1, description="Tool name patterns allowed.")
    effects: tuple[Effect, ...] | None = Field(default=None, min_length=1, description="Tool effects allowed.")
    external: bool = Field(default=True, description="false: no step may use an external tool.")
    description: str | None = None

    @model_validator(mode="after")
    def _says_something(self) -> Envelope:
        if self.tools is None and self.effects is None:
            raise ValueError("an envelope needs tools or effects (tools: ['*'] allows every tool)")
        return self

    @cached
    def named_tools(self) -> tuple[str, ...]:
        """The tool patterns with literal text in them: only these clear a write for automatic approval."""
        return tuple(p for p in self.tools or () if _WILDCARDS.sub("", p))

    def breach(self, tool: Tool) -> str | None:
        """Why a step using ``tool`` is outside this envelope, in words; None when it is inside."""
        if self.tools is not None and not matches_any(self.tools, tool.name):
            return f"may use only the tools {', '.join(self.tools)}; {tool.name!r} ({tool.effect}) is not one of them"
        limits, facts = [], []
        if self.effects is not None and tool.effect not in self.effects:
            limits.append(f"allows only {' or '.join(self.effects)} tools")
            facts.append(f"is {tool.effect}")
        if not self.external and tool.external:
            limits.append("allows no external calls")
            facts.append("calls outside")
        return f"{' and '.join(limits)}; {tool.name!r} {' and '.join(facts)}" if limits else None


class Budgets(Justified):
    """Caps on what planning may cost, in US dollars (prices from the price table)."""

    per_plan_usd: float | None = Field(default=None, ge=0)
    per_day_usd: float | None = Field(default=None, ge=0)


class CompensationRules(Justified):
    on_halt: Literal["manual", "auto"] = Field(
        default="manual", description="auto: roll back a plan's completed steps as soon as it halts on a failure."
    )


class ResourceRules(Justified):
    exclusive_writes: bool = True


RETENTION_FLOOR_DAYS = 90
"""No purge removes the payloads of plans whose last event is younger than this; a policy may only raise it."""


class RetentionRules(Justified):
    min_days: int = Field(
        default=RETENTION_FLOOR_DAYS,
        ge=RETENTION_FLOOR_DAYS,
        description=f"The fewest days a finished plan's payloads are kept (at least {RETENTION_FLOOR_DAYS}).",
    )


class ApprovalRules(Justified):
    default: Approval = "human"
    auto: tuple[str, ...] = Field(default=(), description="Categories that may be approved automatically.")
    human: tuple[str, ...] = Field(default=(), description="Categories that always need a person.")
    escalate: tuple[Effect, ...] = Field(default=("irreversible",), description="Effects that always need a person.")


class Policy(_Rules):
    """A parsed, validated policy. Load one with :meth:`Policy.load` or :meth:`Policy.from_yaml`."""

    version: Literal[1] = Field(description="Policy format version.")
    name: str = Field(min_length=1, max_length=200)
    revision: str | None = Field(default=None, description="The policy's own version label.")
    description: str | None = None
    limits: Limits = Field(default_factory=Limits)
    roles: dict[str, Role] = Field(default_factory=dict)
    users: dict[str, str] = Field(default_factory=dict, description="User name -> role.")
    default_role: str | None = None
    deny: list[DenyRule] = Field(default_factory=list)
    require: list[RequireRule] = Field(
        default_factory=list, description="Checks parameter values must pass: an allow-list where deny is a deny-list."
    )
    sequences: list[SequenceRule] = Field(default_factory=list)
    resources: ResourceRules = Field(default_factory=ResourceRules)
    approval: ApprovalRules = Field(default_factory=ApprovalRules)
    categories: dict[str, Envelope] | None = Field(
        default=None, description="Category -> what its plans may do; when given, no other category is accepted."
    )
    budgets: Budgets = Field(default_factory=Budgets)
    compensation: CompensationRules = Field(default_factory=CompensationRules)
    retention: RetentionRules | None = Field(
        default=None, description="How long finished plans' payloads are kept at least (plangate retention purge)."
    )
    tools: dict[str, ToolOverride] | None = Field(
        default=None,
        description="Tool name pattern -> what the policy says the tool is (effect, idempotent, external, scopes, "
        "resource, untrusted_output), over its own metadata or an MCP server's hints.",
    )

    @field_validator("users")
    @classmethod
    def _one_name_per_person(cls, users: dict[str, str]) -> dict[str, str]:
        """Names as plangate compares them (``Alice`` and ``alice `` are one); a person listed twice is refused."""
        canonical_users: dict[str, str] = {}
        for user, role in users.items():
            name = names.canonical(user)
            if name in canonical_users:
                raise ValueError(f"user {user!r} is listed twice (names are compared case-folded and stripped)")
            canonical_users[name] = role
        return canonical_users

    @model_validator(mode="after")
    def _consistent(self) -> Policy:
        known = set(self.roles)
        for user, role in self.users.items():
            if role not in known:
                raise ValueError(f"user {user!r} has role {role!r}, which is not under roles")
        if self.default_role is not None and self.default_role not in known:
            raise ValueError(f"default_role {self.default_role!r} is not under roles")
        rule_names = [r.name for r in self.deny] + [r.name for r in self.require] + [r.name for r in self.sequences]
        dupes = sorted({n for n in rule_names if rule_names.count(n) > 1})
        if dupes:
            raise ValueError(f"rule names must be unique; repeated: {', '.join(dupes)}")
        return self

    @classmethod
    def from_yaml(cls, text: str, source: str = "policy") -> Policy:
        """A policy from YAML text: no anchors, aliases or duplicate keys (see ``plangate._input``)."""
        if len(text) > MAX_POLICY_BYTES:
            raise PolicyError(f"{source}: too-large: {len(text)} characters is over the limit of {MAX_POLICY_BYTES}")
        try:
            data = _input.load_yaml(text, what=source)
        except RefusedInputError as exc:
            raise PolicyError(str(exc)) from None
        return cls.from_data(data, source)

    @classmethod
    def from_data(cls, data: Any, source: str = "policy") -> Policy:
        if not isinstance(data, dict):
            raise PolicyError(f"{source}: a policy is a mapping with at least 'version' and 'name'")
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            lines = [f"  {p}" for p in problems(exc.errors(include_url=False))]
            raise PolicyError("\n".join([f"{source}: not a valid policy:", *lines])) from None

    @classmethod
    def recorded(cls, store: Any, policy_hash: str | None, current: Policy | None = None) -> Policy | None:
        """The policy a version was checked against, as the store recorded it (``current`` when it is the same)."""
        if policy_hash is None:
            return None
        if current is not None and current.hash == policy_hash:
            return current
        text = store.policy_text(policy_hash)
        return cls.from_data(json.loads(text), source=f"policy {policy_hash[:12]}") if text else None

    @classmethod
    def load(cls, path: str | Path) -> Policy:
        """A policy from a YAML file: a regular file of at most 1 MiB, read without ever blocking."""
        try:
            text = _input.read_text(path, what="policy", limit=MAX_POLICY_BYTES)
        except RefusedInputError as exc:
            raise PolicyError(str(exc)) from None
        return cls.from_yaml(text, source=str(path))

    def canonical_json(self) -> str:
        data = self.model_dump(mode="json")
        for key in ("retention", "tools"):  # a policy that says nothing of them keeps the hash it always had
            if data[key] is None:
                del data[key]
        return canonical(data)

    @cached
    def hash(self) -> str:
        """SHA-256 of the policy's canonical JSON form: recorded with every decision."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def category_envelope(self, name: str) -> Envelope | None:
        """What plans of category ``name`` may do; None when the policy does not say.

        Without an envelope a category may still be cleared for automatic approval, but
        only for plans that do nothing but read.
        """
        return (self.categories or {}).get(name)

    def auto_approves(self, category: str, tool: Tool) -> bool:
        """Whether a step using ``tool`` may go without a person in a plan of ``category``.

        The category must be cleared for automatic approval, the tool's effect must not
        escalate, and a tool that writes must be named in the category's envelope: being
        cleared makes a category read-only unless its envelope names the writes it may do.
        """
        if not _cleared(self.approval, category) or tool.effect in self.approval.escalate:
            return False
        return tool.effect == "read" or _named(self, category, tool)

    def never_automatic(self, category: str) -> str | None:
        """Why no plan of ``category`` is ever approved without a person under this policy; None if some may be."""
        if self.categories is not None and category not in self.categories:
            return f"category {category!r} is not defined in policy {self.name!r}, so its plans are rejected"
        if matches_any(self.approval.human, category):
            return f"policy {self.name!r} sends category {category!r} to a person (approval.human)"
        if not _cleared(self.approval, category):
            return f"policy {self.name!r} does not clear category {category!r} (not in approval.auto; default human)"
        return None

    def call_violations(self, step: Step, tool: Tool, params: Mapping[str, Any]) -> list[Violation]:
        """The deny and require rules held against a step's parameters as resolved just before the call.

        At check time a reference's value is unknown; the engine calls this with the
        values references brought in, so neither a denied pattern nor a statement that
        writes can slip in through them.
        """
        resource = tool.resource_for(params)
        return list(value_violations(self.deny, self.require, step, params, resource, resolved=True))

    def evaluate(
        self,
        plan: Plan,
        catalogue: Catalogue,
        *,
        user: str | None = None,
        role: str | None = None,
        graph: PlanGraph | None = None,
    ) -> PolicyDecision:
        """Every violation of this policy, and whether a person must approve the plan."""
        return _Evaluation(self, plan, catalogue, graph or PlanGraph.of(plan), user, role).run()


@dataclass(frozen=True, kw_only=True)
class PolicyDecision:
    """What the policy said about one plan version."""

    policy: str
    revision: str | None
    policy_hash: str
    role: str | None
    violations: tuple[Violation, ...]
    approval: Approval
    reasons: tuple[str, ...]
    required_approvals: tuple[str, ...] = ()
    step_approvals: tuple[tuple[int, str], ...] = ()
    """Which step needs which named approval: (step id, role), for a caller that acts step by step."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "revision": self.revision,
            "policy_hash": self.policy_hash,
            "role": self.role,
            "approval": self.approval,
            "reasons": list(self.reasons),
            "required_approvals": list(self.required_approvals),
            "step_approvals": [list(pair) for pair in self.step_approvals],
            "violations": [v.to_dict() for v in self.violations],
        }


_WILDCARDS = re.compile(r"\[[^\]]*\]|[*?]")
"""What a shell-style pattern can match freely: ``*``, ``?`` and ``[...]`` sets."""


def _cleared(rules: ApprovalRules, category: str) -> bool:
    """Whether the approval rules let plans of ``category`` be approved automatically at all."""
    if matches_any(rules.human, category):
        return False
    return rules.default == "auto" or matches_any(rules.auto, category)


def _named(policy: Policy, category: str, tool: Tool) -> bool:
    """Whether the category's envelope names ``tool`` by more than a bare wildcard."""
    envelope = policy.category_envelope(category)
    return envelope is not None and matches_any(envelope.named_tools, tool.name)


def _resources_clash(a: str, b: str) -> bool:
    """Equal, or equal once a part only known at run time (``*``) takes the other's value."""
    return a == b or ("*" in a and star_match(a, b)) or ("*" in b and star_match(b, a))


@dataclass
class _Evaluation:
    policy: Policy
    plan: Plan
    catalogue: Catalogue
    graph: PlanGraph
    user: str | None
    role: str | None
    violations: list[Violation] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    named: list[tuple[int, str]] = field(default_factory=list)

    @cached_property
    def runs(self) -> PlanGraph:
        """What each step waits for in a dataflow plan: the steps it reads and those its ``after`` names."""
        return PlanGraph.of(self.plan, after=True)

    def run(self) -> PolicyDecision:
        steps = self.plan.steps
        tools = [self.catalogue.get(s.tool) for s in steps]
        resources = [t.resource_for(s.params) if t else None for s, t in zip(steps, tools, strict=True)]
        role = self._role()
        self._limits(tools)
        self._category(tools)
        if role is not None:
            self._role_rules(role, tools)
        self._deny(resources)
        if self.policy.resources.exclusive_writes:
            self._resource_conflicts(tools, resources)
        self._sequences(tools, resources)
        approval = self._approval(tools)
        return PolicyDecision(
            policy=self.policy.name,
            revision=self.policy.revision,
            policy_hash=self.policy.hash,
            role=role,
            violations=tuple(self.violations),
            approval=approval,
            reasons=tuple(self.reasons),
            required_approvals=tuple(dict.fromkeys(role for _, role in self.named)),
            step_approvals=tuple(dict.fromkeys(self.named)),
        )

    def _flag(self, rule: str, message: str, step: int | None = None) -> None:
        self.violations.append(Violation(rule=rule, message=message, step=step, source="policy"))

    def _role(self) -> str | None:
        policy = self.policy
        role = self.role or policy.users.get(names.canonical(self.user or "")) or policy.default_role
        if role is None and policy.roles:
            who = f"user {self.user!r}" if self.user else "the requester"
            self._flag("unknown-role", f"{who} has no role, and the policy has no default_role")
        elif role is not None and role not in policy.roles:
            self._flag("unknown-role", f"role {role!r} is not defined (roles: {', '.join(policy.roles) or 'none'})")
            return None
        return role

    def _limits(self, tools: list[Tool | None]) -> None:
        limits = self.policy.limits
        if limits.max_steps is not None and len(self.plan.steps) > limits.max_steps:
            self._flag("max-steps", f"the plan has {len(self.plan.steps)} steps; the limit is {limits.max_steps}")
        external = [s.id for s, t in zip(self.plan.steps, tools, strict=True) if t is not None and t.external]
        if limits.max_external_calls is not None and len(external) > limits.max_external_calls:
            self._flag(
                "max-external-calls",
                f"{len(external)} steps call outside (steps {_ids(external)}); "
                f"the limit is {limits.max_external_calls}",
            )
        self._call_limits(tools)

    def _call_limits(self, tools: list[Tool | None]) -> None:
        """A tool's own timeout and retries within the ceilings: refused before approval, never cut at run time."""
        limits = self.policy.limits
        for step, tool in zip(self.plan.steps, tools, strict=True):
            if tool is None:
                continue
            if limits.max_tool_timeout is not None and (tool.timeout or 0) > limits.max_tool_timeout:
                self._flag(
                    "tool-timeout",
                    f"tool {tool.name!r} declares a timeout of {tool.timeout:g} s; "
                    f"the policy's max_tool_timeout is {limits.max_tool_timeout:g} s",
                    step.id,
                )
            if limits.max_retries is not None and tool.retries > limits.max_retries:
                self._flag(
                    "tool-retries",
                    f"tool {tool.name!r} declares {tool.retries} retries; the policy's max_retries is "
                    f"{limits.max_retries}",
                    step.id,
                )

    def _category(self, tools: list[Tool | None]) -> None:
        """The plan's category must be one the policy knows, and every step inside its envelope."""
        categories = self.policy.categories
        name = self.plan.category
        if categories is None:
            return
        envelope = categories.get(name)
        if envelope is None:
            close = difflib.get_close_matches(name, list(categories), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            known = ", ".join(sorted(categories)) or "none"
            self._flag("unknown-category", f"category {name!r} is not defined (categories: {known}){hint}")
            return
        for step, tool in zip(self.plan.steps, tools, strict=True):
            why = envelope.breach(tool) if tool is not None else None  # an unknown tool: the checker says so
            if why is not None:
                self._flag("category-envelope", f"category {name!r} {why}", step.id)

    def _role_rules(self, name: str, tools: list[Tool | None]) -> None:
        role = self.policy.roles[name]
        for step, tool in zip(self.plan.steps, tools, strict=True):
            if not matches_any(role.tools, step.tool):
                self._flag("tool-not-allowed", f"role {name!r} may not use tool {step.tool!r}", step.id)
            elif tool is not None:
                missing = [s for s in tool.scopes if not matches_any(role.scopes, s)]
                if missing:
                    self._flag(
                        "missing-scope",
                        f"tool {step.tool!r} needs scope {', '.join(missing)}, which role {name!r} does not hold",
                        step.id,
                    )

    def _deny(self, resources: list[str | None]) -> None:
        policy = self.policy
        meter = plan_meter(lambda: len(self.plan.canonical_json()), len(policy.deny))  # one budget for the plan
        for step, resource in zip(self.plan.steps, resources, strict=True):
            self.violations.extend(
                value_violations(policy.deny, policy.require, step, step.params, resource, resolved=False, meter=meter)
            )

    def _resource_conflicts(self, tools: list[Tool | None], resources: list[str | None]) -> None:
        if self.plan.order != "dataflow":
            return  # in listed order every write waits for the steps before it: two never overlap
        writers = [  # (step, resource, declared): a write whose tool declares no resource may touch anything
            (step.id, "*" if resource is None else resource, resource is not None)
            for step, tool, resource in zip(self.plan.steps, tools, resources, strict=True)
            if tool is not None and tool.effect != "read"
        ]
        for index, (later, res_b, declared) in enumerate(writers):
            clashes = [
                e
                for e, res_a, _ in writers[:index]
                if _resources_clash(res_a, res_b) and not self.runs.ordered(e, later)
            ]
            if clashes:  # one violation per step, however many it clashes with: a plan's size never squares
                others = f" (and {len(clashes) - 1} more)" if len(clashes) > 1 else ""
                what = repr(res_b) if declared else "a resource (its tool declares none, so it may be any)"
                self._flag(
                    "resource-conflict",
                    f"steps {clashes[0]}{others} and {later} both write {what} and neither depends on the other, "
                    "so they could run at the same time; list one in the other's 'after'",
                    later,
                )

    def _sequences(self, tools: list[Tool | None], resources: list[str | None]) -> None:
        rows = list(zip(self.plan.steps, tools, resources, strict=True))
        # In a dataflow plan a step listed first may run last: only what it waits for is before it.
        runs = self.runs if self.plan.order == "dataflow" else None
        for rule in self.policy.sequences:
            seen: list[int] = []  # earlier steps that match the rule's `after`
            for index, (step, tool, resource) in enumerate(rows):
                if rule.forbid.matches(step, tool, resource):
                    culprits = seen
                    if rule.scope == "dataflow":
                        ancestors = self.graph.ancestors.get(step.id, frozenset())
                        culprits = [s for s in seen if s in ancestors]
                    elif runs is not None:
                        culprits = seen + [
                            later.id
                            for later, t, r in rows[index + 1 :]
                            if rule.after.matches(later, t, r) and step.id not in runs.ancestors.get(later.id, ())
                        ]
                    if culprits:
                        self._sequence_hit(rule, step, culprits)
                if rule.after.matches(step, tool, resource):
                    seen.append(step.id)

    def _sequence_hit(self, rule: SequenceRule, step: Step, culprits: list[int]) -> None:
        link = "uses the output of" if rule.scope == "dataflow" else "comes after"
        if rule.scope == "order" and self.plan.order == "dataflow":
            link = "may run after"
        text = rule.message or f"step {step.id} ({step.tool}) {link} step(s) {_ids(culprits)}"
        if link == "may run after" and not rule.message:
            text += " (the plan's order is dataflow)"
        if rule.unless_approved_by is None:
            self._flag(f"sequence:{rule.name}", text, step.id)
        else:
            self.named.append((step.id, rule.unless_approved_by))
            self.reasons.append(f"{text}: needs approval by {rule.unless_approved_by!r} (sequence:{rule.name})")

    def _approval(self, tools: list[Tool | None]) -> Approval:
        """Human unless the category is cleared and nothing escalates; every reason is kept.

        A cleared category still covers a step that writes only when the category's
        envelope names that tool: otherwise a requester could clear any write by
        labelling its plan with a cleared category.
        """
        rules = self.policy.approval
        category = self.plan.category
        cleared = _cleared(rules, category)
        if matches_any(rules.human, category):
            self.reasons.append(f"category {category!r} always needs a person")
        elif not cleared:
            self.reasons.append(f"category {category!r} is not cleared for automatic approval")
        covered = []
        for step, tool in zip(self.plan.steps, tools, strict=True):
            if tool is not None and tool.effect in rules.escalate:
                self.reasons.append(f"step {step.id} ({step.tool}) is {tool.effect}")
            elif tool is None or tool.effect == "read":
                continue
            elif _named(self.policy, category, tool):
                covered.append(f"step {step.id} ({step.tool}) is {tool.effect}, a tool its envelope names")
            elif cleared:
                self.reasons.append(self._unnamed_write(step, tool))
        if self.reasons:
            return "human"
        self.reasons += [f"category {category!r} is cleared for automatic approval", *covered]
        return "auto"

    def _unnamed_write(self, step: Step, tool: Tool) -> str:
        envelope = self.policy.category_envelope(self.plan.category)
        names = envelope.named_tools if envelope is not None else ()
        scope = f"read tools and the writes its envelope names ({', '.join(names)})" if names else "read-only plans"
        return (
            f"category {self.plan.category!r} is cleared for automatic approval only for {scope}; "
            f"step {step.id} ({step.tool}) is {tool.effect}"
        )


def _ids(ids: Sequence[int]) -> str:
    return ", ".join(str(i) for i in ids)
