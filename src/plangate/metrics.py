"""Prometheus metrics: what plangate counts, and the registry a process exposes.

Counting is off until a process that exposes metrics turns it on with :func:`start`: the
server (``/metrics``) and a worker with ``--metrics-port``. Until then every hook below
returns at once (one global read), so the engine's hot path pays nothing for it.

Each process counts what it did itself, in a registry of its own rather than
prometheus_client's global one: a library that imports plangate sees none of it, and a
test can start afresh (:func:`stop`). Prometheus scrapes every process and sums. The
pending approvals are not counted but read from the store at each scrape
(:class:`_PendingApprovals`), so every process that exposes them gives the same number,
whichever process decided.

The hooks are called from where things happen: :func:`plan_moved` from
:func:`plangate.lifecycle.move` (every status change), :func:`step` from the engine's
progress report, :func:`violations` where a check, a deny rule or a ReAct action is
refused, :func:`model_call` where a model call is written to the cost ledger.

prometheus_client (the ``metrics`` extra, part of ``server``) is imported by :func:`start`
only: the core does not need it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from plangate._clock import parse_iso

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from plangate.store import CallRow, PlanRow
    from plangate.violations import Violation

__all__ = ["STEP_STATUSES", "model_call", "plan_moved", "start", "step", "stop", "submitted", "violations"]

STEP_STATUSES = frozenset({"succeeded", "failed", "failed_optional", "skipped", "outcome_unknown"})
"""The outcomes a step is counted under; ``started`` and ``reused`` are not outcomes."""

STEP_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0)
PLAN_BUCKETS = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0)
WAIT_BUCKETS = (10.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 8 * 3600.0, 86400.0, 3 * 86400.0, 7 * 86400.0)


class _Metrics:
    """The instruments, in one registry."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        self.pending = _PendingApprovals()
        self.registry.register(self.pending)
        registry = self.registry
        self.plans = Counter(
            "plangate_plans", "Plans reaching a status (one per transition).", ["status"], registry=registry
        )
        self.steps = Counter("plangate_steps", "Steps by tool and outcome.", ["tool", "status"], registry=registry)
        self.step_seconds = Histogram(
            "plangate_step_duration_seconds",
            "A tool call's duration.",
            ["tool"],
            buckets=STEP_BUCKETS,
            registry=registry,
        )
        self.plan_seconds = Histogram(
            "plangate_plan_duration_seconds",
            "A run, from its start to its end.",
            buckets=PLAN_BUCKETS,
            registry=registry,
        )
        self.wait_seconds = Histogram(
            "plangate_approval_wait_seconds",
            "From a version submitted for approval to a person's decision.",
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.violations = Counter(
            "plangate_policy_violations",
            "Violations that refused a plan, a call or an action.",
            ["rule", "source"],
            registry=registry,
        )
        self.tokens = Counter("plangate_model_tokens", "Model tokens.", ["model", "kind"], registry=registry)
        self.cost = Counter("plangate_model_cost_usd", "Model cost in US dollars.", ["model"], registry=registry)


class _PendingApprovals:
    """``plangate_approvals_pending``: plans waiting for an approver, counted in the store at each scrape."""

    def __init__(self) -> None:
        self.db: str | None = None

    def describe(self) -> Iterable[Metric]:
        return [self._gauge()]

    def collect(self) -> Iterator[Metric]:
        if self.db is None:
            return
        from plangate.store import open_store

        store = open_store(self.db)
        try:
            rows = store.query("SELECT COUNT(*) FROM plans WHERE status = ?", ("pending_approval",))
        finally:
            store.close()
        gauge = self._gauge()
        gauge.add_metric([], float(rows[0][0]))
        yield gauge

    @staticmethod
    def _gauge() -> Any:
        from prometheus_client.core import GaugeMetricFamily

        return GaugeMetricFamily("plangate_approvals_pending", "Plans waiting for an approver (read from the store).")


class _Switch:
    """Whether this process counts, and where: one attribute read per hook."""

    on: _Metrics | None = None
    lock = threading.Lock()


_switch = _Switch()


def start(db: str | None = None) -> CollectorRegistry:
    """Start counting in this process, and give the registry to expose.

    ``db``: the store whose plans waiting for approval ``plangate_approvals_pending``
    reports (one store a process: a later call names the store it reads from then).
    Needs the ``metrics`` extra.
    """
    from plangate._extras import need

    need("metrics", "metrics")
    with _switch.lock:
        if _switch.on is None:
            _switch.on = _Metrics()
        if db is not None:
            _switch.on.pending.db = db
        return _switch.on.registry


def stop() -> None:
    """Stop counting and forget what was counted (the next :func:`start` begins at zero)."""
    _switch.on = None


def exposition(registry: CollectorRegistry, accept: str = "") -> tuple[bytes, str]:
    """The registry in the format the scraper's ``Accept`` header asks for (OpenMetrics, else text), and its type."""
    from prometheus_client.exposition import choose_encoder

    encode, content_type = choose_encoder(accept)
    return encode(registry), content_type


def serve_http(registry: CollectorRegistry, host: str, port: int) -> Any:
    """Serve the registry at ``http://HOST:PORT/metrics`` on a daemon thread; the HTTP server comes back."""
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server


# -- the hooks: each returns at once while nobody counts --------------------------------------
def submitted() -> None:
    """A plan was submitted."""
    if (on := _switch.on) is not None:
        on.plans.labels("submitted").inc()


def plan_moved(plan: PlanRow, to: str, at: str, data: Mapping[str, Any] | None) -> None:
    """``plan`` (as it was) moved to ``to`` at ``at``: the run's duration, or the wait for a person's decision.

    ``data`` is the move's event data: ``by: person`` marks a decision (not the checker's
    refusal or the policy's automatic approval, which take no time and would only hide the wait).
    """
    if (on := _switch.on) is None:
        return
    on.plans.labels(to).inc()
    if plan.status == "running" and to in ("succeeded", "halted"):
        on.plan_seconds.observe(_seconds(plan.updated_at, at))
    elif plan.status == "pending_approval" and to in ("approved", "rejected") and (data or {}).get("by") == "person":
        on.wait_seconds.observe(_seconds(plan.updated_at, at))


def step(tool: str, status: str, ms: float | None) -> None:
    """A step ended (``ms``: its call's duration, when it made one)."""
    if (on := _switch.on) is None or status not in STEP_STATUSES:
        return
    on.steps.labels(tool, status).inc()
    if ms is not None:
        on.step_seconds.labels(tool).observe(ms / 1000)


def violations(found: Iterable[Violation]) -> None:
    """Violations that refused a plan (at submission or an edit), a call (a deny rule) or a ReAct action."""
    if (on := _switch.on) is None:
        return
    for violation in found:
        on.violations.labels(violation.rule, violation.source).inc()


def model_call(row: CallRow) -> None:
    """A model call, as written to the cost ledger: its tokens by kind and its cost."""
    if (on := _switch.on) is None:
        return
    for kind, tokens in (("input", row.input_tokens), ("output", row.output_tokens), ("thinking", row.thinking_tokens)):
        on.tokens.labels(row.model, kind).inc(tokens)
    on.cost.labels(row.model).inc(row.cost or 0.0)


def _seconds(since: str, until: str) -> float:
    return max(0.0, (parse_iso(until) - parse_iso(since)).total_seconds())
