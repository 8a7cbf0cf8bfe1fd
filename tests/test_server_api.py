"""The JSON API covers every command that records a decision or starts work, with the dashboard's rules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue, Policy
from plangate.store import open_store
from tests import serverkit
from tests.helpers import died_during
from tests.serverkit import MAIL, api, browser, state


@pytest.fixture
def setup(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> dict[str, Any]:
    return serverkit.setup(tmp_path, catalogue, policy)


def halted(setup: dict[str, Any]) -> dict[str, Any]:
    """A plan halted with step 1's outcome unknown: its process died during the email, which is not idempotent."""
    plan: dict[str, Any] = api(setup, "alice").post("/api/plans", json=MAIL).json()
    assert api(setup, "dave").post(f"/api/plans/{plan['id']}/approve", json={"hash": plan["hash"]}).status_code == 200
    store = open_store(setup["db"])
    died_during(store, plan["id"], 1)
    store.close()
    assert api(setup, "alice").post(f"/api/plans/{plan['id']}/execute").json()["status"] == "halted"
    return plan


def step_status(setup: dict[str, Any], plan_id: str, step: int) -> str:
    store = open_store(setup["db"])
    try:
        return store.steps(plan_id)[step].status
    finally:
        store.close()


def test_settle_then_resume(setup: dict[str, Any]) -> None:
    plan = halted(setup)
    url = f"/api/plans/{plan['id']}"
    not_done = {"step": 1, "done": False, "note": "no email in the outbox"}
    before = state(setup)
    refusals = {
        "alice": (403, "may not decide"),  # a requester
        "erin": (403, "category 'refunds'"),  # an approver of another category
        "audrey": (403, "auditor"),
    }
    for who, (status, message) in refusals.items():
        reply = api(setup, who).post(f"{url}/settle", json=not_done)
        assert reply.status_code == status and message in reply.json()["error"], (who, reply.text)
    assert serverkit.TestClient(setup["app"]).post(f"{url}/settle", json=not_done).status_code == 401
    unknown_step = api(setup, "dave").post(f"{url}/settle", json={**not_done, "step": 9})
    assert unknown_step.status_code in (404, 409, 422) and "9" in unknown_step.json()["error"]
    running_too_soon = api(setup, "audrey").post(f"{url}/resume")
    assert running_too_soon.status_code == 403
    assert state(setup) == before

    settled = api(setup, "dave").post(f"{url}/settle", json=not_done)
    assert settled.status_code == 200 and settled.json()["status"] == "halted"
    assert step_status(setup, plan["id"], 1) == "failed"
    resumed = api(setup, "alice").post(f"{url}/resume")
    assert resumed.status_code == 200 and resumed.json()["status"] == "succeeded", resumed.text
    again = api(setup, "alice").post(f"{url}/resume")
    assert again.status_code == 409 and "only a halted plan resumes" in again.json()["error"]
    kinds = [e["kind"] for e in api(setup, "audrey").get(f"{url}/trace").json()]
    assert "step.settled" in kinds and kinds[-1] == "run.succeeded"


def test_settle_as_done_with_the_output_seen(setup: dict[str, Any]) -> None:
    plan = halted(setup)
    url = f"/api/plans/{plan['id']}/settle"
    done = api(setup, "carol").post(url, json={"step": 1, "done": True, "output": "sent", "note": "in the outbox"})
    assert done.status_code == 200, done.text
    assert step_status(setup, plan["id"], 1) == "succeeded"


def test_compensate(setup: dict[str, Any]) -> None:
    plan = halted(setup)
    url = f"/api/plans/{plan['id']}/compensate"
    before = state(setup)
    assert api(setup, "alice").post(url, json={"reason": "cancelled"}).status_code == 403
    assert api(setup, "audrey").post(url, json={"reason": "cancelled"}).status_code == 403
    no_reason = api(setup, "dave").post(url, json={"reason": " "})
    assert no_reason.status_code == 422 and "say why" in no_reason.json()["error"]
    assert api(setup, "dave").post(url, json={}).status_code == 422
    assert state(setup) == before
    api(setup, "dave").post(f"/api/plans/{plan['id']}/settle", json={"step": 1, "done": False})
    done = api(setup, "dave").post(url, json={"reason": "cancelled"})
    assert done.status_code == 200 and done.json()["status"] == "compensated", done.text
    assert done.json()["summary"].startswith("compensated")
    again = api(setup, "dave").post(url, json={"reason": "twice"})
    assert again.status_code == 409


def test_a_plan_that_is_not_halted_is_neither_settled_resumed_nor_rolled_back(setup: dict[str, Any]) -> None:
    plan = api(setup, "alice").post("/api/plans", json=MAIL).json()
    before = state(setup)
    url = f"/api/plans/{plan['id']}"
    for action, body in (("settle", {"step": 1, "done": False}), ("compensate", {"reason": "r"}), ("resume", None)):
        reply = api(setup, "carol").post(f"{url}/{action}", json=body)
        assert reply.status_code == 409, (action, reply.text)
    assert api(setup, "carol").post("/api/plans/no-such-plan/resume").status_code == 404
    assert state(setup) == before


def test_the_register(setup: dict[str, Any]) -> None:
    change = {"category": "lookups", "state": "on", "reason": "6 months, no edits"}
    before = state(setup)
    assert api(setup, "dave").get("/api/register").json() == {
        "entries": [],
        "report": [],
        "left_out": [],
        "left_out_unseen": 0,
    }
    refused = api(setup, "dave").post("/api/register", json=change)
    assert refused.status_code == 403 and "governance does that" in refused.json()["error"]
    assert api(setup, "audrey").post("/api/register", json=change).status_code == 403
    assert serverkit.TestClient(setup["app"]).post("/api/register", json=change).status_code == 401
    session, _ = browser(setup, "gina")
    assert session.post("/api/register", json=change).status_code == 403, "a session's JSON call needs its CSRF header"
    assert state(setup) == before
    done = api(setup, "gina").post("/api/register", json=change)
    assert done.status_code == 200 and done.json()["auto"] is True and done.json()["changed_by"] == "gina"
    entries = api(setup, "audrey").get("/api/register").json()["entries"]
    assert [(e["category"], e["auto"], e["reason"]) for e in entries] == [("lookups", True, "6 months, no edits")]


def test_the_register_report(setup: dict[str, Any]) -> None:
    plan = api(setup, "alice").post("/api/plans", json=MAIL).json()
    api(setup, "dave").post(f"/api/plans/{plan['id']}/approve", json={"hash": plan["hash"]})
    report = api(setup, "alice").get("/api/register?days=30").json()["report"]
    assert [(r["category"], r["plans"], r["approved"], r["approval_rate"]) for r in report] == [("refunds", 1, 1, 1.0)]


def test_audit_verify_is_for_auditors_and_governance(setup: dict[str, Any]) -> None:
    api(setup, "alice").post("/api/plans", json=MAIL)
    for who in ("alice", "dave"):
        reply = api(setup, who).get("/api/audit/verify")
        assert reply.status_code == 403 and "auditors and governance" in reply.json()["error"]
    for who in ("audrey", "gina"):
        report = api(setup, who).get("/api/audit/verify").json()
        assert report["ok"] is True and report["events"] >= 1 and report["summary"].startswith("audit log intact")


def test_close(setup: dict[str, Any]) -> None:
    plan = halted(setup)
    url = f"/api/plans/{plan['id']}"
    before = state(setup)
    for who in ("alice", "erin", "audrey"):  # the requester, an approver of another category, an auditor
        assert api(setup, who).post(f"{url}/close", json={"reason": "done"}).status_code == 403, who
    assert serverkit.TestClient(setup["app"]).post(f"{url}/close", json={"reason": "done"}).status_code == 401
    assert api(setup, "dave").post(f"{url}/close", json={}).status_code == 422
    no_reason = api(setup, "dave").post(f"{url}/close", json={"reason": " "})
    assert no_reason.status_code == 422 and "say why" in no_reason.json()["error"]
    unknown = api(setup, "dave").post(f"{url}/close", json={"reason": "done"})
    assert unknown.status_code == 409 and "settle it first" in unknown.json()["error"]
    assert state(setup) == before

    api(setup, "dave").post(f"{url}/settle", json={"step": 1, "done": True, "output": "sent"})
    closed = api(setup, "dave").post(f"{url}/close", json={"reason": "the email went out; nothing more to do"})
    assert closed.status_code == 200 and closed.json()["status"] == "closed", closed.text
    for action, body in (
        ("resume", None),
        ("execute", None),
        ("compensate", {"reason": "r"}),
        ("close", {"reason": "r"}),
    ):
        reply = api(setup, "carol").post(f"{url}/{action}", json=body)
        assert reply.status_code == 409 and "was closed by dave" in reply.json()["error"], (action, reply.text)
    event = api(setup, "audrey").get(f"{url}/trace").json()[-1]
    assert (event["kind"], event["actor"], event["data"]["reason"]) == (
        "plan.closed",
        "dave",
        "the email went out; nothing more to do",
    )
    assert [p["id"] for p in api(setup, "audrey").get("/api/plans?status=closed").json()] == [plan["id"]]


def test_edit_and_diff(setup: dict[str, Any]) -> None:
    plan = api(setup, "alice").post("/api/plans", json=MAIL).json()
    url = f"/api/plans/{plan['id']}"
    only_one = api(setup, "alice").get(f"{url}/diff")
    assert only_one.status_code == 404 and "no version before v1" in only_one.json()["error"]
    edited = {**MAIL, "steps": [{**MAIL["steps"][0], "params": {**MAIL["steps"][0]["params"], "subject": "Hello"}}]}
    assert api(setup, "audrey").post(f"{url}/edit", json={"plan": edited}).status_code == 403
    assert api(setup, "erin").post(f"{url}/edit", json={"plan": edited}).status_code == 403, "a plan erin cannot see"
    reply = api(setup, "alice").post(f"{url}/edit", json={"plan": edited})
    assert reply.status_code == 200 and (reply.json()["version"], reply.json()["status"]) == (2, "pending_approval")
    diff = api(setup, "dave").get(f"{url}/diff").json()
    assert (diff["from_version"], diff["to_version"]) == (1, 2)
    assert diff["steps"] == [
        {
            "id": 1,
            "kind": "changed",
            "tool": "send_email",
            "fields": [{"field": "params.subject", "old": "s", "new": "Hello"}],
        }
    ]
    same = api(setup, "dave").get(f"{url}/diff?from=2&to=2").json()
    assert same["steps"] == [] and same["fields"] == []
    assert api(setup, "dave").get(f"{url}/diff?from=9").status_code == 404
    assert api(setup, "dave").get(f"{url}/diff?from=0").status_code == 422
    assert api(setup, "erin").get(f"{url}/diff").status_code == 403


def test_review_says_what_show_prints(setup: dict[str, Any]) -> None:
    plan = halted(setup)
    review = api(setup, "dave").get(f"/api/plans/{plan['id']}/review").json()
    assert review["reasons"] == api(setup, "dave").get(f"/api/plans/{plan['id']}").json()["policy"]["reasons"]
    (step,) = review["steps"]
    assert (step["effect"], step["external"], step["status"]) == ("irreversible", True, "outcome_unknown")
    assert api(setup, "erin").get(f"/api/plans/{plan['id']}/review").status_code == 403


def test_an_approval_without_a_hash_is_a_validation_error_not_a_conflict(setup: dict[str, Any]) -> None:
    plan: dict[str, Any] = api(setup, "alice").post("/api/plans", json=MAIL).json()
    dave = api(setup, "dave")
    for body, said in [
        ({}, "the body does not fit: hash: Field required"),
        ({"comment": "fine"}, "the body does not fit: hash: Field required"),
        ({"hash": None}, "the body does not fit: hash: Input should be a valid string"),
        ({"hash": ""}, "an approval names the hash of the version you reviewed; none was given"),
    ]:
        reply = dave.post(f"/api/plans/{plan['id']}/approve", json=body)
        assert (reply.status_code, reply.json()["error"]) == (422, said), body
    assert dave.post(f"/api/plans/{plan['id']}/reject", json={"hash": "f" * 64, "comment": "no"}).status_code == 409
    rejected = dave.post(f"/api/plans/{plan['id']}/reject", json={"comment": "no"})
    assert rejected.status_code == 200 and rejected.json()["status"] == "rejected", "a rejection may name no version"


def test_the_register_refuses_to_clear_a_category_the_server_s_policy_sends_to_a_person(setup: dict[str, Any]) -> None:
    change = {"category": "refunds", "state": "on", "reason": "faster"}
    refused = api(setup, "gina").post("/api/register", json=change)
    assert refused.status_code == 409
    assert "sends category 'refunds' to a person (approval.human)" in refused.json()["error"]
    assert api(setup, "gina").get("/api/register").json()["entries"] == []
    forced = api(setup, "gina").post("/api/register", json={**change, "force": True})
    assert forced.status_code == 200 and forced.json()["auto"] is True
