"""Every door holds: attacks on the server, each answered with a clear 4xx and nothing changed.

Each test sends what an attacker (or a broken client) would, and asserts the status, the
reason, and that the store is exactly as it was.
"""

from __future__ import annotations

import json
import logging
import re
import time
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from plangate import Catalogue, Policy
from plangate.notify import sign
from plangate.server import _deps
from plangate.server._security import CSP
from tests import serverkit
from tests.conftest import load_plan
from tests.serverkit import PASSWORD, api, browser, csrf_in, state

SECRET = "chat-signing-secret"
JSON = {"content-type": "application/json"}


@pytest.fixture
def setup(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> dict[str, Any]:
    done = serverkit.setup(tmp_path, catalogue, policy, slack_signing_secret=SECRET)
    done["plan"] = api(done, "alice").post("/api/plans", json=load_plan("refund")).json()
    return done


def signed(body: bytes) -> dict[str, str]:
    stamp = str(int(time.time()))
    return {
        "x-slack-request-timestamp": stamp,
        "x-slack-signature": sign(SECRET, stamp, body),
        "content-type": "application/x-www-form-urlencoded",
    }


# -- a runtime per request, always closed ----------------------------------------------------------
def test_every_request_closes_the_runtime_it_opened(setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[Any] = []
    closed: list[Any] = []

    class Counted(_deps.Runtime):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            opened.append(self)

        def close(self) -> None:
            closed.append(self)
            super().close()

    monkeypatch.setattr(_deps, "Runtime", Counted)
    plan = setup["plan"]
    client, _ = browser(setup, "dave")
    replies = [
        client.get("/"),
        client.get(f"/plans/{plan['id']}"),
        client.get("/plans/no-such-plan"),
        api(setup, "dave").get("/api/plans"),
        api(setup, "alice").post(f"/api/plans/{plan['id']}/approve", json={"hash": plan["hash"]}),  # 403
        api(setup, "dave").post(f"/api/plans/{plan['id']}/approve", json={"hash": "0" * 64}),  # 409
        api(setup, "dave").post(f"/api/plans/{plan['id']}/approve", json={"hash": 5}),  # 422
        TestClient(setup["app"]).get("/api/plans"),  # 401
        client.post(f"/plans/{plan['id']}/approve", data={"plan_hash": plan["hash"], "csrf": "forged"}),  # 403
    ]
    assert [r.status_code for r in replies] == [200, 200, 404, 200, 403, 409, 422, 401, 403]
    assert len(opened) >= len(replies) and set(map(id, closed)) == set(map(id, opened)) and len(closed) == len(opened)


# -- bodies: the limit, while they stream in -------------------------------------------------------
def chunks(total: int, size: int = 65_536) -> Iterator[bytes]:
    for _ in range(total // size):
        yield b"[" * size


FORM = {"content-type": "application/x-www-form-urlencoded"}


@pytest.mark.parametrize(
    ("path", "kind"),
    [("/api/plans", JSON), ("/slack/actions", FORM), ("/plans/x/approve", FORM), ("/login", FORM)],
)
def test_a_body_over_the_limit_is_refused_with_or_without_a_length(
    setup: dict[str, Any], path: str, kind: dict[str, str]
) -> None:
    before = state(setup)
    with_length = api(setup, "alice").post(path, content=b"x" * 1_100_000, headers=kind)
    chunked = api(setup, "alice").post(path, content=chunks(2_097_152), headers=kind)
    assert "transfer-encoding" not in with_length.request.headers
    assert chunked.request.headers["transfer-encoding"] == "chunked"
    for reply in (with_length, chunked):
        assert reply.status_code == 413 and "over the limit" in reply.text
    assert state(setup) == before


def test_credentials_are_checked_before_the_body_is_read(setup: dict[str, Any]) -> None:
    before = state(setup)
    anonymous = TestClient(setup["app"])
    for path in ("/api/plans", f"/api/plans/{setup['plan']['id']}/approve"):
        reply = anonymous.post(path, content=chunks(2_097_152), headers=JSON)
        assert reply.status_code == 401 and "log in first" in reply.json()["error"]
        deep = anonymous.post(path, content=b"[" * 100_000, headers=JSON)
        assert deep.status_code == 401
    assert state(setup) == before


# -- JSON: one reader, with limits -----------------------------------------------------------------
def plan_text(value: str) -> bytes:
    """The refund plan with ``value`` as raw JSON in place of the refund's amount."""
    text = json.dumps(load_plan("refund"))
    assert text.count('"amount": "${1.total}"') == 1
    return text.replace('"amount": "${1.total}"', f'"amount": {value}').encode()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[" * 100_000, "nested deeper than 64"),
        (b'{"a":' * 65 + b"1" + b"}" * 65, "nested deeper than 64"),
        (plan_text("NaN"), "NaN is not a JSON number"),
        (plan_text("Infinity"), "Infinity is not a JSON number"),
        (plan_text("-Infinity"), "-Infinity is not a JSON number"),
        (plan_text("1e999"), "steps[2].params.amount: non-finite-number"),
        (plan_text("9" * 5000), "steps[2].params.amount: number-too-large"),
        (b'{"task": "a", "task": "b", "category": "x", "steps": []}', "task: duplicate-key"),
        (json.dumps({**load_plan("refund"), "task": "\ud800"}).encode(), "task: lone-surrogate"),
        (b'{"task": "\xff"}', "not-utf8"),
        (b'{"task": "' + b'\\"' * 200_000, "not-json"),
        (b"", "a JSON object"),
        (json.dumps({**load_plan("refund"), "task": "a\u0000b"}).encode(), "task: control-character: U+0000"),
    ],
)
def test_json_that_would_break_something_later_is_refused_first(
    setup: dict[str, Any], body: bytes, message: str
) -> None:
    before = state(setup)
    reply = api(setup, "alice").post("/api/plans", content=body, headers=JSON)
    assert reply.status_code == 400 and message in reply.json()["error"], reply.text
    assert state(setup) == before


def test_json_at_the_depth_limit_is_read() -> None:
    from starlette.exceptions import HTTPException

    from plangate.server._bodies import read_json

    assert read_json(b"[" * 64 + b"]" * 64) == read_json(b"[" * 64 + b"]" * 64)
    with pytest.raises(HTTPException, match="deeper than 64"):
        read_json(b"[" * 65 + b"]" * 65)
    in_text = rb'["' + b"[" * 100 + rb'", "\\", "\"[{"]'
    assert read_json(in_text) == ["[" * 100, "\\", '"[{']


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda text: text.replace('"${1.total}"', "1e999"), "non-finite-number"),
        (lambda text: text.replace('"${1.total}"', "NaN"), "NaN is not a JSON number"),
        (lambda text: text.replace('{"task"', '{"task": "x", "task"'), "duplicate-key"),
        (lambda text: "[" * 200_000, "nested deeper than 64"),
    ],
)
def test_the_edit_form_reads_the_plan_with_the_same_limits(setup: dict[str, Any], change: Any, message: str) -> None:
    plan = setup["plan"]
    before = state(setup)
    client, csrf = browser(setup, "dave")
    text = change(json.dumps(load_plan("refund")))
    for action in ("preview", "save"):
        page = client.post(f"/plans/{plan['id']}/edit", data={"plan": text, "action": action, "csrf": csrf})
        assert page.status_code == 200 and 'id="plan-json"' in page.text and message in page.text, page.text[-500:]
    assert state(setup) == before


def test_a_form_field_with_nul_is_refused(setup: dict[str, Any]) -> None:
    plan = setup["plan"]
    before = state(setup)
    client, csrf = browser(setup, "dave")
    reply = client.post(
        f"/plans/{plan['id']}/reject", data={"plan_hash": plan["hash"], "comment": "a\x00b", "csrf": csrf}
    )
    assert reply.status_code == 400 and "NUL" in reply.text
    assert state(setup) == before


@pytest.mark.parametrize(
    ("action", "body", "where"),
    [
        ("approve", {"hash": 5}, "hash"),
        ("approve", {"hash": ["a"]}, "hash"),
        ("approve", {"hash": None}, "hash"),
        ("approve", {}, "hash"),
        ("approve", {"hash": "{hash}", "comment": {"a": 1}}, "comment"),
        ("approve", {"hash": "{hash}", "comment": 7}, "comment"),
        ("approve", {"hash": "{hash}", "approver": "carol"}, "approver"),
        ("reject", {"comment": {"a": 1}}, "comment"),
        ("reject", {"comment": "no", "hash": ["a"]}, "hash"),
        ("edit", {"plan": [1]}, "plan"),
        ("edit", {"plan": "{}"}, "plan"),
        ("settle", {"step": "1", "done": True}, "step"),
        ("settle", {"step": 1, "done": "yes"}, "done"),
        ("settle", {"step": 1.0, "done": True}, "step"),
        ("settle", {"step": 10**30, "done": False}, "step"),
        ("compensate", {"reason": ["why"]}, "reason"),
    ],
)
def test_body_fields_of_the_wrong_type_are_named(
    setup: dict[str, Any], action: str, body: dict[str, Any], where: str
) -> None:
    plan = setup["plan"]
    body = {k: plan["hash"] if v == "{hash}" else v for k, v in body.items()}
    before = state(setup)
    reply = api(setup, "carol").post(f"/api/plans/{plan['id']}/{action}", json=body)
    assert reply.status_code == 422 and reply.json()["error"].startswith("the body does not fit"), reply.text
    assert where in reply.json()["error"]
    assert state(setup) == before


def test_register_and_form_fields_of_the_wrong_type(setup: dict[str, Any]) -> None:
    before = state(setup)
    gina = api(setup, "gina")
    for body in ({"category": "x", "state": "maybe", "reason": "r"}, {"category": 1, "state": "on", "reason": "r"}):
        reply = gina.post("/api/register", json=body)
        assert reply.status_code == 422, reply.text
    client, csrf = browser(setup, "gina")
    wrong_state = client.post("/register", data={"category": "x", "state": "maybe", "reason": "r", "csrf": csrf})
    assert wrong_state.status_code == 422 and "state" in wrong_state.text
    settle = client.post(f"/plans/{setup['plan']['id']}/settle", data={"step": "one", "done": "yes", "csrf": csrf})
    assert settle.status_code == 422 and "step" in settle.text
    twice = client.post(
        "/register",
        content=f"csrf={csrf}&csrf={csrf}&category=x&state=on&reason=r".encode(),
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert twice.status_code == 400 and "twice" in twice.text
    for days in ("99999999999", "-5", "0", "many"):
        assert client.get(f"/register?days={days}").status_code == 422
        assert gina.get(f"/api/register?days={days}").status_code == 422
    assert state(setup) == before


@pytest.mark.parametrize(
    "payload",
    [
        b"payload=null",
        b"payload=%5B1%5D",
        b"payload=" + urllib.parse.quote(json.dumps({"actions": [{"value": "x:y"}], "user": None})).encode(),
        b"payload=" + urllib.parse.quote(json.dumps({"actions": [5], "user": {"name": "dave"}})).encode(),
        b"payload=" + urllib.parse.quote(json.dumps({"actions": [], "user": {"name": "dave"}})).encode(),
        b"payload="
        + urllib.parse.quote(
            json.dumps({"actions": [{"value": "a:b", "action_id": "plangate_approve"}], "user": {"name": ["dave"]}})
        ).encode(),
        b"payload="
        + urllib.parse.quote(
            json.dumps({"actions": [{"value": "nocolon", "action_id": "plangate_reject"}], "user": {"name": "dave"}})
        ).encode(),
        b"payload=" + b"%5B" * 100_000,
        b"payload=NaN",
        b"payload={",
        b"nothing=here",
        b"\xff\xfe",
        b"",
    ],
)
def test_a_signed_chat_payload_of_the_wrong_shape_is_a_400(setup: dict[str, Any], payload: bytes) -> None:
    before = state(setup)
    reply = TestClient(setup["app"]).post("/slack/actions", content=payload, headers=signed(payload))
    assert reply.status_code == 400 and "payload" in reply.json()["error"], reply.text
    assert state(setup) == before


def test_a_chat_click_on_a_link_button_decides_nothing(setup: dict[str, Any]) -> None:
    before = state(setup)
    payload = {
        "user": {"id": "U0DAVE", "name": "dave"},
        "actions": [{"action_id": "plangate_open", "url": "https://x"}],
    }
    body = urllib.parse.urlencode({"payload": json.dumps(payload)}).encode()
    reply = TestClient(setup["app"]).post("/slack/actions", content=body, headers=signed(body))
    assert reply.status_code == 200 and state(setup) == before


# -- one error handler ------------------------------------------------------------------------------
def test_an_unexpected_error_is_a_500_with_an_id_and_the_trace_only_in_the_log(
    setup: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> Iterator[Any]:
        raise RuntimeError("the secret detail of a bug")
        yield

    setup["app"].dependency_overrides[_deps.runtime] = broken
    caplog.set_level(logging.ERROR, logger="plangate.server")
    reply = api(setup, "dave").get("/api/plans")
    assert reply.status_code == 500
    error_id = reply.json()["error_id"]
    assert re.fullmatch(r"[0-9a-f]{12}", error_id) and error_id in reply.json()["error"]
    assert "secret detail" not in reply.text and "Traceback" not in reply.text
    page = TestClient(setup["app"]).get("/plans")
    assert page.status_code == 500 and page.headers["content-type"].startswith("text/html")
    assert "secret detail" not in page.text and re.search(r"error id [0-9a-f]{12}", page.text)
    logged = [r for r in caplog.records if r.name == "plangate.server"]
    assert error_id in logged[0].getMessage() and logged[0].exc_info is not None
    assert "the secret detail of a bug" in caplog.text and "Traceback" in caplog.text
    assert reply.headers["x-frame-options"] == "DENY"


def test_a_tool_catalogue_that_fails_is_a_500_not_a_leak(
    setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from plangate.server import views

    def broken(*args: Any) -> Any:
        raise KeyError("internal table of effects")

    client, _ = browser(setup, "dave")
    monkeypatch.setattr(views, "risk", broken)
    page = client.get("/")
    assert page.status_code == 500 and "internal table" not in page.text and "error id" in page.text
    assert "internal table of effects" in caplog.text


# -- mounted under a prefix -------------------------------------------------------------------------
def test_mounted_under_a_prefix_the_api_says_401_and_pages_stay_inside(setup: dict[str, Any]) -> None:
    outer = FastAPI()
    outer.mount("/gov", setup["app"])
    anonymous = TestClient(outer)
    for path in ("/gov/api/plans", f"/gov/api/plans/{setup['plan']['id']}"):
        reply = anonymous.get(path, follow_redirects=False)
        assert reply.status_code == 401 and "log in first" in reply.json()["error"]
        assert reply.headers["www-authenticate"] == 'Bearer realm="plangate"'
    assert anonymous.post("/gov/slack/actions", content=b"x").status_code == 401
    assert anonymous.get("/gov/", follow_redirects=False).headers["location"] == "/gov/login"
    login = anonymous.get("/gov/login").text
    assert 'action="/gov/login"' in login and 'href="/gov/static/plangate.css"' in login
    assert anonymous.get("/gov/static/plangate.css").status_code == 200
    done = anonymous.post(
        "/gov/login", data={"name": "dave", "password": PASSWORD, "csrf": csrf_in(login)}, follow_redirects=False
    )
    assert done.headers["location"] == "/gov/"
    page = anonymous.get(f"/gov/plans/{setup['plan']['id']}").text
    assert f'action="/gov/plans/{setup["plan"]["id"]}/approve"' in page and 'href="/gov/plans"' in page
    stale = anonymous.post(
        f"/gov/plans/{setup['plan']['id']}/approve",
        data={"plan_hash": "0" * 64, "csrf": csrf_in(page)},
        follow_redirects=False,
    )
    assert stale.status_code == 303 and stale.headers["location"].startswith(f"/gov/plans/{setup['plan']['id']}?")
    wrong_token = TestClient(outer).get("/gov/plans/x", headers={"Authorization": "Bearer no"}, follow_redirects=False)
    assert wrong_token.headers["location"] == "/gov/login"


# -- headers ---------------------------------------------------------------------------------------
def test_every_reply_carries_the_security_headers(setup: dict[str, Any]) -> None:
    client, _ = browser(setup, "dave")
    replies = [
        client.get("/"),
        client.get(f"/plans/{setup['plan']['id']}"),
        client.get("/login"),
        api(setup, "dave").get("/api/plans"),
        TestClient(setup["app"]).get("/api/plans"),
        TestClient(setup["app"]).get("/", follow_redirects=False),
        client.get("/no/such/page"),
        api(setup, "dave").post("/api/plans", content=b"x" * 2_000_000),
        client.get("/static/run.js"),
    ]
    for reply in replies:
        assert reply.headers["content-security-policy"] == CSP, reply.request.url
        assert reply.headers["x-frame-options"] == "DENY"
        assert reply.headers["x-content-type-options"] == "nosniff"
        assert reply.headers["referrer-policy"] == "same-origin"
        assert reply.headers["cache-control"] == "no-store"


def test_no_page_has_inline_script_or_style(setup: dict[str, Any]) -> None:
    plan = setup["plan"]
    client, _ = browser(setup, "gina")
    pages = [client.get(p).text for p in ("/", "/plans", "/register", "/audit", f"/plans/{plan['id']}")]
    pages += [client.get(f"/plans/{plan['id']}/{p}").text for p in ("edit", "run", "trace")]
    pages.append(TestClient(setup["app"]).get("/login").text)
    for page in pages:
        assert not re.search(r"<script(?![^>]*\ssrc=)[^>]*>", page), page
        assert "<style" not in page and " style=" not in page


def test_api_docs_are_off_unless_asked_and_then_behind_the_login(
    tmp_path: Path, catalogue: Catalogue, policy: Policy, setup: dict[str, Any]
) -> None:
    anonymous = TestClient(setup["app"])
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert anonymous.get(path).status_code == 404
        assert api(setup, "dave").get(path).status_code == 404
    on = serverkit.setup(tmp_path / "docs", catalogue, policy, api_docs=True)
    anonymous = TestClient(on["app"])
    assert anonymous.get("/openapi.json").status_code == 401
    for path in ("/docs", "/redoc"):
        reply = anonymous.get(path, follow_redirects=False)
        assert reply.status_code == 303 and "cdn" not in reply.text
    client, _ = browser(on, "dave")
    schema = client.get("/openapi.json").json()
    assert schema["info"]["title"] == "plangate" and "/api/plans/{plan_id}/approve" in schema["paths"]
    docs = client.get("/docs")
    nonce = re.search(r"'nonce-([^']+)'", docs.headers["content-security-policy"]).group(1)  # type: ignore[union-attr]
    assert f'<script nonce="{nonce}">' in docs.text and "<script>" not in docs.text


# -- logging in ------------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.at = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)

    def now(self) -> datetime:
        return self.at

    def new_id(self) -> str:  # pragma: no cover - the throttle only reads the time
        raise NotImplementedError


def login(client: TestClient, name: str, password: str, **headers: str) -> Any:
    token = csrf_in(client.get("/login").text)
    return client.post(
        "/login", data={"name": name, "password": password, "csrf": token}, headers=headers, follow_redirects=False
    )


def test_forty_wrong_passwords_then_the_right_one_does_not_log_in(
    tmp_path: Path, catalogue: Catalogue, policy: Policy
) -> None:
    clock = Clock()
    setup = serverkit.setup(tmp_path, catalogue, policy, clock=clock)
    client = TestClient(setup["app"])
    statuses = [login(client, "dave", f"guess {n}").status_code for n in range(40)]
    assert statuses == [401] * 5 + [429] * 35
    right = login(client, "dave", PASSWORD)
    assert right.status_code == 429 and "try again in 15 minute" in right.text
    assert int(right.headers["retry-after"]) == 900 and "session" not in right.headers.get("set-cookie", "")
    assert client.get("/api/plans").status_code == 401
    elsewhere = TestClient(setup["app"], client=("192.0.2.7", 4000))
    assert login(elsewhere, "dave", PASSWORD).status_code == 429, "the name is throttled from any address"
    assert login(client, "carol", PASSWORD).status_code == 429, "so is the address, for any name"
    assert login(elsewhere, "carol", PASSWORD).status_code == 303
    clock.at += timedelta(minutes=14, seconds=59)
    assert login(client, "dave", PASSWORD).status_code == 429
    clock.at += timedelta(seconds=2)
    assert login(client, "dave", PASSWORD).status_code == 303


def test_the_throttle_forgets_failures_older_than_the_window() -> None:
    from plangate.server._throttle import LoginThrottle

    clock = Clock()
    throttle = LoginThrottle(clock=clock, max_keys=10)
    for n in range(4):
        throttle.failed("dave", f"10.0.0.{n}")
    assert throttle.wait("Dave", "10.0.0.9") == 0
    throttle.failed("DAVE ", "10.0.0.9")
    assert throttle.wait("dave", "10.0.0.10") == 900
    clock.at += timedelta(hours=1)
    for n in range(20):
        throttle.failed(f"name{n}", "10.1.1.1")
    assert len(throttle._failures) <= 10


def test_logout_needs_the_session_csrf_token(setup: dict[str, Any]) -> None:
    client, csrf = browser(setup, "dave")
    forged = client.post("/logout", data={}, follow_redirects=False)
    assert forged.status_code == 403 and client.get("/api/plans").status_code == 200
    assert client.post("/logout", data={"csrf": "x" * 64}).status_code == 403
    done = client.post("/logout", data={"csrf": csrf}, follow_redirects=False)
    assert done.status_code == 303 and done.headers["location"] == "/login"
    assert client.get("/api/plans").status_code == 401


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "http://testserver.evil.example"},
    ],
)
def test_forms_from_another_site_are_refused_whatever_they_carry(
    setup: dict[str, Any], headers: dict[str, str]
) -> None:
    plan = setup["plan"]
    before = state(setup)
    client, csrf = browser(setup, "dave")
    approve = client.post(
        f"/plans/{plan['id']}/approve", data={"plan_hash": plan["hash"], "csrf": csrf}, headers=headers
    )
    assert approve.status_code == 403 and "another site" in approve.text
    planted = TestClient(setup["app"])
    token = csrf_in(planted.get("/login").text)  # the attacker's own login token, planted with its cookie
    forced = planted.post(
        "/login", data={"name": "alice", "password": PASSWORD, "csrf": token}, headers=headers, follow_redirects=False
    )
    assert forced.status_code == 403 and "set-cookie" not in forced.headers
    assert state(setup) == before


def test_forms_from_this_site_pass_the_origin_check(setup: dict[str, Any]) -> None:
    client, csrf = browser(setup, "dave")
    plan = setup["plan"]
    same = {"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"}
    done = client.post(
        f"/plans/{plan['id']}/approve",
        data={"plan_hash": plan["hash"], "csrf": csrf},
        headers=same,
        follow_redirects=False,
    )
    assert done.status_code == 303


def test_secure_cookies_use_the_host_prefix(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> None:
    setup = serverkit.setup(tmp_path, catalogue, policy, secure_cookies=True)
    client = TestClient(setup["app"], base_url="https://testserver")
    page = client.get("/login")
    cookie = page.headers["set-cookie"]
    assert cookie.startswith("__Host-plangate_login_csrf=") and "Secure" in cookie and "Path=/" in cookie
    assert "Domain" not in cookie
    done = login(client, "dave", PASSWORD)
    assert done.status_code == 303
    session = next(c for c in done.headers.get_list("set-cookie") if "session" in c)
    assert session.startswith("__Host-plangate_session=") and "Secure" in session and "HttpOnly" in session
    assert client.get("/api/plans").status_code == 200
    planted = TestClient(setup["app"], base_url="https://testserver", cookies={"plangate_session": "x"})
    assert planted.get("/api/plans").status_code == 401
