"""A policy held against one plan: every violation, the approval it needs and why. Evaluation is a pure function of
(plan, catalogue, policy, requester); :meth:`plangate.policy.Policy.evaluate` is its door."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from plangate import answer, names, provenance
from plangate._patterns import matches_any, star_match
from plangate._valuerules import plan_meter, value_violations
from plangate.graph import PlanGraph
from plangate.plan import Plan, Step
from plangate.policy import (
    Approval,
    Policy,
    PolicyDecision,
    SequenceRule,
    SinkRule,
    _cleared,
    _StepFacts,
)
from plangate.tools import Catalogue, Tool
from plangate.violations import Violation


def _resources_clash(a: str, b: str) -> bool:
    """Equal, or equal once a part only known at run time (``*``) takes the other's value."""
    return a == b or ("*" in a and star_match(a, b)) or ("*" in b and star_match(b, a))


@dataclass
class Evaluation:
    """One policy held against one plan (:meth:`plangate.policy.Policy.evaluate`): run once, for the decision."""

    policy: Policy
    plan: Plan
    catalogue: Catalogue
    graph: PlanGraph
    user: str | None
    role: str | None
    violations: list[Violation] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    named: list[tuple[int, str]] = field(default_factory=list)
    answer_roles: list[str] = field(default_factory=list)
    """Roles an answer sink rule asks to approve (the answer is no step's)."""

    @cached_property
    def runs(self) -> PlanGraph:
        """What each step waits for in a dataflow plan: the steps it reads and those its ``after`` names."""
        return PlanGraph.of(self.plan, after=True)

    def run(self) -> PolicyDecision:
        steps = self.plan.steps
        get = self.catalogue.get
        tools = [get(s.tool) for s in steps]
        role = self._role()
        facts_of, category = self.policy.step_facts, self.plan.category
        facts = [facts_of(role, category, step, tool) for step, tool in zip(steps, tools, strict=True)]
        self._limits(facts)
        self._category()
        self._per_step(facts, "envelope")
        if role is not None:
            self._per_step(facts, "role")
        self._deny(tools, facts)
        if self.policy.resources.exclusive_writes and self.plan.order == "dataflow":
            self._resource_conflicts(tools)
        self._sequences(facts)
        self._sinks(tools)
        approval = self._approval(tools, facts)
        return PolicyDecision(
            policy=self.policy.name,
            revision=self.policy.revision,
            policy_hash=self.policy.hash,
            role=role,
            violations=tuple(self.violations),
            approval=approval,
            reasons=tuple(self.reasons),
            required_approvals=tuple(dict.fromkeys([*(role for _, role in self.named), *self.answer_roles])),
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

    def _limits(self, facts: list[_StepFacts]) -> None:
        limits = self.policy.limits
        if limits.max_steps is not None and len(self.plan.steps) > limits.max_steps:
            self._flag("max-steps", f"the plan has {len(self.plan.steps)} steps; the limit is {limits.max_steps}")
        external = [s.id for s, f in zip(self.plan.steps, facts, strict=True) if f.external]
        if limits.max_external_calls is not None and len(external) > limits.max_external_calls:
            self._flag(
                "max-external-calls",
                f"{len(external)} steps call outside (steps {_ids(external)}); "
                f"the limit is {limits.max_external_calls}",
            )
        for step, found in zip(self.plan.steps, facts, strict=True):
            for rule, message in found.call_limits:
                self._flag(rule, message, step.id)

    def _category(self) -> None:
        """The plan's category must be one the policy knows (each step's envelope is in its facts)."""
        categories = self.policy.categories
        name = self.plan.category
        if categories is None or name in categories:
            return
        close = difflib.get_close_matches(name, list(categories), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        known = ", ".join(sorted(categories)) or "none"
        self._flag("unknown-category", f"category {name!r} is not defined (categories: {known}){hint}")

    def _per_step(self, facts: list[_StepFacts], which: Literal["envelope", "role"]) -> None:
        """The category envelope's, or the role's, violations, step by step."""
        for step, found in zip(self.plan.steps, facts, strict=True):
            if which == "envelope":
                if found.envelope is not None:
                    self._flag("category-envelope", found.envelope, step.id)
            else:
                for rule, message in found.role:
                    self._flag(rule, message, step.id)

    def _deny(self, tools: list[Tool | None], facts: list[_StepFacts]) -> None:
        policy = self.policy
        meter = None
        for step, tool, found in zip(self.plan.steps, tools, facts, strict=True):
            if not (found.deny or found.require):
                continue
            resource = tool.resource_for(step.params) if tool is not None else None
            if meter is None:  # one budget for the plan
                meter = plan_meter(lambda: len(self.plan.canonical_json()), len(policy.deny))
            self.violations.extend(
                value_violations(found.deny, found.require, step, step.params, resource, resolved=False, meter=meter)
            )

    def _resource_conflicts(self, tools: list[Tool | None]) -> None:
        """In a dataflow plan (in listed order every write waits for the steps before it: two never overlap)."""
        resources = [t.resource_for(s.params) if t else None for s, t in zip(self.plan.steps, tools, strict=True)]
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

    def _sequences(self, facts: list[_StepFacts]) -> None:
        steps = self.plan.steps
        # In a dataflow plan a step listed first may run last: only what it waits for is before it.
        runs = self.runs if self.plan.order == "dataflow" else None
        for number, rule in enumerate(self.policy.sequences):
            seen: list[int] = []  # earlier steps that match the rule's `after`
            for index, (step, found) in enumerate(zip(steps, facts, strict=True)):
                if found.forbid[number]:
                    culprits = seen
                    if rule.scope == "dataflow":
                        ancestors = self.graph.ancestors.get(step.id, frozenset())
                        culprits = [s for s in seen if s in ancestors]
                    elif runs is not None:
                        culprits = seen + [
                            later.id
                            for later, f in zip(steps[index + 1 :], facts[index + 1 :], strict=True)
                            if f.after[number] and step.id not in runs.ancestors.get(later.id, ())
                        ]
                    if culprits:
                        self._sequence_hit(rule, step, culprits)
                if found.after[number]:
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

    def _sinks(self, tools: list[Tool | None]) -> None:
        """Untrusted data into a guarded parameter: refused, or held for a person (a named one with ``approve``)."""
        if not any(tool is not None and tool.untrusted_output for tool in tools):
            return  # no untrusted source in the plan: nothing to trace
        flows = provenance.analyse(self.plan, self.catalogue)
        for step, tool in zip(self.plan.steps, tools, strict=True):
            flow = flows.of(step.id)
            if tool is None or flow is None:
                continue
            for hit in self.policy.sink_hits(step, tool, flow):
                self._sink_hit(hit.rule, hit.text(), step.id)
        rule = self.policy.answer_sink
        fed = answer.origins(self.plan, flows) if rule is not None and rule.outcome != "allow" else ()
        untrusted = [o for o in fed if o.untrusted]
        if rule is not None and untrusted:
            text = f"the answer takes data from {' and '.join(o.describe() for o in untrusted)}"
            self._sink_hit(rule, f"{text}: {rule.message}" if rule.message else text, None)

    def _sink_hit(self, rule: SinkRule, text: str, step: int | None) -> None:
        if rule.outcome == "deny":
            self._flag(f"sink:{rule.name}", text, step)
        elif rule.approve is not None:
            if step is None:
                self.answer_roles.append(rule.approve)
            else:
                self.named.append((step, rule.approve))
            self.reasons.append(f"{text}: needs approval by {rule.approve!r} (sink:{rule.name})")
        else:
            self.reasons.append(f"{text}: a person must approve (sink:{rule.name})")

    def _approval(self, tools: list[Tool | None], facts: list[_StepFacts]) -> Approval:
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
        for step, tool, found in zip(self.plan.steps, tools, facts, strict=True):
            kind = found.approval
            if kind == "read" or tool is None:
                continue
            if kind == "escalate":
                self.reasons.append(f"step {step.id} ({step.tool}) is {tool.effect}")
            elif kind == "named":
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
