"""The declarative policy: YAML rules held against a plan before anyone approves it.

Evaluation is a pure function of (plan, catalogue, policy, requester) that returns every
violation, plus the approval decision: whether a person must approve, and why. The
format is documented, with an example of every rule, in ``docs/policy.md``.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import Field, ValidationError, field_validator, model_validator

from plangate import _input, names, provenance
from plangate._frozen import Frozen, FrozenDict, ReadOnly, cached
from plangate._justified import Justified
from plangate._overrides import ToolOverride
from plangate._patterns import REMEMBERED, matches_any, may_match_any
from plangate._valuerules import RULE_NAME, DenyRule, RequireRule, ValueRule, value_violations
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
    "sink:NAME": "a parameter the sink rule NAME guards takes data from a tool whose output is untrusted",
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
        if self.resources is None:
            return True
        if resource is None:
            return False
        # A part known only at run time ("*") may be anything: the rule holds if some value would match.
        return matches_any(self.resources, resource) or ("*" in resource and may_match_any(self.resources, resource))


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


class SinkRule(Justified):
    """Which parameters of which tools must not take untrusted data, and what happens when one does.

    ``untrusted``: ``deny`` (a violation, ``sink:NAME``), ``approve`` (a person must approve the
    plan; with ``approve: ROLE``, a person in that role) or ``allow``. ``control: true`` counts a
    step whose condition reads untrusted data as feeding every parameter the rule names.
    ``answer: true`` makes the rule guard the plan's answer (the text the user reads) instead of
    tools' parameters; no other rule guards the answer, which untrusted data reaches marked.
    """

    name: str = Field(pattern=RULE_NAME)
    tools: tuple[str, ...] = Field(default=("*",), min_length=1, description="Tool name patterns.")
    params: tuple[str, ...] = Field(default=("*",), min_length=1, description="Parameter name patterns.")
    untrusted: Literal["deny", "approve", "allow"] | None = Field(
        default=None, description="What untrusted data in one of these parameters leads to (default: deny)."
    )
    approve: str | None = Field(default=None, min_length=1, description="The role whose approval it then needs.")
    control: bool = Field(default=False, description="true: a condition over untrusted data feeds these too.")
    answer: bool = Field(default=False, description="true: the rule guards the plan's answer, not tools' parameters.")
    message: str | None = None

    @model_validator(mode="after")
    def _one_outcome(self) -> SinkRule:
        if self.approve is not None and self.untrusted not in (None, "approve"):
            raise ValueError(f"sink {self.name!r}: 'approve: {self.approve}' goes with 'untrusted: approve' only")
        if self.answer and (self.tools != ("*",) or self.params != ("*",) or self.control):
            raise ValueError(
                f"sink {self.name!r}: 'answer: true' guards the answer, so it takes no tools, params or control"
            )
        return self

    @property
    def outcome(self) -> Literal["deny", "approve", "allow"]:
        return self.untrusted or ("approve" if self.approve is not None else "deny")


DEFAULT_SINK = SinkRule(name="default", untrusted="approve")
"""Where no sink rule names a parameter: a person approves untrusted data into an external write or an irreversible."""


def default_sink(tool: Tool) -> bool:
    """Whether :data:`DEFAULT_SINK` guards ``tool``'s parameters: it cannot be undone, or writes outside."""
    return tool.effect == "irreversible" or (tool.external and tool.effect == "write")


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
    """A parsed, validated policy. Load one with :meth:`Policy.load` or :meth:`Policy.from_yaml`.

    Immutable all the way down (tuples, and mappings that refuse changes), because what it works
    out once (its hash, what it says of a step, its matchers' answers) must never disagree with
    its rules: a changed policy is a new one (``Policy.from_data``, ``model_copy(update=...)``).
    """

    version: Literal[1] = Field(description="Policy format version.")
    name: str = Field(min_length=1, max_length=200)
    revision: str | None = Field(default=None, description="The policy's own version label.")
    description: str | None = None
    limits: Limits = Field(default_factory=Limits)
    roles: ReadOnly[str, Role] = Field(default_factory=FrozenDict)
    users: ReadOnly[str, str] = Field(default_factory=FrozenDict, description="User name -> role.")
    default_role: str | None = None
    deny: tuple[DenyRule, ...] = ()
    require: tuple[RequireRule, ...] = Field(
        default=(), description="Checks parameter values must pass: an allow-list where deny is a deny-list."
    )
    sequences: tuple[SequenceRule, ...] = ()
    sinks: tuple[SinkRule, ...] | None = Field(
        default=None,
        description="Parameters that must not take untrusted data, and what happens when one does; "
        "the first rule that names a tool's parameter decides, else the default (see docs/injection.md).",
    )
    resources: ResourceRules = Field(default_factory=ResourceRules)
    approval: ApprovalRules = Field(default_factory=ApprovalRules)
    categories: ReadOnly[str, Envelope] | None = Field(
        default=None, description="Category -> what its plans may do; when given, no other category is accepted."
    )
    budgets: Budgets = Field(default_factory=Budgets)
    compensation: CompensationRules = Field(default_factory=CompensationRules)
    retention: RetentionRules | None = Field(
        default=None, description="How long finished plans' payloads are kept at least (plangate retention purge)."
    )
    tools: ReadOnly[str, ToolOverride] | None = Field(
        default=None,
        description="Tool name pattern -> what the policy says the tool is (effect, idempotent, external, scopes, "
        "resource, untrusted_output), over its own metadata or an MCP server's hints.",
    )

    @field_validator("users")
    @classmethod
    def _one_name_per_person(cls, users: dict[str, str]) -> FrozenDict[str, str]:
        """Names as plangate compares them (``Alice`` and ``alice `` are one); a person listed twice is refused."""
        canonical_users: dict[str, str] = {}
        for user, role in users.items():
            name = names.canonical(user)
            if name in canonical_users:
                raise ValueError(f"user {user!r} is listed twice (names are compared case-folded and stripped)")
            canonical_users[name] = role
        return FrozenDict(canonical_users)

    @model_validator(mode="after")
    def _consistent(self) -> Policy:
        known = set(self.roles)
        for user, role in self.users.items():
            if role not in known:
                raise ValueError(f"user {user!r} has role {role!r}, which is not under roles")
        if self.default_role is not None and self.default_role not in known:
            raise ValueError(f"default_role {self.default_role!r} is not under roles")
        rule_names = [r.name for r in self.deny] + [r.name for r in self.require] + [r.name for r in self.sequences]
        rule_names += [r.name for r in self.sinks or ()]
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

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Policy:
        """A copy; with ``update``, a new policy validated as a loaded one is (pydantic's copy takes it unchecked)."""
        if not update:
            return super().model_copy(deep=deep)
        kind = type(self)
        return kind.model_validate({**{name: getattr(self, name) for name in kind.model_fields}, **update})

    def canonical_json(self) -> str:
        data = self.model_dump(mode="json")
        for key in ("retention", "tools", "sinks"):  # a policy that says nothing of them keeps the hash it always had
            if data[key] is None:
                del data[key]
        for rule in data.get("sinks") or ():  # likewise a sink rule that does not guard the answer
            if not rule["answer"]:
                del rule["answer"]
        return canonical(data)

    @cached
    def hash(self) -> str:
        """SHA-256 of the policy's canonical JSON form: recorded with every decision."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    @cached
    def facts_kept(self) -> dict[_FactsKey, _StepFacts | None]:
        """What this policy says of a step by its role, category and tool (and resource): kept, plans repeat them.

        Keyed by immutable things only: the tool object (a changed or overridden tool is another
        object) and strings; a copy of the policy starts with none (see ``Frozen.model_copy``).
        ``None`` under a key without a resource: the answer depends on the step's resource too.
        """
        return {}

    def step_facts(self, role: str | None, category: str, step: Step, tool: Tool | None) -> _StepFacts:
        """What this policy says of ``step`` that does not depend on its values (remembered, see ``facts_kept``)."""
        kept = self.facts_kept
        key: _FactsKey = (role, category, step.tool, tool)
        held = kept.get(key, _UNKNOWN)
        if isinstance(held, _StepFacts):
            return held
        resource = tool.resource_for(step.params) if tool is not None else None
        if held is _UNKNOWN and not self._reads_resource(step.tool):
            facts = _step_facts(self, role, category, step, tool, resource=resource)
        else:
            if held is _UNKNOWN and len(kept) < FACTS_KEPT:
                kept[key] = None
            key = (role, category, step.tool, tool, resource)
            facts = kept.get(key) or _step_facts(self, role, category, step, tool, resource=resource)
            if resource is not None and len(resource) > REMEMBERED:
                return facts
        if len(kept) < FACTS_KEPT:
            kept[key] = facts
        return facts

    def _reads_resource(self, tool_name: str) -> bool:
        """Whether a rule that may apply to a step of this tool matches on the step's resource."""
        rules: list[StepMatch | ValueRule] = [*self.deny, *self.require]
        rules += [match for rule in self.sequences for match in (rule.after, rule.forbid)]
        return any(
            rule.resources is not None and (rule.tools is None or matches_any(rule.tools, tool_name)) for rule in rules
        )

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
        resource = tool.resource_for(params, resolved=True)
        return list(value_violations(self.deny, self.require, step, params, resource, resolved=True))

    def sink(self, tool: Tool, param: str) -> SinkRule | None:
        """The sink rule that decides for untrusted data in ``tool``'s parameter ``param``; None: nothing guards it."""
        kept = self.sinks_kept
        key = (tool, param)
        if key in kept:
            return kept[key]
        found = next(
            (
                r
                for r in self.sinks or ()
                if not r.answer and matches_any(r.tools, tool.name) and matches_any(r.params, param)
            ),
            None,
        )
        if found is None and default_sink(tool):
            found = DEFAULT_SINK
        if len(kept) < FACTS_KEPT and len(param) <= REMEMBERED:  # a plan's long names would only fill the memory
            kept[key] = found
        return found

    @property
    def answer_sink(self) -> SinkRule | None:
        """The first sink rule with ``answer: true``; None: untrusted data reaches the answer, marked."""
        return next((r for r in self.sinks or () if r.answer), None)

    @cached
    def sinks_kept(self) -> dict[tuple[Tool, str], SinkRule | None]:
        """The sink rule of each (tool, parameter) already asked about."""
        return {}

    def sink_hits(self, step: Step, tool: Tool, flow: provenance.StepFlow) -> list[SinkHit]:
        """Every parameter of ``step`` that takes untrusted data a sink rule guards, with that rule."""
        hits: list[SinkHit] = []
        control = flow.untrusted_control
        names = step.params if control else flow.params
        for name in names:
            param = flow.params.get(name)
            origins = param.untrusted if param is not None else ()
            rule = self.sink(tool, name) if origins or control else None
            if rule is None or rule.outcome == "allow":
                continue
            if rule.control and control:
                origins = provenance.union((origins, control))
            if origins:
                refs = param.refs if param is not None and param.untrusted else ()
                hits.append(SinkHit(rule, step, name, origins, refs))
        return hits

    def sink_violations(self, step: Step, tool: Tool, flow: provenance.StepFlow | None) -> list[Violation]:
        """The sink rules that deny ``step``'s call for the untrusted data its parameters take (run time too)."""
        if flow is None:
            return []
        return [
            Violation(rule=f"sink:{hit.rule.name}", message=hit.text(), step=step.id, source="policy")
            for hit in self.sink_hits(step, tool, flow)
            if hit.rule.outcome == "deny"
        ]

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
        from plangate._policyeval import Evaluation

        return Evaluation(self, plan, catalogue, graph or PlanGraph.of(plan), user, role).run()


class SinkHit(NamedTuple):
    """Untrusted data reaching a parameter a sink rule guards."""

    rule: SinkRule
    step: Step
    param: str
    origins: tuple[provenance.Origin, ...]
    refs: tuple[str, ...]

    def text(self) -> str:
        through = f" through {', '.join(self.refs)}" if self.refs else " through its condition"
        if not self.refs and self.step.condition is None:
            through = " through whether it runs (it reads a step whose condition does)"
        fed = " and ".join(o.describe() for o in self.origins)
        what = f"step {self.step.id} ({self.step.tool}) parameter {self.param!r} takes data from {fed}{through}"
        return f"{what}: {self.rule.message}" if self.rule.message else what


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


_FactsKey = tuple[str | None, str, str, Tool | None] | tuple[str | None, str, str, Tool | None, str | None]
_UNKNOWN = object()
FACTS_KEPT = 4096
"""The most step facts one policy keeps (a plan's resources may be many; each is a key)."""


class _StepFacts(NamedTuple):
    """What a policy says of one step by its tool, role, category and resource: the same for every such step."""

    external: bool
    writes: bool
    call_limits: tuple[tuple[str, str], ...]
    envelope: str | None
    role: tuple[tuple[str, str], ...]
    deny: tuple[DenyRule, ...]
    require: tuple[RequireRule, ...]
    after: tuple[bool, ...]
    forbid: tuple[bool, ...]
    approval: Literal["escalate", "read", "named", "write"]


def _step_facts(
    policy: Policy, role: str | None, category: str, step: Step, tool: Tool | None, *, resource: str | None
) -> _StepFacts:
    """``step``'s facts (the matchers read only its tool's name, and ``resource``)."""
    name = step.tool
    return _StepFacts(
        external=tool is not None and tool.external,
        writes=tool is not None and tool.effect != "read",
        call_limits=_call_limits(policy.limits, tool),
        envelope=_envelope(policy, category, tool),
        role=_role_rule(policy, role, name, tool),
        deny=tuple(rule for rule in policy.deny if rule.applies(step, resource)),
        require=tuple(rule for rule in policy.require if rule.applies(step, resource)),
        after=tuple(rule.after.matches(step, tool, resource) for rule in policy.sequences),
        forbid=tuple(rule.forbid.matches(step, tool, resource) for rule in policy.sequences),
        approval=_approval_kind(policy, category, tool),
    )


def _call_limits(limits: Limits, tool: Tool | None) -> tuple[tuple[str, str], ...]:
    """A tool's own timeout and retries within the ceilings: refused before approval, never cut at run time."""
    found: list[tuple[str, str]] = []
    if tool is None:
        return ()
    if limits.max_tool_timeout is not None and (tool.timeout or 0) > limits.max_tool_timeout:
        found.append(
            (
                "tool-timeout",
                f"tool {tool.name!r} declares a timeout of {tool.timeout:g} s; "
                f"the policy's max_tool_timeout is {limits.max_tool_timeout:g} s",
            )
        )
    if limits.max_retries is not None and tool.retries > limits.max_retries:
        found.append(
            (
                "tool-retries",
                f"tool {tool.name!r} declares {tool.retries} retries; the policy's max_retries is {limits.max_retries}",
            )
        )
    return tuple(found)


def _envelope(policy: Policy, category: str, tool: Tool | None) -> str | None:
    """Why a step using ``tool`` is outside the category's envelope; None inside, or with no envelope to hold."""
    envelope = policy.categories.get(category) if policy.categories is not None else None
    if envelope is None or tool is None:  # an unknown category is flagged once; an unknown tool by the checker
        return None
    why = envelope.breach(tool)
    return None if why is None else f"category {category!r} {why}"


def _role_rule(policy: Policy, name: str | None, tool_name: str, tool: Tool | None) -> tuple[tuple[str, str], ...]:
    role = policy.roles.get(name) if name is not None else None
    if role is None:
        return ()
    if not matches_any(role.tools, tool_name):
        return (("tool-not-allowed", f"role {name!r} may not use tool {tool_name!r}"),)
    missing = [s for s in tool.scopes if not matches_any(role.scopes, s)] if tool is not None else []
    if missing:
        why = f"tool {tool_name!r} needs scope {', '.join(missing)}, which role {name!r} does not hold"
        return (("missing-scope", why),)
    return ()


def _approval_kind(policy: Policy, category: str, tool: Tool | None) -> Literal["escalate", "read", "named", "write"]:
    if tool is not None and tool.effect in policy.approval.escalate:
        return "escalate"
    if tool is None or tool.effect == "read":
        return "read"
    return "named" if _named(policy, category, tool) else "write"
