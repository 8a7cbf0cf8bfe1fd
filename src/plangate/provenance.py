"""Where each parameter's value comes from: the provenance of values, worked out from a plan's references.

A plan is written before any tool output exists, so every value a step is called with is
either literal plan text (``plan``: written from the user's task and read by the approver)
or comes, through a ``${N...}`` reference, from the output of step N (``step:N``). A
reference is the only way data moves between steps, and references are in the plan's text,
so the flow of data is known exactly before anything runs:

- a whole reference (``"${2}"``, ``"${2.to}"``) gives the parameter step 2's sources;
- text around references (``"Pay ${1.iban}"``) gives it ``plan`` and every referenced step's;
- a step whose tool ``inherits_provenance`` (an extractor) passes its inputs' sources on to
  its output, as well as its own ``step:N``;
- a condition that reads a step makes the step *control-dependent* on it, and so is every
  step that reads a control-dependent one (it is skipped when that one is).

A ``step:N`` source is untrusted when step N's tool has ``untrusted_output`` (MCP tools
unless the policy's ``tools`` section says otherwise), or inherits provenance and was given
untrusted data. The policy's ``sinks`` rules act on it (:mod:`plangate.policy`), the engine
records it in each ``step.started`` event, and the review shows it beside each parameter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from plangate.plan import Plan
from plangate.references import Ref
from plangate.tools import Catalogue, Tool

PLAN = "plan"
"""Literal plan text: what the planner wrote from the user's task and a person reads before approving."""


class Origin(NamedTuple):
    """A step a value derives from, with its tool and whether that tool's output is trusted."""

    step: int
    tool: str
    untrusted: bool

    @property
    def source(self) -> str:
        return f"step:{self.step}"

    def describe(self) -> str:
        """How a reviewer reads it: ``step 1 (untrusted: read_bill)``."""
        return f"step {self.step} ({'untrusted' if self.untrusted else 'trusted'}: {self.tool})"


class ParamFlow(NamedTuple):
    """Where one parameter's value comes from."""

    param: str
    origins: tuple[Origin, ...]
    """The steps it derives from, in step order."""
    literal: bool
    """Whether plan text is part of it too (a reference inside text, or a value with literal parts)."""
    refs: tuple[str, ...]
    """The reference expressions that bring the steps' data in, as written (``${1.iban}``)."""

    @property
    def sources(self) -> tuple[str, ...]:
        return ((PLAN,) if self.literal else ()) + tuple(o.source for o in self.origins)

    @property
    def untrusted(self) -> tuple[Origin, ...]:
        return tuple(o for o in self.origins if o.untrusted)


class StepFlow(NamedTuple):
    """Where the values of one step come from: its parameters fed by other steps, and its condition."""

    params: Mapping[str, ParamFlow]
    """Only the parameters that read another step: the others are plan text."""
    control: tuple[Origin, ...] = ()
    """The steps its condition reads: whether it runs at all depends on them."""

    @property
    def untrusted_params(self) -> tuple[str, ...]:
        return tuple(name for name, flow in self.params.items() if flow.untrusted)

    @property
    def untrusted_control(self) -> tuple[Origin, ...]:
        return tuple(o for o in self.control if o.untrusted)

    def data(self) -> dict[str, Any]:
        """What the step's ``step.started`` event records: ``provenance``, ``untrusted``, ``control``."""
        out: dict[str, Any] = {"provenance": {name: list(flow.sources) for name, flow in self.params.items()}}
        untrusted = self.untrusted_params
        if untrusted:
            out["untrusted"] = list(untrusted)
        if self.control:
            out["control"] = [o.source for o in self.control]
        return out

    def to_dict(self) -> dict[str, Any]:
        """As the check result and the review give it."""
        return {
            "params": {
                name: {
                    "sources": list(flow.sources),
                    "refs": list(flow.refs),
                    "untrusted": [_origin(o) for o in flow.untrusted],
                }
                for name, flow in self.params.items()
            },
            "control": [_origin(o) for o in self.control],
        }


def _origin(origin: Origin) -> dict[str, Any]:
    return {"step": origin.step, "tool": origin.tool, "untrusted": origin.untrusted}


class Provenance(NamedTuple):
    """Every step's :class:`StepFlow` (steps that read nothing are left out), and which steps' outputs are untrusted."""

    steps: Mapping[int, StepFlow]
    outputs: Mapping[int, tuple[Origin, ...]]
    """What each step's output derives from: itself, and for a tool that inherits provenance, its inputs' origins."""

    def of(self, step_id: int) -> StepFlow | None:
        return self.steps.get(step_id)

    @property
    def untrusted(self) -> bool:
        """Whether any parameter or condition reads untrusted data."""
        return any(flow.untrusted_params or flow.untrusted_control for flow in self.steps.values())

    def to_dict(self) -> dict[str, Any]:
        return {str(step_id): flow.to_dict() for step_id, flow in self.steps.items()}


EMPTY = Provenance({}, {})


def analyse(plan: Plan, catalogue: Catalogue | None) -> Provenance:
    """The provenance of every step's parameters and condition (``catalogue`` None: every tool counts as trusted)."""
    steps = plan.steps
    if plan.answer is None and not any(step.refs.depends_on for step in steps):
        return EMPTY  # the answer, when there is one, reads the outputs' origins
    outputs: dict[int, tuple[Origin, ...]] = {}
    flows: dict[int, StepFlow] = {}
    for step in steps:
        tool = catalogue.get(step.tool) if catalogue is not None else None
        refs = step.refs
        if not refs.depends_on:
            outputs.setdefault(step.id, (Origin(step.id, step.tool, _untrusted(tool, ())),))
            continue
        params = _params(step.params, refs.params, outputs)
        control: tuple[Origin, ...] = ()
        if refs.condition is not None:
            control = union(outputs.get(ref.step, ()) for ref in refs.condition.refs)
        # a step that reads a skipped step is skipped too: whether it runs depends on that step's condition
        inherited = (flows[d].control for d in refs.depends_on if d in flows)
        control = union((control, *inherited))
        flows[step.id] = StepFlow(params, control)
        inherits = tool is not None and tool.inherits_provenance
        inputs = union(flow.origins for flow in params.values()) if inherits else ()
        own = Origin(step.id, step.tool, _untrusted(tool, inputs))
        outputs.setdefault(step.id, union(((own,), inputs)))
    return Provenance(flows, outputs)


def _untrusted(tool: Tool | None, inputs: tuple[Origin, ...]) -> bool:
    if tool is None:
        return False
    return tool.untrusted_output or (tool.inherits_provenance and any(o.untrusted for o in inputs))


def _params(
    params: Mapping[str, Any], found: tuple[Any, ...], outputs: Mapping[int, tuple[Origin, ...]]
) -> dict[str, ParamFlow]:
    by_param: dict[str, list[Any]] = {}
    for each in found:
        by_param.setdefault(str(each.loc[0]), []).append(each)
    out: dict[str, ParamFlow] = {}
    for name, uses in by_param.items():
        refs: list[Ref] = [use.ref for use in uses]
        whole = len(uses) == 1 and uses[0].whole and len(uses[0].loc) == 1
        out[name] = ParamFlow(
            param=name,
            origins=union(outputs.get(ref.step, ()) for ref in refs),
            literal=not whole,
            refs=tuple(dict.fromkeys(ref.text for ref in refs)),
        )
    return {name: out[name] for name in params if name in out}


def union(groups: Any) -> tuple[Origin, ...]:
    merged: dict[int, Origin] = {}
    for group in groups:
        for origin in group:
            merged.setdefault(origin.step, origin)
    return tuple(merged[key] for key in sorted(merged))
