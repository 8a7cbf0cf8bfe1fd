"""Who the server believes: sessions that end on the server, read scopes, and rows written in the database."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue, Policy
from plangate.accounts import Accounts
from plangate.store import open_store
from tests.conftest import load_plan
from tests.serverkit import api, browser, csrf_in, setup


@pytest.fixture
def server(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> dict[str, Any]:
    return setup(tmp_path, catalogue, policy)


def sql(db: str, statement: str, *args: object) -> None:
    with sqlite3.connect(db.removeprefix("sqlite:///")) as conn:
        conn.execute(statement, args)


def test_logout_ends_the_session_on_the_server(server: dict[str, Any]) -> None:
    client, csrf = browser(server, "dave")
    stolen = dict(client.cookies)  # a copy of the cookie, taken before logout
    refused = client.post("/logout", data={"csrf": "wrong"}, follow_redirects=False)
    assert refused.status_code == 403, "logout needs the session's CSRF token"
    assert client.get("/api/plans", headers={"x-csrf-token": csrf}).status_code == 200
    assert client.post("/logout", data={"csrf": csrf}, follow_redirects=False).status_code == 303
    replay = api(server, "dave")
    replay.headers.pop("Authorization")
    replay.cookies.update(stolen)
    assert replay.get("/api/plans").status_code == 401, "the copied cookie names an ended session"


def test_disabling_an_account_ends_its_sessions_and_tokens_at_once(server: dict[str, Any]) -> None:
    client, _ = browser(server, "dave")
    assert client.get("/api/plans").status_code == 200
    accounts = Accounts(open_store(server["db"]))
    accounts.disable("dave")
    assert client.get("/api/plans").status_code == 401
    assert api(server, "dave").get("/api/plans").status_code == 401
    page = client.get("/login")
    login = client.post(
        "/login", data={"name": "dave", "password": "correct horse battery", "csrf": csrf_in(page.text)}
    )
    assert login.status_code == 401


def test_no_row_written_in_the_database_makes_a_session_anyone_else(server: dict[str, Any]) -> None:
    client, csrf = browser(server, "alice")
    sql(server["db"], "UPDATE users SET role = 'governance', categories = '[\"*\"]' WHERE name = 'alice'")
    changed = client.post("/register", data={"category": "refunds", "state": "on", "reason": "x", "csrf": csrf})
    assert changed.status_code == 403, "alice is what the audit log says: a requester"
    plan = api(server, "dave").post("/api/plans", json=load_plan("refund")).json()
    decided = api(server, "alice").post(f"/api/plans/{plan['id']}/approve", json={"hash": plan["hash"]})
    assert decided.status_code == 403
    assert client.get("/api/register").json()["entries"] == []


def test_the_session_secret_is_not_in_the_database(server: dict[str, Any]) -> None:
    keys = [row[0] for row in open_store(server["db"]).query("SELECT key FROM settings")]
    assert not [k for k in keys if "secret" in k]


def test_each_role_sees_only_the_plans_it_may(server: dict[str, Any]) -> None:
    refund = api(server, "alice").post("/api/plans", json=load_plan("refund")).json()
    assert refund["category"] == "refunds"
    mine = api(server, "carol").post("/api/plans", json=load_plan("halt")).json()  # carol's own request
    seen = {who: {p["id"] for p in api(server, who).get("/api/plans").json()} for who in
            ("alice", "dave", "erin", "audrey", "gina", "carol")}  # fmt: skip
    assert seen["alice"] == {refund["id"]}, "a requester sees their own plans"
    assert refund["id"] in seen["dave"], "an approver sees the categories they decide"
    assert refund["id"] not in seen["erin"], "erin decides maintenance, not refunds"
    assert {refund["id"], mine["id"]} <= seen["audrey"] & seen["gina"], "auditors and governance see everything"
    for path in ("", "/trace", "/progress"):
        hidden = api(server, "erin").get(f"/api/plans/{refund['id']}{path}")
        assert hidden.status_code == 403 and "may not see plan" in hidden.json()["error"]
    assert api(server, "erin").post(f"/api/plans/{refund['id']}/execute").status_code == 403
    client, _ = browser(server, "erin")
    assert refund["task"] not in client.get("/plans").text
    assert client.get(f"/plans/{refund['id']}").status_code == 403
    assert client.get(f"/plans/{refund['id']}/trace").status_code == 403


def test_a_crafted_link_cannot_put_words_on_a_plan_page(server: dict[str, Any]) -> None:
    plan = api(server, "alice").post("/api/plans", json=load_plan("refund")).json()
    client, csrf = browser(server, "dave")
    crafted = client.get(f"/plans/{plan['id']}", params={"flash": "Refused: call +1 555 0100 to confirm"}).text
    assert "555 0100" not in crafted
    done = client.post(f"/plans/{plan['id']}/approve", data={"plan_hash": plan["hash"], "csrf": csrf})
    assert done.status_code == 200 and "Approved by dave" in done.text, "the server's own message is shown"
