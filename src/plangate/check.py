"""The checker: a compiler pass over a whole plan, before anything runs.

``check`` reports every problem at once, each with its step, a stable rule name and a
plain message. Rule names (see ``RULES``) are part of the public contract.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from plangate import _jsontypes as jt
from plangate import condtypes, references
from plangate._overrides import governed
from plangate.answer import origins as answer_origins
from plangate.errors import PlanError, RefError
from plangate.graph import PlanGraph
from plangate.plan import Plan, Step, expected_types
from plangate.policy import Policy, PolicyDecision
from plangate.provenance import EMPTY, Provenance, analyse
from plangate.tools import Catalogue, Tool
from plangate.violations import Violation

RULES: dict[str, str] = {
    "plan-schema": "the input is not a plan of the plan's shape, or is over a plan limit",
    "duplicate-step-id": "two steps share an id",
    "unknown-tool": "the step names a tool that is not in the catalogue",
    "missing-param": "a required parameter is missing",
    "unknown-param": "a parameter the tool does not take",
    "param-type": "a parameter value does not fit the tool's parameter schema",
    "ref-syntax": "a malformed ${...} reference",
    "ref-self": "a step refers to its own output",
    "ref-missing-step": "a reference to a step that does not exist",
    "ref-forward": "a reference to a step that comes later in the plan",
    "ref-path": "a reference to a field the referenced tool's output does not have",
    "ref-type": "a referenced value's type does not fit the parameter",
    "cycle": "steps that depend on each other in a circle",
    "expected-output": "expected_output cannot match what the tool returns",
    "condition-syntax": "a condition that does not parse",
    "condition-type": "a condition that no values of the types it reads could make work (a number > a string)",
    "after-step": "an 'after' entry that does not name an earlier step of the plan",
    "optional-effect": "'on_failure: continue' on a step whose tool writes or cannot be undone (only reads may fail)",
    "ref-optional": "a use of an optional step's output, null when that step fails, where null does not fit (a "
    "parameter, text, a condition's test other than for null) and no condition '${N} != null' guards it",
}


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    """Everything ``check`` found; ``ok`` when nothing at all."""

    violations: tuple[Violation, ...]
    plan: Plan | None
    decision: PolicyDecision | None = None
    catalogue: Catalogue | None = field(default=None, repr=False, compare=False)
    """The catalogue it was checked against (under the policy), for :attr:`provenance`."""

    @cached_property
    def provenance(self) -> Provenance:
        """Where each step's parameter values come from (worked out on first use: see :mod:`plangate.provenance`)."""
        return analyse(self.plan, self.catalogue) if self.plan is not None else EMPTY

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def plan_hash(self) -> str | None:
        """The checked plan's content hash (``None`` when the input was not a plan)."""
        return self.plan.hash if self.plan is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "plan_hash": self.plan_hash,
            "violations": [v.to_dict() for v in self.violations],
            "policy": self.decision.to_dict() if self.decision else None,
            **({"provenance": found.to_dict()} if (found := self.provenance).steps else {}),
            **({"answer_provenance": self.answer_provenance()} if self.plan and self.plan.answer is not None else {}),
        }

    def answer_provenance(self) -> dict[str, Any]:
        """What the plan's answer will derive from, as the run records it: every source, and the untrusted ones."""
        assert self.plan is not None
        found = answer_origins(self.plan, self.provenance)
        literal = references.whole_ref(self.plan.answer) is None  # text of the plan's own around the references
        return {
            "sources": [*(["plan"] if literal else []), *(origin.source for origin in found)],
            "untrusted": [{"step": o.step, "tool": o.tool} for o in found if o.untrusted],
        }


def check(
    plan: Plan | Mapping[str, Any] | str | bytes,
    catalogue: Catalogue,
    policy: Policy | None = None,
    *,
    user: str | None = None,
    role: str | None = None,
) -> CheckResult:
    """Check a plan against the catalogue and, when given, the policy; return every violation.

    ``plan`` may be a :class:`Plan`, decoded JSON or JSON text; input that is not a plan
    is reported as ``plan-schema`` violations rather than raised.
    """
    if not isinstance(plan, Plan):
        try:
            plan = Plan.parse(plan)
        except PlanError as exc:
            found = exc.problems or ()
            violations = [Violation(rule="plan-schema", message=str(p), step=p.step, source="plan") for p in found]
            return CheckResult(violations=tuple(violations or [_unreadable(exc)]), plan=None)
    catalogue = governed(catalogue, policy)
    graph = PlanGraph.of(plan)
    violations = _Checker(plan, catalogue).run()
    decision = None
    if policy is not None:
        decision = policy.evaluate(plan, catalogue, user=user, role=role, graph=graph)
        violations.extend(decision.violations)
    if violations:
        position = {step_id: index for index, step_id in enumerate(graph.order)}
        violations.sort(key=lambda v: -1 if v.step is None else position.get(v.step, -1))
    return CheckResult(violations=tuple(violations), plan=plan, decision=decision, catalogue=catalogue)


def _unreadable(exc: PlanError) -> Violation:
    return Violation(rule="plan-schema", message=exc.summary, source="plan")


@dataclass
class _Checker:
    plan: Plan
    catalogue: Catalogue
    out: list[Violation] = field(default_factory=list)
    position: dict[int, int] = field(default_factory=dict)
    forward: list[tuple[int, int]] = field(default_factory=list)
    fallible: bool = False
    """Whether any step may fail and go on (its output then null): only then is a use of one 'optional'."""
    tools: list[Tool | None] = field(default_factory=list)
    """Each step's tool (None: not in the catalogue), by the step's index."""
    declared: set[int] = field(default_factory=set)
    """Steps whose output's shape the step declares: their tools are made for this check, and kept by nothing."""

    def flag(self, step: Step, rule: str, message: str) -> None:
        self.out.append(Violation(rule=rule, message=message, step=step.id))

    def run(self) -> list[Violation]:
        self.fallible = any(step.on_failure == "continue" for step in self.plan.steps)
        for index, step in enumerate(self.plan.steps):
            if step.id in self.position:
                self.flag(step, "duplicate-step-id", f"id {step.id} is already used by an earlier step")
            else:
                self.position[step.id] = index
        get = self.catalogue.get
        self.tools = [get(step.tool) for step in self.plan.steps]
        for index, (step, found) in enumerate(zip(self.plan.steps, self.tools, strict=True)):
            if found is not None and found.output_schema_for is not None:  # the step declares its output's shape
                self.tools[index] = found.for_params(step.params)
                self.declared.add(step.id)
        for index, step in enumerate(self.plan.steps):
            self.step(index, step)
        self.cycles()
        if self.plan.answer is not None and references.has_refs(self.plan.answer):
            self.answer(self.plan.answer)
        return self.out

    def answer(self, text: str) -> None:
        """The answer's references, as a parameter's text: each names a step, and a field its output has."""
        try:
            found = references.scan(text)
        except RefError as exc:
            self.out.append(Violation(rule="ref-syntax", message=f"answer: {exc}"))
            return
        for ref in found:
            at = self.position.get(ref.step)
            if at is None:
                message = f"answer: {ref} refers to step {ref.step}, which does not exist"
                self.out.append(Violation(rule="ref-missing-step", message=message))
                continue
            located = _located(ref, "answer", self.tools[at])
            if isinstance(located, str):
                self.out.append(Violation(rule="ref-path", message=located))

    def step(self, index: int, step: Step) -> None:
        tool = self.tools[index]
        if tool is None:
            close = difflib.get_close_matches(step.tool, self.catalogue.names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            self.flag(step, "unknown-tool", f"no tool named {step.tool!r} in the catalogue{hint}")
        if step.refs.params or step.refs.bad_params:
            self.param_refs(index, step, tool)
        if step.condition is not None:
            self.condition(index, step)
        if tool is not None:
            if not tool.params_plainly_valid(step.params):
                self.params(step, tool)
            if step.expected_output != "any":
                self.expected_output(step, tool)
            if step.on_failure == "continue" and tool.effect != "read":
                self.flag(
                    step,
                    "optional-effect",
                    f"on_failure 'continue' is for read steps only, and {tool.name!r} is a {tool.effect} tool: "
                    "a write that fails must stop the plan",
                )
        if step.rollback is not None:
            self.rollback(index, step)
        if step.after:
            self.after(index, step)

    def after(self, index: int, step: Step) -> None:
        seen: set[int] = set()
        for other in step.after:
            at = self.position.get(other)
            if other in seen:
                why = f"names step {other} twice"
            elif other == step.id:
                why = "names this step itself"
            elif at is None:
                why = f"names step {other}, which does not exist"
            elif at > index:
                why = f"names step {other}, which comes later; a step may wait only for steps listed before it"
                self.forward.append((step.id, other))
            else:
                seen.add(other)
                continue
            seen.add(other)
            self.flag(step, "after-step", f"after: {why}")

    def optional(self, step: Step, ref: references.Ref) -> bool:
        """True when ``ref`` may be null because the step it reads may fail, and nothing guards it."""
        at = self.position.get(ref.step) if self.fallible else None
        if at is None or self.plan.steps[at].on_failure != "continue":
            return False
        condition = step.refs.condition
        return condition is None or ref.step not in condtypes.not_null(condition.tree)

    def target(
        self, index: int, step: Step, ref: references.Ref, where: str | references.Found
    ) -> Tool | Literal[False] | None:
        """The referenced step's tool (None: unknown tool), or False when the reference is bad.

        ``where``: the place, in words, or the parameter reference found (worded only when flagged).
        """
        at = self.position.get(ref.step)
        if at is None or at > index or ref.step == step.id:
            self.bad_target(index, step, ref, where if isinstance(where, str) else f"param {_where(where.loc)!r}")
            return False
        return self.tools[at]

    def bad_target(self, index: int, step: Step, ref: references.Ref, where: str) -> None:
        at = self.position.get(ref.step)
        if ref.step == step.id:
            self.flag(step, "ref-self", f"{where}: {ref} refers to this step's own output")
        elif at is None:
            self.flag(step, "ref-missing-step", f"{where}: {ref} refers to step {ref.step}, which does not exist")
        elif at > index:
            self.flag(step, "ref-forward", f"{where}: {ref} refers to step {ref.step}, which comes later")
            self.forward.append((step.id, ref.step))

    def output_at(self, index: int, step: Step, ref: references.Ref, where: str) -> jt.Located | None:
        source = self.target(index, step, ref, where)
        return None if source is False else self.located(step, ref, where, source)

    def located(self, step: Step, ref: references.Ref, where: str, source: Tool | None) -> jt.Located | None:
        """What ``ref`` reads in ``source``'s output (flagged, and None, when that has no such field)."""
        located = _located(ref, where, source)
        if isinstance(located, str):
            self.flag(step, "ref-path", located)
            return None
        return located

    def param_refs(self, index: int, step: Step, tool: Tool | None) -> None:
        for loc, error in step.refs.bad_params:
            self.flag(step, "ref-syntax", f"param {_where(loc)!r}: {error}")
        for found in step.refs.params:
            source = self.target(index, step, found.ref, found)
            if source is False:
                continue
            if tool is None or found.ref.step in self.declared or self.optional(step, found.ref):
                self.param_ref(step, tool, found, source)
                continue
            # Everything else follows from the two tools and the reference: worked out once per tool.
            for rule, message in tool.kept((source, found), _ref_use, tool, found, source):
                self.flag(step, rule, message)

    def param_ref(self, step: Step, tool: Tool | None, found: references.Found, source: Tool | None) -> None:
        """A reference from a step whose tool is unknown, to a step that declares its output's shape (kept by
        no tool: see :meth:`Tool.for_params`), or to a step that may fail (its output null)."""
        where = f"param {_where(found.loc)!r}"
        located = self.located(step, found.ref, where, source)
        if located is None or tool is None:
            return
        wanted = tool.param_at(found.loc)
        if wanted.error is not None:
            return  # an unknown parameter: reported by the parameter check
        accepted = wanted.types
        if self.optional(step, found.ref) and (not found.whole or jt.not_accepted(jt.NULL, accepted)):
            use = f"takes {jt.describe(accepted)}" if found.whole else "would read 'null' in its text"
            self.flag(
                step,
                "ref-optional",
                f"{where} {use}, but {found.ref} is null when step {found.ref.step} fails "
                f"(its on_failure is 'continue'); give this step the condition '${{{found.ref.step}}} != null'",
            )
            return
        for rule, message in _use(where, found, located, accepted):
            self.flag(step, rule, message)

    def condition(self, index: int, step: Step) -> None:
        analysis = step.refs
        if analysis.condition_error is not None:
            self.flag(step, "condition-syntax", f"condition {step.condition!r}: {analysis.condition_error}")
        elif analysis.condition is not None:
            located = {ref: self.output_at(index, step, ref, "condition") for ref in analysis.condition.refs}
            if all(found is not None for found in located.values()):  # a bad reference is flagged already
                why = condtypes.problem(analysis.condition.tree, lambda ref: located[ref].types)  # type: ignore[union-attr]
                if why is not None:
                    self.flag(step, "condition-type", f"condition {step.condition!r}: {why}")
            for ref in sorted(condtypes.value_reads(analysis.condition.tree)) if self.fallible else ():
                if self.optional(step, ref):
                    self.flag(
                        step,
                        "ref-optional",
                        f"condition {step.condition!r} reads {ref}, which is null when step {ref.step} fails (its "
                        f"on_failure is 'continue'), and a test against null may come out true; test it with "
                        f"'${{{ref.step}}} == null', or guard it: '${{{ref.step}}} != null and ...'",
                    )

    def params(self, step: Step, tool: Tool) -> None:
        """The values as the tool is given them (a ``$${`` escape is the ``${`` it stands for) held to its schema:
        types, lengths, literals; a value that takes a reference is held to it once resolved."""
        by_param: dict[str, list[str]] = {}
        for err in tool.param_errors(references.known_values(step.params)):
            kind, given = err["type"], _written(step.params, err["loc"], err.get("input"))
            name = str(err["loc"][0]) if err["loc"] else "?"
            if kind == "missing":
                self.flag(step, "missing-param", f"param {name!r} is required by {tool.name!r}, but missing")
            elif kind == "extra_forbidden":
                takes = ", ".join(tool.param_names) or "no parameters"
                self.flag(step, "unknown-param", f"{tool.name!r} takes no param {name!r} (it takes: {takes})")
            elif not (isinstance(given, str) and references.takes_refs(given)):
                by_param.setdefault(name, []).append(f"{err['msg']}")
        for name, messages in by_param.items():
            value = _short(step.params.get(name))
            reasons = "; or ".join(dict.fromkeys(messages))
            self.flag(step, "param-type", f"param {name!r} = {value}: {reasons}")

    def expected_output(self, step: Step, tool: Tool) -> None:
        expected = expected_types(step.expected_output)
        returns = tool.output_at(()).types
        if expected is None or returns is None:
            return
        numeric = {"number", "integer"}
        if not expected & returns and not (expected & numeric and returns & numeric):
            self.flag(
                step,
                "expected-output",
                f"expects {jt.describe(expected)}, but {tool.name!r} returns {jt.describe(returns)}",
            )

    def rollback(self, index: int, step: Step) -> None:
        if step.refs.rollback_error is not None:
            self.flag(step, "ref-syntax", f"rollback: {step.refs.rollback_error}")
        for ref in step.refs.rollback:
            if ref.step != step.id:
                self.target(index, step, ref, "rollback")

    def cycles(self) -> None:
        """Forward references are already errors; report those that close a circle too."""
        if not self.forward:
            return
        edges: dict[int, set[int]] = {}
        for step in self.plan.steps:
            targets = (step.refs.depends_on | set(step.after)) & self.position.keys()
            edges.setdefault(step.id, set()).update(targets - {step.id})
        reported: set[frozenset[int]] = set()
        for source, later in self.forward:
            path = _path(edges, later, source)
            if path is not None and frozenset(path) not in reported:
                reported.add(frozenset(path))
                ring = " -> ".join(str(s) for s in [source, *path])
                step = self.plan.steps[self.position[source]]
                self.flag(step, "cycle", f"steps depend on each other in a circle: {ring}")


def _ref_use(tool: Tool, found: references.Found, source: Tool | None) -> tuple[tuple[str, str], ...]:
    """What is wrong with ``found``, in a parameter of ``tool``, reading the output of ``source``'s tool."""
    where = f"param {_where(found.loc)!r}"
    located = _located(found.ref, where, source)
    if isinstance(located, str):
        return (("ref-path", located),)
    wanted = tool.param_at(found.loc)
    if wanted.error is not None:
        return ()  # an unknown parameter: reported by the parameter check
    return tuple(_use(where, found, located, wanted.types))


def _located(ref: references.Ref, where: str, source: Tool | None) -> jt.Located | str:
    """What ``ref`` reads in the output of ``source`` (unknown for an unknown tool), or why it reads nothing."""
    if source is None:
        return jt.UNKNOWN
    located = source.output_at(ref.path)
    if located.error is not None:
        return f"{where}: {ref}: the output of step {ref.step} ({source.name}) {located.error}"
    return located


def _use(where: str, found: references.Found, located: jt.Located, accepted: jt.Types) -> Iterator[tuple[str, str]]:
    """A reference's type against the parameter's: text with a reference inside is text."""
    if not found.whole:
        if jt.not_accepted(frozenset({"string"}), accepted):
            yield (
                "param-type",
                f"{where} takes {jt.describe(accepted)}, but its value is text "
                f"with {found.ref} inside; write the reference alone to pass its value",
            )
        return
    given = located.types
    if jt.not_accepted(given, accepted):
        yield "ref-type", f"{where} takes {jt.describe(accepted)}, but {found.ref} is {jt.describe(given)}"


def _path(edges: Mapping[int, set[int]], start: int, goal: int) -> list[int] | None:
    """A dependency path from ``start`` to ``goal`` (both included), if there is one."""
    parents: dict[int, int | None] = {start: None}
    stack = [start]
    while stack:
        node = stack.pop()
        if node == goal:
            path = [node]
            while (prev := parents[path[-1]]) is not None:
                path.append(prev)
            return path[::-1]
        for nxt in edges.get(node, ()):
            if nxt not in parents:
                parents[nxt] = node
                stack.append(nxt)
    return None


def _written(params: Mapping[str, Any], loc: tuple[str | int, ...], given: Any) -> Any:
    """The plan's own text where a parameter error is (``given``, as validated, where ``loc`` names no value of
    the plan's): a ``$${1}`` escape, given to the tool as the text ``${1}``, takes no reference."""
    value: Any = params
    for key in loc:
        if isinstance(value, str):  # past a string, a location names a union's member, not a value
            return value
        try:
            value = value[key]
        except (LookupError, TypeError):
            return given
    return value


def _where(loc: tuple[str | int, ...]) -> str:
    return ".".join(str(part) for part in loc)


def _short(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."
