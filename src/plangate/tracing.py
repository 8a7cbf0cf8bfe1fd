"""Traces of runs, steps, approvals and model calls, sent with OpenTelemetry when it is asked for.

Off unless the standard ``OTEL_*`` variables ask for traces (an exporter or an OTLP
endpoint) or the application installed a global tracer provider of its own. When off, every
hook is a call on :data:`OFF` that does nothing, and OpenTelemetry is never imported.

The tree of one run::

    plangate.run            plangate.plan_id, plangate.plan.version, plangate.plan.hash, plangate.mode
    ├── plangate.step       plangate.step_id, plangate.tool, plangate.step.status (retries as events)
    │   └── (the tool's own spans: the step's span is current while the tool runs)
    └── ...

and, each in its own trace (or under whatever span is current), ``plangate.approval`` for a
person's decision, ``chat {model}`` (GenAI semantic conventions) for a model call, and
``plangate.react`` over a ReAct run's turns (``chat``) and actions (``plangate.react.action``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from plangate import _otelconfig

if TYPE_CHECKING:
    from plangate.models._base import Model, ModelRequest, ModelResponse
    from plangate.plan import Plan

__all__ = ["OFF", "RunSpans", "Traces", "default", "flush", "from_env", "traced_decision"]

SCOPE = "plangate"
P = ParamSpec("P")
R = TypeVar("R")


class Traces:
    """Where a runtime's spans go: an OpenTelemetry tracer, or nowhere (:data:`OFF`).

    ``provider`` is the SDK provider made for these traces (flushed by :meth:`flush`), or
    None when the spans go to the application's own global provider.
    """

    def __init__(self, tracer: Any = None, provider: Any = None) -> None:
        self.tracer = tracer
        self.provider = provider
        self.enabled = tracer is not None

    def run(self, plan_id: str, version: int, plan: Plan, *, actor: str, mode: str = "plan") -> RunSpans:
        """The spans of one run of a plan by the engine (a no-op when off)."""
        if self.tracer is None:
            return NO_RUN
        return RunSpans(self.tracer, plan_id, version, plan, actor=actor, mode=mode)

    def joined(self, plan_id: str, traceparent: str | None) -> RunSpans:
        """The spans of steps run away from their run (one step per Temporal activity), as children of the
        run span named by ``traceparent``; a no-op when off or when no run span was passed on."""
        if self.tracer is None or not traceparent:
            return NO_RUN
        return RunSpans.joining(self.tracer, plan_id, traceparent)

    def complete(
        self, model: Model, request: ModelRequest, *, purpose: str, plan_id: str | None = None
    ) -> ModelResponse:
        """``model.complete(request)`` under a GenAI ``chat`` span (the model's own errors pass through)."""
        if self.tracer is None:
            return model.complete(request)
        provider, _, name = model.name.partition(":")
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.system": provider,
            "gen_ai.provider.name": provider,
            "gen_ai.request.model": name or model.name,
            "gen_ai.request.max_tokens": request.max_tokens,
            "plangate.purpose": purpose,
        }
        if plan_id is not None:
            attributes["plangate.plan_id"] = plan_id
        with self.tracer.start_as_current_span(
            f"chat {name or model.name}", kind=_client(), attributes=attributes
        ) as s:
            response = model.complete(request)
            s.set_attribute("gen_ai.response.model", response.model or model.name)
            s.set_attribute("gen_ai.usage.input_tokens", response.usage.input)
            s.set_attribute("gen_ai.usage.output_tokens", response.usage.output)
            if response.stop_reason:
                s.set_attribute("gen_ai.response.finish_reasons", (response.stop_reason,))
            return response

    @contextlib.contextmanager
    def span(self, name: str, attributes: Mapping[str, Any]) -> Iterator[Any]:
        """A span current in this thread while the block runs (None when off); a raise marks it failed."""
        if self.tracer is None:
            yield None
            return
        with self.tracer.start_as_current_span(name, attributes=dict(attributes)) as current:
            yield current

    def automatic(self, plan_id: str, version: int, plan_hash: str, actor: str, reasons: Sequence[str]) -> None:
        """A plan approved by the policy as it was submitted: a ``plangate.approval`` span like a person's."""
        if self.tracer is None:
            return
        attributes = {
            "plangate.plan_id": plan_id,
            "plangate.plan.version": version,
            "plangate.plan.hash": plan_hash,
            "plangate.plan.status": "approved",
            "plangate.approval.actor": actor,
            "plangate.approval.decision": "approved",
            "plangate.approval.kind": "auto",
            "plangate.approval.reasons": list(reasons),
        }
        self.tracer.start_span("plangate.approval", attributes=attributes).end()

    def flush(self, timeout_millis: int = 10_000) -> None:
        """Send what is buffered now (an exporter sends in batches, in the background)."""
        target = self.provider if self.provider is not None else _global_provider()
        force = getattr(target, "force_flush", None)
        if force is not None:
            force(timeout_millis)


OFF = Traces()
"""No traces: every hook does nothing."""


class RunSpans:
    """The spans of one run: the run's, and one per step, parented explicitly (the engine's loop, its
    tools' threads and the caller's thread all report here)."""

    def __init__(self, tracer: Any, plan_id: str, version: int, plan: Plan, *, actor: str, mode: str) -> None:
        from opentelemetry import trace

        self._trace = trace
        self.tracer = tracer
        self.span = tracer.start_span(
            "plangate.run",
            attributes={
                "plangate.plan_id": plan_id,
                "plangate.plan.version": version,
                "plangate.plan.hash": plan.hash,
                "plangate.plan.category": plan.category,
                "plangate.plan.steps": len(plan.steps),
                "plangate.mode": mode,
                "plangate.actor": actor,
            },
        )
        self.context = trace.set_span_in_context(self.span)
        self.plan_id = plan_id
        self.steps: dict[int, Any] = {}
        self.ended = False

    @classmethod
    def joining(cls, tracer: Any, plan_id: str, traceparent: str) -> RunSpans:
        """Spans for steps under a run span opened elsewhere (``traceparent``), which they neither end nor mark."""
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        joined = cls.__new__(cls)
        joined._trace = trace
        joined.tracer = tracer
        joined.context = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
        joined.span = trace.get_current_span(joined.context)  # the remote run span: not recording, ends nothing
        joined.plan_id = plan_id
        joined.steps = {}
        joined.ended = False
        return joined

    def run_traceparent(self) -> str | None:
        """The W3C ``traceparent`` of the run span, for steps that run in another process."""
        return _traceparent(self.span)

    def __enter__(self) -> RunSpans:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> None:
        self.close(error)

    def step_started(self, step_id: int, tool: str, attempt: int) -> None:
        """A step recorded as started: its span opens; a later attempt of it is an event on that span."""
        span = self.steps.get(step_id)
        if span is not None:
            span.add_event("plangate.step.attempt", {"plangate.step.attempt": attempt})
            span.set_attribute("plangate.step.attempt", attempt)
            return
        self.steps[step_id] = self.tracer.start_span(
            "plangate.step",
            context=self.context,
            attributes={
                "plangate.plan_id": self.plan_id,
                "plangate.step_id": step_id,
                "plangate.tool": tool,
                "plangate.step.attempt": attempt,
            },
        )

    def step_retrying(self, step_id: int, attempt: int, reason: str, delay: float | None = None) -> None:
        span = self.steps.get(step_id)
        if span is not None:
            attributes: dict[str, Any] = {"plangate.step.attempt": attempt, "plangate.step.reason": reason}
            if delay is not None:
                attributes["plangate.step.delay_s"] = delay
            span.add_event("plangate.step.retry", attributes)

    def step_ended(
        self, step_id: int, tool: str, status: str, error: str | None = None, ms: float | None = None
    ) -> None:
        """A step's outcome, recorded: its span closes (one that never started opens and closes here)."""
        span = self.steps.pop(step_id, None)
        if span is None:
            self.step_started(step_id, tool, 0)
            span = self.steps.pop(step_id)
        span.set_attribute("plangate.step.status", status)
        if ms is not None:
            span.set_attribute("plangate.step.duration_ms", round(ms, 3))
        if status in ("failed", "outcome_unknown"):
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, error or status))
        elif error:
            span.set_attribute("plangate.step.reason", error)
        span.end()

    def wrap(self, step_id: int, fn: Callable[..., Any], is_async: bool) -> Callable[..., Any]:
        """``fn`` made to run with the step's span current, on whatever thread or task calls it."""
        span = self.steps.get(step_id)
        if span is None:
            return fn
        from opentelemetry import context

        ctx = self._trace.set_span_in_context(span, self.context)
        if is_async:

            async def traced_async(**kwargs: Any) -> Any:
                token = context.attach(ctx)
                try:
                    return await fn(**kwargs)
                finally:
                    context.detach(token)

            return traced_async

        def traced(**kwargs: Any) -> Any:
            token = context.attach(ctx)
            try:
                return fn(**kwargs)
            finally:
                context.detach(token)

        return traced

    def traceparent(self, step_id: int) -> str | None:
        """The W3C ``traceparent`` of the step's span, for a tool that calls out to pass on."""
        span = self.steps.get(step_id)
        return _traceparent(span) if span is not None else None

    def end(self, status: str, error: str | None = None, step_id: int | None = None) -> None:
        self.span.set_attribute("plangate.run.status", status)
        if step_id is not None:
            self.span.set_attribute("plangate.halt.step_id", step_id)
        if status != "succeeded":
            self.span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, error or status))
        self.close()

    def close(self, error: BaseException | None = None) -> None:
        """End whatever is still open (a run that raised, a call abandoned when it overran)."""
        if self.ended:
            return
        self.ended = True
        for span in self.steps.values():
            span.end()
        self.steps.clear()
        if error is not None:
            self.span.record_exception(error)
            self.span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        self.span.end()


class _NoRun(RunSpans):
    """The spans of a run when tracing is off: nothing, at the cost of a method call."""

    def __init__(self) -> None:
        self.ended = True

    def step_started(self, step_id: int, tool: str, attempt: int) -> None:
        pass

    def step_retrying(self, step_id: int, attempt: int, reason: str, delay: float | None = None) -> None:
        pass

    def step_ended(
        self, step_id: int, tool: str, status: str, error: str | None = None, ms: float | None = None
    ) -> None:
        pass

    def wrap(self, step_id: int, fn: Callable[..., Any], is_async: bool) -> Callable[..., Any]:
        return fn

    def traceparent(self, step_id: int) -> str | None:
        return None

    def run_traceparent(self) -> str | None:
        return None

    def end(self, status: str, error: str | None = None, step_id: int | None = None) -> None:
        pass

    def close(self, error: BaseException | None = None) -> None:
        pass


NO_RUN: RunSpans = _NoRun()


def traced_decision(
    decision: str,
) -> Callable[[Callable[Concatenate[Any, P], R]], Callable[Concatenate[Any, P], R]]:
    """A runtime method ``(self, plan_id, approver, ...)`` that decides on a plan, under a
    ``plangate.approval`` span; the version, hash, role and status are read back after it."""

    def wrap(method: Callable[Concatenate[Any, P], R]) -> Callable[Concatenate[Any, P], R]:
        @functools.wraps(method)
        def traced(self: Any, /, *args: P.args, **kwargs: P.kwargs) -> R:
            traces: Traces = self.traces
            if not traces.enabled:
                return method(self, *args, **kwargs)
            named = dict(zip(("plan_id", "approver"), args, strict=False)) | kwargs
            attributes = {
                "plangate.plan_id": str(named.get("plan_id")),
                "plangate.approval.actor": str(named.get("approver")),
                "plangate.approval.decision": decision,
            }
            with traces.span("plangate.approval", attributes) as span:
                record = method(self, *args, **kwargs)
                span.set_attributes(_decided(self, record, attributes["plangate.approval.actor"]))
                return record

        return traced

    return wrap


def _decided(runtime: Any, record: Any, approver: str) -> dict[str, Any]:
    rows = [row for row in runtime.store.approvals(record.id, record.version) if row.actor == approver]
    found = {
        "plangate.plan_id": record.id,
        "plangate.plan.version": record.version,
        "plangate.plan.hash": record.hash,
        "plangate.plan.status": record.status,
    }
    if rows and rows[-1].role:
        found["plangate.approval.role"] = rows[-1].role
    return found


# -- configuration -------------------------------------------------------------------------
_lock = threading.Lock()
_MISSING_SAID = threading.Event()
_MADE: dict[str, Traces] = {}  # the process's traces, once made (OFF is not kept: a later global provider counts)


def from_env(env: Mapping[str, str] | None = None) -> Traces:
    """Traces as the ``OTEL_*`` variables in ``env`` (default: the process's) say, with a provider of
    their own (never installed globally); :data:`OFF` when they ask for none or OpenTelemetry is
    not installed."""
    env = os.environ if env is None else env
    if not _otelconfig.wanted(env):
        return OFF
    try:
        provider = _otelconfig.provider(env)
    except ImportError:  # the core runs on without traces, and says why once
        if not _MISSING_SAID.is_set():
            _MISSING_SAID.set()
            logging.getLogger("plangate").warning(
                "the OTEL_* variables ask for traces, but the otel extra is not installed "
                "(pip install 'plangate[otel]'): tracing is off"
            )
        return OFF
    return Traces(provider.get_tracer(SCOPE), provider)


def default() -> Traces:
    """The process's traces, for a runtime given none.

    A global tracer provider the application installed wins; else the ``OTEL_*`` variables,
    whose provider is then installed globally (so tools' own spans go out with the run's) and
    flushed when the process ends; else :data:`OFF` (asked again next time: cheap, no import).
    """
    made = _MADE.get("default")
    if made is not None:
        return made
    with _lock:
        if "default" in _MADE:
            return _MADE["default"]
        application = _global_provider()
        if application is not None:
            return _MADE.setdefault("default", Traces(application.get_tracer(SCOPE)))
        made = from_env()
        if not made.enabled:
            return OFF
        from opentelemetry import trace

        trace.set_tracer_provider(made.provider)
        return _MADE.setdefault("default", made)


def flush() -> None:
    """Send the process's buffered spans now (at the end of a command, before a hard exit)."""
    made = _MADE.get("default")
    if made is not None:
        made.flush()


def _global_provider() -> Any:
    """The application's own global provider, if it installed one (never imports OpenTelemetry)."""
    api = sys.modules.get("opentelemetry.trace")
    if api is None:
        return None
    current = api.get_tracer_provider()
    if isinstance(current, api.ProxyTracerProvider | api.NoOpTracerProvider):
        return None
    return current


def annotate(span: Any, attributes: Mapping[str, Any]) -> None:
    """Set attributes on a span from :meth:`Traces.span` (None when off: nothing to do)."""
    if span is not None:
        span.set_attributes(dict(attributes))


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span in this thread; None when there is none."""
    api = sys.modules.get("opentelemetry.trace")
    return None if api is None else _traceparent(api.get_current_span())


def _client() -> Any:
    from opentelemetry.trace import SpanKind

    return SpanKind.CLIENT


def _traceparent(span: Any) -> str | None:
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
