"""Traces sent over OTLP/HTTP to a real receiver on loopback, configured only by ``OTEL_*`` variables.

Each test makes its own provider from a mapping of variables (:func:`plangate.tracing.from_env`),
never the process's global one; what needs a global provider (an application's own, the
command line's) runs in a process of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from opentelemetry import trace

from plangate import Catalogue, Policy, RunContext, tool, tracing
from plangate.cli import main
from plangate.errors import UsageError
from plangate.models.test import ScriptedModel
from plangate.planner import Planner
from plangate.react import ReActAgent
from plangate.runtime import Runtime
from plangate.store import open_store
from tests.conftest import EXAMPLES
from tests.helpers import FixedClock, plan
from tests.otlp import Receiver, Span, otlp_receiver

ROOT = Path(__file__).resolve().parent.parent
ERROR = 2  # opentelemetry.proto.trace.v1.Status.STATUS_CODE_ERROR


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with otlp_receiver() as found:
        yield found


@pytest.fixture
def env(receiver: Receiver) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": "plangate-test",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-team=governance,authorization=Bearer%20abc",
    }


@pytest.fixture
def traces(env: dict[str, str]) -> Iterator[tracing.Traces]:
    made = tracing.from_env(env)
    yield made
    made.provider.shutdown()


SEEN: list[dict[str, Any]] = []


@tool
def probe(label: str, ctx: RunContext) -> str:
    """Says which span was current while it ran, and what its context carried."""
    current = trace.get_current_span().get_span_context()
    SEEN.append({"label": label, "span": f"{current.span_id:016x}", "traceparent": ctx.trace_context})
    return label


@tool
async def probe_async(label: str, ctx: RunContext) -> str:
    current = trace.get_current_span().get_span_context()
    SEEN.append({"label": label, "span": f"{current.span_id:016x}", "traceparent": ctx.trace_context})
    return label


ATTEMPTS: list[int] = []


@tool(retries=1)
def flaky(label: str, ctx: RunContext) -> str:
    ATTEMPTS.append(ctx.attempt)
    raise RuntimeError(f"{label} is down")


CAT = Catalogue([probe, probe_async, flaky])


def runtime(
    tmp_path: Path, traces: tracing.Traces, policy: Policy | None = None, catalogue: Catalogue = CAT
) -> Runtime:
    return Runtime(catalogue, policy, db=f"sqlite:///{tmp_path}/plangate.db", clock=FixedClock(), traces=traces)


def sampled(traceparent: str, span: Span) -> bool:
    """A W3C ``traceparent`` naming that span, sampled."""
    prefix, flags = traceparent.rsplit("-", 1)
    return prefix == f"00-{span.trace_id}-{span.span_id}" and int(flags, 16) & 1 == 1


def approved(rt: Runtime, body: dict[str, Any]) -> Any:
    record = rt.submit(body, "ann")
    rt.approve(record.id, "ben", record.hash)
    return record


def test_a_run_is_one_trace_with_a_span_per_step(tmp_path: Path, traces: tracing.Traces, receiver: Receiver) -> None:
    SEEN.clear()
    rt = runtime(tmp_path, traces)
    body = plan(
        {"id": 1, "tool": "probe", "params": {"label": "a"}},
        {"id": 2, "tool": "probe_async", "params": {"label": "b"}},
        {"id": 3, "tool": "probe", "params": {"label": "${1}${2}"}},
        category="reads",
    )
    record = approved(rt, body)
    assert rt.execute(record.id).ok
    traces.flush()

    run = receiver.one("plangate.run")
    assert run.parent_id == "" and run.service == "plangate-test"
    assert run.attributes == {
        "plangate.plan_id": record.id,
        "plangate.plan.version": 1,
        "plangate.plan.hash": record.hash,
        "plangate.plan.category": "reads",
        "plangate.plan.steps": 3,
        "plangate.mode": "plan",
        "plangate.actor": "engine",
        "plangate.run.status": "succeeded",
    }
    assert run.status != ERROR
    steps = {s.attributes["plangate.step_id"]: s for s in receiver.named("plangate.step")}
    assert sorted(steps) == [1, 2, 3]
    for step_id, step in steps.items():
        assert (step.trace_id, step.parent_id) == (run.trace_id, run.span_id)
        assert step.attributes["plangate.plan_id"] == record.id
        assert step.attributes["plangate.step.status"] == "succeeded" and step.status != ERROR
        assert step.attributes["plangate.tool"] == body["steps"][step_id - 1]["tool"]
        assert step.attributes["plangate.step.duration_ms"] >= 0
    # Steps 1 and 2 ran together (a thread, the event loop), step 3 inline: each saw its own span as current.
    by_label = {seen["label"]: seen for seen in SEEN}
    for label, step_id in (("a", 1), ("b", 2), ("ab", 3)):
        span = steps[step_id]
        assert by_label[label]["span"] == span.span_id
        assert sampled(by_label[label]["traceparent"], span)
    sent = receiver.headers[0]
    assert (sent["x-team"], sent["authorization"]) == ("governance", "Bearer abc")


def test_a_halted_run_marks_the_failed_step_and_its_retry(
    tmp_path: Path, traces: tracing.Traces, receiver: Receiver
) -> None:
    ATTEMPTS.clear()
    rt = runtime(tmp_path, traces)
    body = plan(
        {"id": 1, "tool": "probe", "params": {"label": "a"}},
        {"id": 2, "tool": "flaky", "params": {"label": "the bank"}},
        category="reads",
    )
    record = approved(rt, body)
    result = rt.execute(record.id)
    assert result.status == "halted" and ATTEMPTS == [1, 2]
    traces.flush()

    run = receiver.one("plangate.run")
    assert run.status == ERROR and run.message == "RuntimeError: the bank is down"
    assert run.attributes["plangate.run.status"] == "halted" and run.attributes["plangate.halt.step_id"] == 2
    steps = {s.attributes["plangate.step_id"]: s for s in receiver.named("plangate.step")}
    assert steps[1].status != ERROR and steps[1].attributes["plangate.step.status"] == "succeeded"
    failed = steps[2]
    assert failed.status == ERROR and failed.message == "RuntimeError: the bank is down"
    assert failed.attributes["plangate.step.status"] == "failed" and failed.attributes["plangate.step.attempt"] == 2
    names = [name for name, _ in failed.events]
    assert names == ["plangate.step.retry", "plangate.step.attempt"]
    retry = failed.events[0][1]
    assert retry["plangate.step.attempt"] == 2 and "the bank is down" in retry["plangate.step.reason"]

    # A resumed run is a trace of its own, under the same plan id.
    rt.resume(record.id)
    traces.flush()
    runs = receiver.named("plangate.run")
    assert len(runs) == 2 and runs[0].trace_id != runs[1].trace_id
    assert {r.attributes["plangate.plan_id"] for r in runs} == {record.id}


def test_an_automatic_approval_is_a_span_too(
    tmp_path: Path, traces: tracing.Traces, receiver: Receiver, catalogue: Catalogue, policy: Policy
) -> None:
    """The policy decides without a person: the decision is still one an operator can see in the trace."""
    rt = runtime(tmp_path, traces, policy, catalogue)
    lookup = {
        "task": "Look up invoice 42",
        "category": "lookups",
        "steps": [{"id": 1, "tool": "get_invoice", "params": {"invoice_id": "42"}, "rationale": "The total."}],
    }
    record = rt.submit(lookup, "alice")
    assert record.status == "approved"
    traces.flush()
    [span] = receiver.named("plangate.approval")
    assert span.attributes["plangate.approval.kind"] == "auto" and span.attributes["plangate.plan_id"] == record.id
    assert span.attributes["plangate.approval.actor"] == "policy:example-business"
    assert span.attributes["plangate.plan.hash"] == record.hash and span.attributes["plangate.approval.reasons"]


def test_traces_asked_for_without_the_extra_say_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from plangate import _otelconfig

    def missing(env: Any) -> Any:
        raise ImportError("No module named 'opentelemetry.sdk'")

    monkeypatch.setattr(_otelconfig, "provider", missing)
    monkeypatch.setattr(tracing, "_MISSING_SAID", threading.Event())
    asked = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    assert tracing.from_env(asked) is tracing.OFF and tracing.from_env(asked) is tracing.OFF
    said = [r.getMessage() for r in caplog.records if r.name == "plangate"]
    assert said == [
        "the OTEL_* variables ask for traces, but the otel extra is not installed "
        "(pip install 'plangate[otel]'): tracing is off"
    ]


def test_approvals_are_spans_with_who_and_what(
    tmp_path: Path, traces: tracing.Traces, receiver: Receiver, catalogue: Catalogue, policy: Policy
) -> None:
    rt = runtime(tmp_path, traces, policy, catalogue)
    record = rt.submit(json.loads((EXAMPLES / "plans" / "refund.json").read_text()), "alice")
    rt.approve(record.id, "dave", record.hash, comment="ok")
    with pytest.raises(Exception, match="may not approve it"):
        rt.approve(record.id, "alice", record.hash)
    rt.reject(record.id, "carol", "not this customer")
    traces.flush()

    dave, alice, carol = receiver.named("plangate.approval")
    assert dave.attributes == {
        "plangate.plan_id": record.id,
        "plangate.plan.version": 1,
        "plangate.plan.hash": record.hash,
        "plangate.plan.status": "pending_approval",
        "plangate.approval.actor": "dave",
        "plangate.approval.decision": "approved",
        "plangate.approval.role": "approver",
    }
    assert dave.status != ERROR and dave.parent_id == ""
    assert alice.status == ERROR and "may not approve it" in alice.message
    assert alice.attributes["plangate.approval.actor"] == "alice"
    assert carol.attributes["plangate.approval.decision"] == "rejected"
    assert carol.attributes["plangate.plan.status"] == "rejected"
    assert carol.attributes["plangate.approval.role"] == "privacy-officer"


PLAN_TEXT = json.dumps(plan({"id": 1, "tool": "probe", "params": {"label": "a"}}, category="reads"))


def test_planner_calls_are_genai_chat_spans(traces: tracing.Traces, receiver: Receiver) -> None:
    model = ScriptedModel(["not a plan", PLAN_TEXT], name="scripted:planner-1")
    result = Planner(CAT, model=model, traces=traces, use_library=False).plan("probe a")
    assert result.plan.steps[0].tool == "probe"
    traces.flush()

    first, repair = receiver.named("chat planner-1")
    assert first.attributes["plangate.purpose"] == "plan" and repair.attributes["plangate.purpose"] == "repair"
    calls = result.calls
    for span, call in ((first, calls[0]), (repair, calls[1])):
        attributes = span.attributes
        assert attributes["gen_ai.operation.name"] == "chat"
        assert attributes["gen_ai.request.model"] == "planner-1"
        assert attributes["gen_ai.system"] == attributes["gen_ai.provider.name"] == "scripted"
        assert attributes["gen_ai.response.model"] == "scripted:planner-1"
        assert attributes["gen_ai.usage.input_tokens"] == call.input_tokens > 0
        assert attributes["gen_ai.usage.output_tokens"] == call.output_tokens > 0
        assert attributes["gen_ai.response.finish_reasons"] == ["end_turn"]

    failing = ScriptedModel([], name="scripted:empty")
    with pytest.raises(Exception, match="no reply left"):
        Planner(CAT, model=failing, traces=traces, use_library=False).plan("probe a")
    traces.flush()
    assert receiver.one("chat empty").status == ERROR


def test_react_turns_and_actions_share_the_run_trace(
    tmp_path: Path, traces: tracing.Traces, receiver: Receiver
) -> None:
    SEEN.clear()
    store = open_store(f"sqlite:///{tmp_path}/plangate.db")
    model = ScriptedModel(["Thought: look\nAction: probe\nAction Input: x", "Final Answer: x"], name="scripted:r")
    agent = ReActAgent(model, CAT, store, clock=FixedClock(), traces=traces)
    result = agent.run("what is x?")
    assert result.answer == "x"
    traces.flush()

    run = receiver.one("plangate.react")
    assert run.attributes["plangate.plan_id"] == result.run_id and run.attributes["plangate.mode"] == "react"
    assert run.attributes["plangate.run.status"] == result.status
    turns = receiver.named("chat r")
    action = receiver.one("plangate.react.action")
    assert len(turns) == 2 and action.attributes["plangate.tool"] == "probe"
    for span in (*turns, action):
        assert (span.trace_id, span.parent_id) == (run.trace_id, run.span_id)
        assert span.attributes["plangate.plan_id"] == result.run_id
    assert SEEN[0]["span"] == action.span_id
    assert sampled(SEEN[0]["traceparent"], action)


def test_nothing_is_set_up_without_otel_variables() -> None:
    assert tracing.from_env({}) is tracing.OFF
    assert tracing.from_env({"OTEL_SERVICE_NAME": "x"}) is tracing.OFF
    assert tracing.from_env({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://h"}) is tracing.OFF
    assert tracing.from_env({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://h"}) is tracing.OFF
    with pytest.raises(UsageError, match="'zipkin' is not supported"):
        tracing.from_env({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(UsageError, match="'grpc' is not supported"):
        tracing.from_env({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    # A whole run in a process with none of the variables: OpenTelemetry is never even imported.
    script = """
import sys
from plangate import Catalogue, tool
from plangate.runtime import Runtime

@tool
def echo(x: str) -> str:
    return x

rt = Runtime(Catalogue([echo]), db="sqlite:///:memory:")
record = rt.submit({"task": "t", "category": "c", "steps": [{"id": 1, "tool": "echo", "params": {"x": "a"},
                    "rationale": "r"}]}, "ann")
rt.approve(record.id, "ben", record.hash)
assert rt.execute(record.id).ok
print(rt.traces is __import__("plangate.tracing").tracing.OFF, sorted(m for m in sys.modules if "opentelemetry" in m))
"""
    done = subprocess.run([sys.executable, "-c", script], env=_env(), capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout) == (0, "True []\n"), done.stderr


def _env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return {**base, "PYTHONPATH": str(ROOT / "src"), **extra}


def test_a_short_cli_command_sends_its_spans_before_it_ends(
    tmp_path: Path, receiver: Receiver, env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{tmp_path}/plangate.db"
    monkeypatch.setenv("PLANGATE_DB", db)
    tools, policy = str(EXAMPLES / "business.py"), str(EXAMPLES / "policy.yaml")
    refund = str(EXAMPLES / "plans" / "refund.json")
    out = CliRunner().invoke(main, ["submit", refund, "--tools", tools, "--policy", policy, "--as", "alice", "--json"])
    record = json.loads(out.stdout)
    for approver in ("dave", "carol"):
        out = CliRunner().invoke(main, ["approve", record["id"], "--as", approver, "--hash", record["hash"]])
        assert out.exit_code == 0, out.stderr
    done = subprocess.run(
        [sys.executable, "-m", "plangate", "execute", record["id"], "--as", "ops"],
        env=_env(**env, PLANGATE_DB=db, OTEL_BSP_SCHEDULE_DELAY="600000"),  # no batch goes out on a timer
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    run = receiver.one("plangate.run")
    assert run.attributes["plangate.plan_id"] == record["id"] and run.service == "plangate-test"
    steps = receiver.named("plangate.step")
    assert len(steps) == 4 and {s.parent_id for s in steps} == {run.span_id}


APPLICATION = """
import sys
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from plangate import Catalogue, RunContext, tool
from plangate.runtime import Runtime

provider = TracerProvider(resource=Resource.create({"service.name": "the-application"}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=sys.argv[1] + "/v1/traces")))
trace.set_tracer_provider(provider)

@tool
def lookup(key: str, ctx: RunContext) -> str:
    with trace.get_tracer("lookup-client").start_as_current_span("lookup.http", attributes={"key": key}):
        with trace.get_tracer("lookup-client").start_as_current_span("lookup.parse"):
            return key.upper()

rt = Runtime(Catalogue([lookup]), db="sqlite:///:memory:")
steps = [{"id": i, "tool": "lookup", "params": {"key": k}, "rationale": "r"} for i, k in ((1, "a"), (2, "b"))]
record = rt.submit({"task": "t", "category": "c", "steps": steps}, "ann")
rt.approve(record.id, "ben", record.hash)
assert rt.execute(record.id).ok
"""


def test_an_application_provider_is_used_and_tool_spans_join_the_step(receiver: Receiver) -> None:
    done = subprocess.run(
        [sys.executable, "-c", APPLICATION, receiver.url], env=_env(), capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    run = receiver.one("plangate.run")
    assert run.service == "the-application"
    steps = {s.span_id: s for s in receiver.named("plangate.step")}
    calls = receiver.named("lookup.http")
    assert len(steps) == len(calls) == 2
    for call in calls:
        step = steps[call.parent_id]
        assert call.trace_id == step.trace_id == run.trace_id
        assert call.attributes["key"] == {1: "a", 2: "b"}[step.attributes["plangate.step_id"]]
    parses = receiver.named("lookup.parse")
    assert {p.parent_id for p in parses} == {c.span_id for c in calls}
    assert receiver.one("plangate.approval").attributes["plangate.approval.actor"] == "ben"
