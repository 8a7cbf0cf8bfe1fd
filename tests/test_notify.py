"""Chat notifications against a local receiver, and the signed approve/reject callback."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from plangate import Catalogue, Policy
from plangate.accounts import Accounts
from plangate.notify import SlackNotifier, button_value, sign, verify
from plangate.runtime import Runtime
from plangate.server import create_app
from plangate.store import open_store
from tests.conftest import load_plan

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"


@pytest.fixture
def receiver() -> Iterator[dict[str, Any]]:
    """A webhook receiver on loopback that keeps what it is sent."""
    got: dict[str, Any] = {"posts": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got["posts"].append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            return

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    got["url"] = f"http://127.0.0.1:{server.server_port}/hook"
    yield got
    server.shutdown()
    server.server_close()


def test_a_waiting_plan_is_announced_with_a_link_and_buttons(
    receiver: dict[str, Any], tmp_path: Path, catalogue: Catalogue, policy: Policy
) -> None:
    notify = SlackNotifier(webhook_url=receiver["url"], base_url="http://127.0.0.1:8420")
    runtime = Runtime(catalogue, policy, db=f"sqlite:///{tmp_path}/n.db", notify=notify)
    record = runtime.submit(load_plan("refund"), "alice")
    message = receiver["posts"][0]
    assert f"http://127.0.0.1:8420/plans/{record.id}" in message["text"]
    buttons = message["blocks"][2]["elements"]
    assert [b["action_id"] for b in buttons] == ["plangate_approve", "plangate_reject", "plangate_open"]
    assert buttons[0]["value"] == f"{record.id}:{record.version}:{record.hash}"
    assert "needs approval by a person and by privacy-officer" in message["blocks"][0]["text"]["text"]
    assert runtime.trace(record.id)[-1].kind == "plan.notified"

    broken = Runtime(
        catalogue,
        policy,
        db=f"sqlite:///{tmp_path}/n.db",
        notify=SlackNotifier(webhook_url="http://127.0.0.1:9/none", base_url="x", timeout=1),
    )
    other = broken.submit(load_plan("refund"), "alice")
    assert other.status == "pending_approval", "a failed notice never fails the plan"
    assert broken.trace(other.id)[-1].kind == "plan.notify_failed"


def test_signatures() -> None:
    body = b"payload=%7B%7D"
    now = int(time.time())
    good = sign(SECRET, str(now), body)
    assert verify(SECRET, str(now), body, good, now=now) is None
    assert verify(SECRET, str(now), body + b"x", good, now=now) == "the signature does not match"
    assert verify(SECRET, str(now - 301), body, sign(SECRET, str(now - 301), body), now=now) is not None
    assert verify(SECRET, "soon", body, good, now=now) is not None


def click(app: Any, record: Any, user: str, action: str, *, secret: str = SECRET, name: str = "") -> Any:
    """A click on a button by the chat user with id ``user`` (whose changeable user name is ``name``)."""
    value = button_value(record.id, record.version, record.hash)
    payload = {
        "type": "block_actions",
        "user": {"id": user, "username": name or user, "name": name or user},
        "actions": [{"action_id": action, "value": value, "type": "button"}],
    }
    body = urllib.parse.urlencode({"payload": json.dumps(payload)}).encode()
    stamp = str(int(time.time()))
    headers = {
        "x-slack-request-timestamp": stamp,
        "x-slack-signature": sign(secret, stamp, body),
        "content-type": "application/x-www-form-urlencoded",
    }
    return TestClient(app).post("/slack/actions", content=body, headers=headers)


def test_the_buttons_approve_through_a_signed_callback(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> None:
    db = f"sqlite:///{tmp_path}/cb.db"
    accounts = Accounts(open_store(db))
    accounts.add("dave", "approver", categories=("refunds",), slack_id="U0DAVE")
    accounts.add("alice", "requester", slack_id="U0ALICE")
    app = create_app(catalogue, policy, db=db, secure_cookies=False, slack_signing_secret=SECRET)
    runtime = Runtime(catalogue, policy, db=db)
    record = runtime.submit(load_plan("refund"), "alice")
    waiting = ("a person", "privacy-officer")

    forged = click(app, record, "U0DAVE", "plangate_approve", secret="not the secret")
    assert forged.status_code == 401 and runtime.get(record.id).needs == waiting
    renamed = click(app, record, "U0MALLORY", "plangate_approve", name="dave")  # a chat user who renamed themselves
    assert renamed.status_code == 200 and "linked to no account" in renamed.json()["text"]
    unknown = click(app, record, "U0DAVE", "plangate_approve_all")
    assert unknown.status_code == 400 and "unknown action" in unknown.json()["error"]
    assert click(app, record, "U0DAVE", "plangate_open").json() == {}, "the Review link decides nothing"
    assert runtime.get(record.id).needs == waiting and runtime.get(record.id).status == "pending_approval"
    own = click(app, record, "U0ALICE", "plangate_approve", name="dave")
    assert own.status_code == 200 and own.json()["text"].startswith("Refused")
    done = click(app, record, "U0DAVE", "plangate_approve", name="someone-else")
    assert done.status_code == 200 and "pending_approval" in done.json()["text"]
    assert runtime.get(record.id).needs == ("privacy-officer",)
    approval = runtime.store.approvals(record.id)[0]
    assert (approval.actor, approval.plan_hash) == ("dave", record.hash)


def test_a_webhook_whose_reply_never_ends_does_not_hold_the_submit(
    tmp_path: Path, catalogue: Catalogue, policy: Policy
) -> None:
    """A webhook (or what it redirects to) that answers with endless bytes: the notice reads a few of
    them and goes on, where reading the whole reply would hold the submit, and fill memory, for ever."""

    class Endless(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            self.send_response(200)
            self.send_header("Content-Length", str(10**12))
            self.end_headers()
            try:
                while True:
                    self.wfile.write(b"x" * 65536)
            except OSError:  # the notice hung up
                return

        def log_message(self, *args: Any) -> None:
            return

    server = HTTPServer(("127.0.0.1", 0), Endless)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    notify = SlackNotifier(webhook_url=f"http://127.0.0.1:{server.server_port}/hook", base_url="x")
    runtime = Runtime(catalogue, policy, db=f"sqlite:///{tmp_path}/n.db", notify=notify)
    done: list[Any] = []
    submitting = threading.Thread(target=lambda: done.append(runtime.submit(load_plan("refund"), "alice")), daemon=True)
    submitting.start()
    submitting.join(30)
    try:
        assert done and done[0].status == "pending_approval", "the submit did not come back"
        assert runtime.trace(done[0].id)[-1].kind == "plan.notified"
    finally:
        server.shutdown()
        server.server_close()
