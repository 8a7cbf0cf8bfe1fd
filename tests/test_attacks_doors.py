"""The server's doors against a decision sent for an earlier version (a chat button, a stale page, an API call),
a settle form that does not say what happened, and ids guessed by prefix."""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from plangate import Catalogue, Policy
from plangate.accounts import Accounts
from plangate.notify import SlackNotifier, sign
from plangate.runtime import Runtime
from plangate.store import open_store
from tests import serverkit
from tests.helpers import died_during
from tests.serverkit import MAIL, api, browser, state

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
AGAIN = {**MAIL, "task": "Tell the customer, once more"}


@pytest.fixture
def setup(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> dict[str, Any]:
    made = serverkit.setup(tmp_path, catalogue, policy, slack_signing_secret=SECRET)
    store = open_store(made["db"])
    Accounts(store).add("dave", "approver", categories=("refunds",), slack_id="U0DAVE")
    store.close()
    return made


def buttons(setup: dict[str, Any], plan_id: str) -> dict[str, str]:
    """The values of the approve and reject buttons the chat message for the plan's current version carries."""
    runtime = Runtime(db=setup["db"])
    try:
        message = SlackNotifier(webhook_url="http://127.0.0.1:9/hook", base_url="http://x").message(
            runtime.get(plan_id)
        )
    finally:
        runtime.close()
    elements = message["blocks"][2]["elements"]
    return {e["action_id"]: e["value"] for e in elements if "value" in e}


def click(setup: dict[str, Any], action: str, value: str) -> dict[str, Any]:
    payload = {"type": "block_actions", "user": {"id": "U0DAVE"}, "actions": [{"action_id": action, "value": value}]}
    body = urllib.parse.urlencode({"payload": json.dumps(payload)}).encode()
    stamp = str(int(time.time()))
    headers = {
        "x-slack-request-timestamp": stamp,
        "x-slack-signature": sign(SECRET, stamp, body),
        "content-type": "application/x-www-form-urlencoded",
    }
    reply = TestClient(setup["app"]).post("/slack/actions", content=body, headers=headers)
    assert reply.status_code == 200, reply.text
    answer: dict[str, Any] = reply.json()
    return answer


@pytest.mark.parametrize("action", ["plangate_approve", "plangate_reject"])
def test_a_chat_button_does_not_decide_a_later_version_with_the_same_text(setup: dict[str, Any], action: str) -> None:
    alice = api(setup, "alice")
    first = alice.post("/api/plans", json=MAIL).json()
    sent = buttons(setup, first["id"])[action]
    alice.post(f"/api/plans/{first['id']}/edit", json={"plan": AGAIN})
    back = alice.post(f"/api/plans/{first['id']}/edit", json={"plan": MAIL}).json()
    assert (back["version"], back["hash"], back["status"]) == (3, first["hash"], "pending_approval")
    before = state(setup)
    answer = click(setup, action, sent)
    assert answer["text"].startswith("Refused") and "v3" in answer["text"], answer
    assert state(setup) == before, "the button was sent for version 1, not for version 3"
    assert click(setup, action, buttons(setup, first["id"])[action])["text"].startswith("dave: ")


def test_a_chat_button_for_a_rejected_version_does_not_approve_its_text_restored(setup: dict[str, Any]) -> None:
    alice = api(setup, "alice")
    first = alice.post("/api/plans", json=MAIL).json()
    sent = buttons(setup, first["id"])["plangate_approve"]
    rejected = api(setup, "carol").post(f"/api/plans/{first['id']}/reject", json={"comment": "no"})
    assert rejected.json()["status"] == "rejected"
    alice.post(f"/api/plans/{first['id']}/edit", json={"plan": AGAIN})
    alice.post(f"/api/plans/{first['id']}/edit", json={"plan": MAIL})
    before = state(setup)
    assert click(setup, "plangate_approve", sent)["text"].startswith("Refused")
    assert state(setup) == before


def test_a_button_that_names_no_version_decides_nothing(setup: dict[str, Any]) -> None:
    plan = api(setup, "alice").post("/api/plans", json=MAIL).json()
    before = state(setup)
    assert click(setup, "plangate_approve", f"{plan['id']}:{plan['hash']}")["text"].startswith("Refused")
    assert state(setup) == before


def test_a_guessed_prefix_tells_nothing_of_a_plan_the_caller_may_not_see(setup: dict[str, Any]) -> None:
    refund = api(setup, "alice").post("/api/plans", json=MAIL).json()
    erin = api(setup, "erin")  # decides maintenance, not refunds
    for path in ("", "/trace", "/progress", "/review"):
        guessed = erin.get(f"/api/plans/{refund['id'][:6]}{path}")
        assert guessed.status_code == 404, guessed.text
        assert refund["id"] not in guessed.text and "refunds" not in guessed.text, guessed.text
    assert erin.get(f"/api/plans/{refund['id']}").status_code == 403, "the whole id: refused, as before"
    assert api(setup, "dave").get(f"/api/plans/{refund['id'][:6]}").json()["id"] == refund["id"]


def form_fields(page: str, action: str) -> dict[str, str]:
    """The hidden fields of the page's form that posts to ``.../action``: what the page sends when clicked."""
    form = re.search(rf'action="[^"]*/{action}">(.*?)</form>', page, re.S)
    assert form is not None, f"no {action} form on the page"
    return dict(re.findall(r'type="hidden" name="(\w+)" value="([^"]*)"', form.group(1)))


@pytest.mark.parametrize("action", ["approve", "reject"])
def test_a_stale_plan_page_does_not_decide_a_later_version_with_the_same_text(
    setup: dict[str, Any], action: str
) -> None:
    """dave opens version 1; carol rejects it, alice edits it away and back: version 3 has version 1's hash.
    dave's Approve version 1 button must not approve version 3 (the text carol rejected), unseen."""
    alice = api(setup, "alice")
    first = alice.post("/api/plans", json=MAIL).json()
    client, _ = browser(setup, "dave")
    stale = form_fields(client.get(f"/plans/{first['id']}").text, action)
    assert api(setup, "carol").post(f"/api/plans/{first['id']}/reject", json={"comment": "no"}).status_code == 200
    alice.post(f"/api/plans/{first['id']}/edit", json={"plan": AGAIN})
    back = alice.post(f"/api/plans/{first['id']}/edit", json={"plan": MAIL}).json()
    assert (back["version"], back["hash"], back["status"]) == (3, first["hash"], "pending_approval")
    before = state(setup)
    refused = client.post(f"/plans/{first['id']}/{action}", data={**stale, "comment": "ok"}, follow_redirects=False)
    assert refused.status_code == 303 and "Refused" in urllib.parse.unquote_plus(refused.headers["location"])
    assert "v3" in urllib.parse.unquote_plus(refused.headers["location"]), refused.headers["location"]
    assert state(setup) == before, "the page was for version 1, not version 3"
    fresh = form_fields(client.get(f"/plans/{first['id']}").text, action)
    decided = client.post(f"/plans/{first['id']}/{action}", data={**fresh, "comment": "ok"}, follow_redirects=False)
    assert "Refused" not in urllib.parse.unquote_plus(decided.headers["location"])
    assert api(setup, "audrey").get(f"/api/plans/{first['id']}").json()["status"] == f"{action.removesuffix('e')}ed"


def test_an_api_decision_that_names_its_version_holds_to_it(setup: dict[str, Any]) -> None:
    alice = api(setup, "alice")
    first = alice.post("/api/plans", json=MAIL).json()
    alice.post(f"/api/plans/{first['id']}/edit", json={"plan": AGAIN})
    alice.post(f"/api/plans/{first['id']}/edit", json={"plan": MAIL})
    before = state(setup)
    url = f"/api/plans/{first['id']}"
    for action, body in (("approve", {"hash": first["hash"]}), ("reject", {"comment": "no", "hash": first["hash"]})):
        stale = api(setup, "dave").post(f"{url}/{action}", json={**body, "version": 1})
        assert stale.status_code == 409 and "v3" in stale.json()["error"], stale.text
    assert state(setup) == before
    done = api(setup, "dave").post(f"{url}/approve", json={"hash": first["hash"], "version": 3})
    assert done.status_code == 200 and done.json()["status"] == "approved", done.text


def test_a_settle_form_that_does_not_say_whether_the_step_happened_is_refused(setup: dict[str, Any]) -> None:
    """Left unsaid, "it did not happen" would let a resume send the email a second time."""
    plan = api(setup, "alice").post("/api/plans", json=MAIL).json()
    api(setup, "dave").post(f"/api/plans/{plan['id']}/approve", json={"hash": plan["hash"]})
    store = open_store(setup["db"])
    died_during(store, plan["id"], 1)
    store.close()
    assert api(setup, "alice").post(f"/api/plans/{plan['id']}/execute").json()["status"] == "halted"
    client, csrf = browser(setup, "dave")
    before = state(setup)
    for done in ({}, {"done": ""}):
        unsaid = client.post(f"/plans/{plan['id']}/settle", data={"step": "1", "csrf": csrf, **done})
        assert unsaid.status_code == 422 and "done" in unsaid.text, unsaid.text
    assert state(setup) == before


def test_a_message_the_server_signed_for_one_plan_says_nothing_on_another(setup: dict[str, Any]) -> None:
    """carol's "Approved by carol" on plan A, carried in a link to plan B, would tell dave B had a first approval."""
    alice = api(setup, "alice")
    a, b = (alice.post("/api/plans", json=plan).json() for plan in (MAIL, AGAIN))
    carol, _ = browser(setup, "carol")
    fields = form_fields(carol.get(f"/plans/{a['id']}").text, "approve")
    approved = carol.post(f"/plans/{a['id']}/approve", data=fields, follow_redirects=False)
    signed = urllib.parse.parse_qs(urllib.parse.urlsplit(approved.headers["location"]).query)
    assert signed["flash"] == ["Approved by carol"]
    dave, _ = browser(setup, "dave")
    assert "Approved by carol" in dave.get(f"/plans/{a['id']}", params=signed).text, "on its own page: shown"
    assert "Approved by carol" not in dave.get(f"/plans/{b['id']}", params=signed).text


def test_a_login_with_a_name_of_a_megabyte_is_refused_before_the_throttle_keeps_it(setup: dict[str, Any]) -> None:
    """The throttle keeps each failed name for 15 minutes: a name as long as a body may be would fill the
    server's memory a megabyte at a time; the login form holds names and passwords to the API's lengths."""
    client = TestClient(setup["app"])
    csrf = serverkit.csrf_in(client.get("/login").text)
    for field in ("name", "password"):
        huge = {"name": "alice", "password": "x" * 8, field: "a" * 1_000_000, "csrf": csrf}
        refused = client.post("/login", data=huge)
        assert refused.status_code == 422 and field in refused.text, refused.text[:300]
    kept = setup["app"].state.plangate.throttle._failures
    assert all(len(key) < 300 for key in kept), "no name of a megabyte is remembered"
