"""Two plans' runs side by side: the command line, the JSON API and the dashboard page, within read scopes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from plangate import Catalogue, Policy
from plangate.cli import main
from plangate.runtime import Runtime
from tests import serverkit
from tests.helpers import FixedClock, plan
from tests.serverkit import MAIL, api, browser
from tests.test_replay import BROKEN, CALLS, CAT, POLICY, executed

ONE = plan(
    {"id": 1, "tool": "get_invoice", "params": {"invoice_id": "41"}},
    {"id": 2, "tool": "refund", "params": {"invoice_id": "${1.customer}", "amount": "${1.total}"}},
)
TWO = plan(
    {"id": 1, "tool": "get_invoice", "params": {"invoice_id": "43"}},
    {"id": 2, "tool": "refund", "params": {"invoice_id": "42", "amount": "${1.total}"}},
    {"id": 3, "tool": "notify", "params": {"to": "ops", "text": "done"}},
)


@pytest.fixture
def rt(tmp_path: Path) -> Runtime:
    CALLS.clear()
    BROKEN.clear()
    return Runtime(CAT, POLICY, db=f"sqlite:///{tmp_path}/diff.db", clock=FixedClock())


def test_two_runs_side_by_side_on_the_command_line(rt: Runtime) -> None:
    a = executed(rt, ONE)
    BROKEN.add("42")
    b = executed(rt, TWO)
    diff = rt.compare(a, b)
    assert (diff.a_status, diff.b_status) == ("succeeded", "halted") and not diff.same
    by_id = {p.id: p for p in diff.steps}
    assert by_id[1].differs == ("params", "output") and by_id[1].ms_change is not None
    assert by_id[2].a is not None and by_id[2].a.params == {"invoice_id": "c-41", "amount": 20.0}  # as resolved
    assert by_id[2].b is not None and by_id[2].b.status == "failed"
    assert by_id[3].a is None and by_id[3].differs == ("step",)
    result = CliRunner().invoke(main, ["diff", a, b, "--db", rt.store.url])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"plan {a} (succeeded) vs plan {b} (halted)"
    assert lines[1].split() == ["step", "tool", "status", "a", "status", "b", "ms", "a", "ms", "b", "change", "differs"]
    assert lines[3].split()[:4] == ["2", "refund", "succeeded", "failed"]
    assert '  step 1 params: {"invoice_id": "41"} -> {"invoice_id": "43"}' in lines
    result = CliRunner().invoke(main, ["diff", a, b, "--db", rt.store.url, "--json"])
    report = json.loads(result.stdout)
    assert report["same"] is False and [s["id"] for s in report["steps"]] == [1, 2, 3]
    assert report["steps"][2]["a"] is None and report["steps"][2]["b"]["status"] == "not run"


def test_a_run_against_itself_is_the_same_and_versions_still_diff(rt: Runtime) -> None:
    a = executed(rt, ONE)
    assert rt.compare(a, a).same
    result = CliRunner().invoke(main, ["diff", a, a, "--from", "1", "--db", rt.store.url])
    assert result.exit_code == 2 and "give one ID with them" in result.stderr
    result = CliRunner().invoke(main, ["diff", a, "nosuchplan", "--db", rt.store.url])
    assert result.exit_code == 2 and "no plan 'nosuchplan'" in result.stderr


def test_a_number_and_its_float_differ_as_json_does(rt: Runtime) -> None:
    """``1 == 1.0`` in Python, but a tool given 20 and one given 20.0 were given different JSON: the diff says so."""
    refund = {"id": 1, "tool": "refund", "params": {"invoice_id": "41", "amount": 20}}
    a = executed(rt, plan(refund))
    b = executed(rt, plan({**refund, "params": {**refund["params"], "amount": 20.0}}))
    (step,) = rt.compare(a, b).steps
    assert step.differs == ("params",), step  # the tool took both for 20.0: its outputs are the same
    assert rt.compare(a, a).same


def ran(setup: dict[str, Any], to: str) -> str:
    body = {**MAIL, "steps": [{**MAIL["steps"][0], "params": {**MAIL["steps"][0]["params"], "to": to}}]}
    record = api(setup, "alice").post("/api/plans", json=body).json()
    approval = api(setup, "dave").post(f"/api/plans/{record['id']}/approve", json={"hash": record["hash"]})
    assert approval.status_code == 200
    assert api(setup, "alice").post(f"/api/plans/{record['id']}/execute").json()["status"] == "succeeded"
    return str(record["id"])


def test_the_api_and_the_page_compare_runs_their_reader_may_see(
    tmp_path: Path, catalogue: Catalogue, policy: Policy
) -> None:
    setup = serverkit.setup(tmp_path, catalogue, policy)
    a, b = ran(setup, "ada@example.com"), ran(setup, "alan@example.com")
    reply = api(setup, "dave").get(f"/api/plans/{a}/compare/{b[:8]}")
    assert reply.status_code == 200, reply.text
    step = reply.json()["steps"][0]
    assert step["a"]["params"]["to"] == "ada@example.com" and step["b"]["params"]["to"] == "alan@example.com"
    assert "params" in step["differs"]
    assert api(setup, "erin").get(f"/api/plans/{a}/compare/{b}").status_code == 403  # not erin's category
    assert api(setup, "dave").get(f"/api/plans/{a}/compare/nosuchplan").status_code == 404
    client, _ = browser(setup, "dave")
    assert f'action="/plans/{a}/compare"' in client.get(f"/plans/{a}").text  # the plan page links to it
    page = client.get(f"/plans/{a}/compare", params={"with": b})
    assert page.status_code == 200 and 'id="compare"' in page.text and "alan@example.com" in page.text
    other, _ = browser(setup, "erin")
    assert other.get(f"/plans/{a}/compare", params={"with": b}).status_code == 403


def test_the_side_by_side_view_marks_the_fields_that_differ() -> None:
    from plangate.server.views import _marked

    left = _marked({"amount": 10.0, "id": "42", "note": {"a": 1}}, {"amount": 12.5, "id": "42"})
    assert left == [
        ("{", False),
        ('  "amount": 10.0,', True),
        ('  "id": "42",', False),
        ('  "note": {', True),
        ('    "a": 1', True),
        ("  }", True),
        ("}", False),
    ], "a field the other side lacks differs, every line of it"
    assert _marked("sent", "sent") == [('"sent"', False)] and _marked([1], None) == [
        ("[", True),
        ("  1", True),
        ("]", True),
    ]
