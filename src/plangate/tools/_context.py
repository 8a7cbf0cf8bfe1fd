from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """What a tool may know about the step it runs in.

    A tool asks for it by declaring a parameter named ``ctx`` (or annotated
    ``RunContext``); that parameter is not part of the tool's schema, so a plan can
    never set it. ``now`` comes from the engine's clock, so a replay sees the same time.
    While the tool runs, the step's span is the current OpenTelemetry span, on whatever
    thread it runs: a span the tool opens is a child of its step.
    """

    plan_id: str
    step_id: int
    now: datetime
    attempt: int = 1
    trace_context: str | None = None
    """The W3C ``traceparent`` of the step's span when the run is traced (:mod:`plangate.tracing`),
    for a tool that calls another service to pass on; None when it is not."""

    @property
    def idempotency_key(self) -> str:
        """``plan_id:step_id``: the same on every attempt of the same step."""
        return idempotency_key(self.plan_id, self.step_id)


def idempotency_key(plan_id: str, step_id: int) -> str:
    """The key every attempt of a step runs under, and its record in ``steps`` keeps: ``plan_id:step_id``."""
    return f"{plan_id}:{step_id}"
