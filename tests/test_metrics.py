"""Prometheus metrics: /metrics after real plans, a worker's metrics port, the pending gauge read from the store,
and Debian's real Prometheus server scraping a running ``plangate serve``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from plangate import Catalogue, Policy, metrics
from plangate.costs import Price, PriceTable
from plangate.models.test import Reply, ScriptedModel
from plangate.planner import Planner
from plangate.runtime import Runtime
from plangate.server import create_app
from plangate.testing import free_port
from tests.conftest import EXAMPLES, ROOT, load_plan
from tests.helpers import FixedClock
from tests.serverkit import serving

TOOLS = str(EXAMPLES / "business.py")
POLICY = str(EXAMPLES / "policy.yaml")
REFUND = {
    "task": "Refund invoice 42",
    "category": "refunds",
    "steps": [
        {"id": 1, "tool": "get_invoice", "params": {"invoice_id": "42"}, "rationale": "Need the total."},
        {"id": 2, "tool": "issue_refund", "params": {"invoice_id": "42", "amount": "${1.total}"}, "rationale": "r"},
    ],
}
"""Needs a person: the refunds category always does."""
LOOKUP = {
    "task": "Look up invoice 42",
    "category": "lookups",
    "steps": [{"id": 1, "tool": "get_invoice", "params": {"invoice_id": "42"}, "rationale": "r"}],
}
"""Approved by the policy on its own: lookups are."""
MISSING = {**LOOKUP, "steps": [{"id": 1, "tool": "get_invoice", "params": {"invoice_id": "999"}, "rationale": "r"}]}
"""A lookup that fails: the run halts."""

DOC_CONFIG = re.compile(r"^```prometheus\n(.*?)^```", re.MULTILINE | re.DOTALL)
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class SteppedClock(FixedClock):
    """The tests' clock, which can also jump ahead (a reviewer who takes their time)."""

    def later(self, seconds: float) -> None:
        self.start += timedelta(seconds=seconds)


@pytest.fixture
def counting() -> Iterator[None]:
    """Counting starts at zero in this test and stops after it."""
    metrics.stop()
    yield
    metrics.stop()


def parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def test_metrics_after_real_plans(tmp_path: Path, catalogue: Catalogue, policy: Policy, counting: None) -> None:
    db = f"sqlite:///{tmp_path}/plangate.db"
    client = TestClient(create_app(catalogue, policy, db=db, secure_cookies=False, metrics=True))
    clock = SteppedClock()
    runtime = Runtime(catalogue, policy, db=db, clock=clock)

    refund = runtime.submit(REFUND, "alice")
    clock.later(90)  # the approver reads it for a minute and a half
    runtime.approve(refund.id, "dave", refund.hash)
    assert runtime.execute(refund.id).ok
    halted = runtime.submit(MISSING, "alice")
    assert runtime.execute(halted.id).status == "halted"
    assert runtime.submit(load_plan("cleanup"), "bob").status == "rejected"

    reply = client.get("/metrics")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain; version=")
    samples = parse(reply.text)
    assert value(samples, "plangate_plans_total", status="submitted") == 3
    assert value(samples, "plangate_plans_total", status="succeeded") == 1
    assert value(samples, "plangate_plans_total", status="halted") == 1
    assert value(samples, "plangate_plans_total", status="rejected") == 1
    assert value(samples, "plangate_plans_total", status="running") == 2
    assert value(samples, "plangate_steps_total", tool="get_invoice", status="succeeded") == 1
    assert value(samples, "plangate_steps_total", tool="issue_refund", status="succeeded") == 1
    assert value(samples, "plangate_steps_total", tool="get_invoice", status="failed") == 1
    assert value(samples, "plangate_step_duration_seconds_count", tool="get_invoice") == 2
    assert value(samples, "plangate_plan_duration_seconds_count") == 2
    # One decision by a person, after 90 s: in the 300 s bucket, not the 60 s one.
    assert value(samples, "plangate_approval_wait_seconds_count") == 1
    assert value(samples, "plangate_approval_wait_seconds_bucket", le="60.0") == 0
    assert value(samples, "plangate_approval_wait_seconds_bucket", le="300.0") == 1
    assert value(samples, "plangate_policy_violations_total", rule="max-external-calls", source="policy") == 1
    assert (
        value(samples, "plangate_policy_violations_total", rule="require:read-only-sql-in-production", source="policy")
        == 1
    )
    assert value(samples, "plangate_approvals_pending") == 0


def test_model_tokens_and_cost_from_a_planner_call(
    tmp_path: Path, catalogue: Catalogue, policy: Policy, counting: None
) -> None:
    db = f"sqlite:///{tmp_path}/plangate.db"
    client = TestClient(create_app(catalogue, policy, db=db, secure_cookies=False, metrics=True))
    runtime = Runtime(catalogue, policy, db=db, clock=FixedClock())
    prices = PriceTable((("scripted:*", Price(input=2.0, output=8.0)),))
    model = ScriptedModel([Reply(text=json.dumps(REFUND), thinking="Read the invoice first, then refund it.")])
    planner = Planner(catalogue, model=model, store=runtime.store, policy=policy, prices=prices, clock=runtime.clock)
    result = planner.plan("Refund invoice 42")
    samples = parse(client.get("/metrics").text)
    usage = result.usage
    assert usage.input > 0 and usage.output > 0 and usage.thinking > 0
    assert value(samples, "plangate_model_tokens_total", model="scripted:test", kind="input") == usage.input
    assert value(samples, "plangate_model_tokens_total", model="scripted:test", kind="output") == usage.output
    assert value(samples, "plangate_model_tokens_total", model="scripted:test", kind="thinking") == usage.thinking
    assert value(samples, "plangate_model_cost_usd_total", model="scripted:test") == pytest.approx(result.cost)
    assert result.cost == pytest.approx((usage.input * 2.0 + max(usage.output, usage.thinking) * 8.0) / 1e6)


def test_the_pending_gauge_reads_the_store_whoever_changes_it(
    tmp_path: Path, catalogue: Catalogue, policy: Policy, counting: None
) -> None:
    db = f"sqlite:///{tmp_path}/plangate.db"
    client = TestClient(create_app(catalogue, policy, db=db, secure_cookies=False, metrics=True))
    pending = lambda: value(parse(client.get("/metrics").text), "plangate_approvals_pending")  # noqa: E731
    assert pending() == 0
    elsewhere = Runtime(catalogue, policy, db=db)  # another runtime, with its own connection
    first, second = elsewhere.submit(REFUND, "alice"), elsewhere.submit(REFUND, "alice")
    assert pending() == 2
    elsewhere.approve(first.id, "dave", first.hash)
    elsewhere.reject(second.id, "dave", "not this one")
    assert pending() == 0
    elsewhere.close()


def test_metrics_can_be_protected_or_turned_off(
    tmp_path: Path, catalogue: Catalogue, policy: Policy, counting: None
) -> None:
    db = f"sqlite:///{tmp_path}/plangate.db"
    guarded = TestClient(create_app(catalogue, policy, db=db, secure_cookies=False, metrics=True, metrics_token="s3"))
    for refused in (guarded.get("/metrics"), guarded.get("/metrics", headers={"Authorization": "Bearer wrong"})):
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert "plangate_" not in refused.text
    assert guarded.get("/metrics", headers={"Authorization": "Bearer s3"}).status_code == 200
    assert TestClient(create_app(catalogue, policy, db=db, secure_cookies=False)).get("/metrics").status_code == 404


def test_counting_is_off_until_a_process_exposes_metrics(catalogue: Catalogue, policy: Policy, tmp_path: Path) -> None:
    metrics.stop()
    runtime = Runtime(catalogue, policy, db=f"sqlite:///{tmp_path}/plangate.db")
    record = runtime.submit(LOOKUP, "alice")
    assert runtime.execute(record.id).ok
    assert metrics._switch.on is None
    registry = metrics.start()
    try:
        assert registry.get_sample_value("plangate_plans_total", {"status": "submitted"}) is None
    finally:
        metrics.stop()


def dashboard_queries() -> list[str]:
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "plangate.json").read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def test_the_dashboard_asks_only_for_metrics_that_exist(tmp_path: Path, counting: None) -> None:
    registry = metrics.start(f"sqlite:///{tmp_path}/plangate.db")
    exposed = {sample for family in registry.collect() for sample in _sample_names(family)}
    wanted = {name for expr in dashboard_queries() for name in re.findall(r"\bplangate_\w+", expr)}
    assert wanted and wanted <= exposed, wanted - exposed
    titles = {
        panel["title"] for panel in json.loads((ROOT / "deploy" / "grafana" / "plangate.json").read_text())["panels"]
    }
    assert {"Step success rate", "Plan latency (run start to end)", "Approvals pending"} <= titles
    assert {"Approval wait (submitted to decided)", "Policy violations by rule", "Model cost (USD, per day)"} <= titles


def _sample_names(family: Any) -> set[str]:
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    return {family.name + suffix for suffix in suffixes[family.type]}


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return str(reply.read().decode())


def _poll(what: str, check: Any, *, seconds: float = 60) -> Any:
    """Ask ``check`` until it gives something truthy (a server needs a moment); fail with ``what`` if it never does."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            got = check()
        except OSError:
            got = None
        if got:
            return got
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.2)


def test_a_worker_serves_its_own_metrics(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> None:
    db = f"sqlite:///{tmp_path}/plangate.db"
    port = free_port()
    command = [sys.executable, "-m", "plangate", "worker", "--tools", TOOLS, "--policy", POLICY, "--db", db]
    log = tmp_path / "worker.log"
    runtime = Runtime(catalogue, policy, db=db)
    waiting = runtime.submit(REFUND, "alice")  # in this process, which counts nothing
    with log.open("wb") as out, subprocess.Popen([*command, "--metrics-port", str(port)], stdout=out, stderr=out) as p:
        try:
            url = f"http://127.0.0.1:{port}/metrics"
            first = parse(_poll("the worker's metrics answer", lambda: _get(url)))
            assert value(first, "plangate_approvals_pending") == 1  # read from the store, not counted
            assert value(first, "plangate_plans_total", status="submitted") is None
            runtime.approve(waiting.id, "dave", waiting.hash)  # decided here; the worker runs it

            def ran() -> Samples | None:
                samples = parse(_get(url))
                return samples if value(samples, "plangate_plans_total", status="succeeded") == 1 else None

            samples = _poll(f"the worker ran the plan: {log.read_text()[-2000:]}", ran)
            assert value(samples, "plangate_approvals_pending") == 0
            assert value(samples, "plangate_steps_total", tool="issue_refund", status="succeeded") == 1
            assert value(samples, "plangate_plans_total", status="approved") is None  # approved in another process
        finally:
            p.terminate()
            p.wait(10)
    runtime.close()


def test_prometheus_scrapes_plangate_serve(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> None:
    db = f"sqlite:///{tmp_path}/plangate.db"
    runtime = Runtime(catalogue, policy, db=db)
    runtime.submit(REFUND, "alice")
    runtime.close()
    with serving(tmp_path, {}, "--tools", TOOLS, "--policy", POLICY, "--db", db) as (url, _server):
        target = urllib.parse.urlsplit(url).netloc
        config = tmp_path / "prometheus.yml"  # the docs' example, scraping this server every second
        example = DOC_CONFIG.search((ROOT / "docs" / "observability.md").read_text())
        assert example is not None
        config.write_text(example[1].replace("15s", "1s").replace("127.0.0.1:8420", target))
        port = free_port()
        arguments = [f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}"]
        arguments.append(f"--web.listen-address=127.0.0.1:{port}")
        log = tmp_path / "prometheus.log"
        with log.open("wb") as out, subprocess.Popen(["/usr/bin/prometheus", *arguments], stdout=out, stderr=out) as p:
            try:
                query = urllib.parse.urlencode({"query": 'plangate_approvals_pending{job="plangate"}'})

                def scraped() -> list[Any]:
                    assert p.poll() is None, log.read_text()[-2000:]
                    answer = json.loads(_get(f"http://127.0.0.1:{port}/api/v1/query?{query}"))
                    assert answer["status"] == "success", answer
                    return list(answer["data"]["result"])

                result = _poll(f"Prometheus scraped plangate: {log.read_text()[-2000:]}", scraped)
                assert result[0]["metric"]["instance"] == target
                assert result[0]["value"][1] == "1"
                for expr in dashboard_queries():  # Grafana is not here; its dashboard's queries run all the same
                    answer = json.loads(
                        _get(
                            f"http://127.0.0.1:{port}/api/v1/query?"
                            + urllib.parse.urlencode({"query": expr.replace("$__rate_interval", "1m")})
                        )
                    )
                    assert answer["status"] == "success", (expr, answer)
            finally:
                p.terminate()
                p.wait(10)
