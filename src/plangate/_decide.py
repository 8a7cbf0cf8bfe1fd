"""What the engine decides about a step just before its call, from the outputs recorded so far.

Pure: no store, no clock, no tool call. The engine acts on the decision; replay
(:mod:`plangate.replay`) makes it again over the recorded outputs and holds it against
what the audit log says happened, so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Literal, NamedTuple

from plangate import references, results
from plangate.errors import ConditionError, ParamsError, RefError
from plangate.plan import Step
from plangate.policy import Policy
from plangate.provenance import StepFlow
from plangate.tools import Tool
from plangate.violations import Violation

SKIPPED: Any = object()
"""The output of a skipped step: steps that read it are skipped too."""


class Decision(NamedTuple):
    """``start`` with the resolved ``params`` (and the validated ``kwargs``), ``skip`` or ``fail`` with a reason."""

    action: Literal["start", "skip", "fail"]
    reason: str = ""
    params: Any = None
    kwargs: dict[str, Any] | None = None
    condition: bool | None = None
    """The condition's value, when the step has one and it was worked out."""
    violation: Violation | None = None
    """The policy rule that refused the call, when one did."""
    provenance: dict[str, Any] | None = None
    """Where the parameters' values come from, as the ``step.started`` event records it (None: all plan text)."""


def decide(
    step: Step,
    tool: Tool,
    policy: Policy | None,
    outputs: Mapping[int, Any],
    nulls: Collection[int],
    *,
    flow: StepFlow | None = None,
) -> Decision:
    """Skipped input, condition, references, validation, then the policy's deny, require and sink rules.

    ``flow``: where the step's values come from (:func:`plangate.provenance.analyse`), for the sink
    rules, held again just before the call, and for the record.
    """
    skipped_input = [d for d in step.refs.depends_on if outputs.get(d) is SKIPPED]
    if skipped_input:
        return Decision("skip", f"step {min(skipped_input)}, whose output it reads, was skipped")
    condition: bool | None = None
    try:
        if step.refs.condition is not None:
            condition = bool(step.refs.condition.evaluate(lambda ref: lookup(ref, outputs, nulls)))
            if not condition:
                return Decision("skip", f"its condition is false: {step.condition}", condition=False)
        params = references.resolve(step.params, outputs, nulls)
        kwargs = tool.validate_params(params)
    except (ConditionError, RefError, ParamsError) as exc:
        return Decision("fail", str(exc), condition=condition)
    if policy is not None:
        denied = policy.call_violations(step, tool, params)
        if flow is not None:
            denied += policy.sink_violations(step, tool, flow)
        if denied:
            reason = f"{results.POLICY_REFUSAL}{denied[0]}"
            return Decision("fail", reason, params, condition=condition, violation=denied[0])
    found = flow.data() if flow is not None else None
    return Decision("start", params=params, kwargs=kwargs, condition=condition, provenance=found)


def lookup(ref: references.Ref, outputs: Mapping[int, Any], nulls: Collection[int]) -> Any:
    """A reference's value, as a condition reads it: a skipped step's output has none."""
    if outputs.get(ref.step) is SKIPPED:
        raise RefError(f"{ref}: step {ref.step} was skipped")
    return references.lookup(ref, outputs, nulls)
