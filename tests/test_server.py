"""The JSON API and the dashboard's forms, through real HTTP requests to the app."""

from __future__ import annotations

import re
import urllib.parse
from contextlib import closing
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from plangate import Catalogue, Policy
from plangate._clock import SystemClock
from plangate.accounts import Accounts
from plangate.server import create_app
from plangate.store import open_store
from tests import serverkit
from tests.conftest import load_plan
from tests.serverkit import MAIL, PASSWORD, api, browser


@pytest.fixture
def setup(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> dict[str, Any]:
    return serverkit.setup(tmp_path, catalogue, policy)


def test_the_api_path_with_tokens(setup: dict[str, Any]) -> None:
    submitted = api(setup, "alice").post("/api/plans", json=load_plan("refund"))
    assert submitted.status_code == 201
    plan = submitted.json()
    assert plan["status"] == "pending_approval" and plan["needs"] == ["a person", "privacy-officer"]
    own = api(setup, "alice").post(f"/api/plans/{plan['id']}/approve", json={"hash": plan["hash"]})
    assert own.status_code == 403 and "may not decide" in own.json()["error"]
    stale = api(setup, "dave").post(f"/api/plans/{plan['id']}/approve", json={"hash": "0" * 64})
    assert stale.status_code == 409 and "is not plan" in stale.json()["error"]
    assert api(setup, "dave").post(f"/api/plans/{plan['id']}/approve", json={"hash": plan["hash"]}).status_code == 200
    wrong_category = api(setup, "erin").post(f"/api/plans/{plan['id']}/approve", json={"hash": plan["hash"]})
    assert wrong_category.status_code == 403 and "category 'refunds'" in wrong_category.json()["error"]
    assert api(setup, "audrey").post(f"/api/plans/{plan['id']}/execute").status_code == 403
    unapproved = api(setup, "alice").post(f"/api/plans/{plan['id']}/execute")
    assert unapproved.status_code == 409 and "not approved" in unapproved.json()["error"]
    listed = api(setup, "audrey").get("/api/plans").json()
    assert [p["id"] for p in listed] == [plan["id"]]
    assert api(setup, "audrey").get(f"/api/plans/{plan['id']}/trace").json()[0]["kind"] == "plan.submitted"


@pytest.mark.parametrize(
    ("request_kwargs", "status", "message"),
    [
        ({"content": b"{not json", "headers": {"content-type": "application/json"}}, 400, "not-json"),
        ({"json": [1, 2]}, 400, "a JSON object"),
        ({"json": {"task": "x"}}, 422, "not a valid plan"),
        ({"content": b"x" * 1_100_000, "headers": {"content-type": "application/json"}}, 413, "over the limit"),
    ],
)
def test_bad_bodies_get_clear_errors_and_change_nothing(
    setup: dict[str, Any], request_kwargs: dict[str, Any], status: int, message: str
) -> None:
    reply = api(setup, "alice").post("/api/plans", **request_kwargs)
    assert reply.status_code == status and message in reply.json()["error"]
    assert api(setup, "alice").get("/api/plans").json() == []


def test_wrong_credentials_and_expired_sessions(setup: dict[str, Any], catalogue: Catalogue) -> None:
    anonymous = TestClient(setup["app"])
    assert anonymous.get("/api/plans").status_code == 401
    assert anonymous.get("/", follow_redirects=False).headers["location"] == "/login"
    bad_token = TestClient(setup["app"], headers={"Authorization": "Bearer pgt_nope"})
    assert bad_token.get("/api/plans").status_code == 401
    page = anonymous.get("/login").text
    token = re.search(r'name="csrf" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    wrong = anonymous.post("/login", data={"name": "dave", "password": "wrong password", "csrf": token})
    assert wrong.status_code == 401 and "Wrong user or password" in wrong.text
    no_csrf = TestClient(setup["app"]).post("/login", data={"name": "dave", "password": PASSWORD})
    assert no_csrf.status_code == 403

    clock = LaterClock()  # a session's age is the server clock's business: no sleeping, however loaded the machine
    short = create_app(catalogue, None, db=setup["db"], session_hours=1, secure_cookies=False, clock=clock)
    client = TestClient(short)
    page = client.get("/login").text
    token = re.search(r'name="csrf" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    client.post("/login", data={"name": "dave", "password": PASSWORD, "csrf": token}, follow_redirects=False)
    clock.later = timedelta(minutes=59)
    assert client.get("/api/plans").status_code == 200
    clock.later = timedelta(minutes=61)
    assert client.get("/api/plans").status_code == 401, "the session expired"


class LaterClock(SystemClock):
    """The system's time, moved on by ``later``."""

    later = timedelta(0)

    def now(self) -> datetime:
        return super().now() + self.later


def test_forms_need_the_session_csrf_token(setup: dict[str, Any]) -> None:
    plan = api(setup, "alice").post("/api/plans", json=load_plan("refund")).json()
    client, csrf = browser(setup, "dave")
    forged = client.post(f"/plans/{plan['id']}/approve", data={"plan_hash": plan["hash"]})
    assert forged.status_code == 403 and "CSRF" in forged.text
    json_without_header = client.post(f"/api/plans/{plan['id']}/approve", json={"hash": plan["hash"]})
    assert json_without_header.status_code == 403
    done = client.post(
        f"/plans/{plan['id']}/approve", data={"plan_hash": plan["hash"], "csrf": csrf}, follow_redirects=False
    )
    assert done.status_code == 303
    assert api(setup, "audrey").get(f"/api/plans/{plan['id']}").json()["needs"] == ["privacy-officer"]


def test_pages_render(setup: dict[str, Any]) -> None:
    plan = api(setup, "alice").post("/api/plans", json=load_plan("refund")).json()
    client, _ = browser(setup, "dave")
    queue = client.get("/").text
    assert plan["id"][:8] in queue and "irreversible" in queue
    page = client.get(f"/plans/{plan['id']}").text
    assert "<svg" in page and "1 call(s) outside the company: send_email" in page and "privacy-officer" in page
    assert 'id="approve"' in page
    assert "submitted" in client.get(f"/plans/{plan['id']}/trace").text
    assert client.get("/audit").status_code == 403
    auditor, _ = browser(setup, "audrey")
    assert "audit log intact" in auditor.get("/audit").text


def test_the_register_page(setup: dict[str, Any]) -> None:
    accounts = Accounts(open_store(setup["db"]))
    accounts.add("gina", "governance", password=PASSWORD, categories=("*",))
    client, csrf = browser(setup, "dave")
    assert "Empty: every category follows the policy" in client.get("/register").text
    refused = client.post("/register", data={"category": "lookups", "state": "on", "reason": "x", "csrf": csrf})
    assert refused.status_code == 403 and "governance does that" in refused.text
    gina, csrf = browser(setup, "gina")
    done = gina.post(
        "/register",
        data={"category": "lookups", "state": "on", "reason": "reviewed", "csrf": csrf},
        follow_redirects=False,
    )
    assert done.status_code == 303
    page = gina.get("/register").text
    assert "reviewed" in page and 'id="register-save"' in page and 'id="left-out"' not in page
    plan = api(setup, "alice").post("/api/plans", json=load_plan("refund")).json()
    with closing(open_store(setup["db"])) as store, store.transaction():  # its events rewritten in the database
        store.command("UPDATE events SET data = replace(data, 'refund', 'refunds') WHERE plan_id = ?", (plan["id"],))
    page = gina.get("/register").text
    assert 'id="left-out"' in page and f"plan {plan['id']}: its audit events do not verify" in page
    assert api(setup, "gina").get("/api/register").json()["left_out"][0].startswith(f"plan {plan['id']}: ")


def test_the_register_names_a_plan_left_out_only_to_those_who_may_see_it(setup: dict[str, Any]) -> None:
    """Anyone signed in reads the register: a plan left out of its evidence, named there, gave a requester or an
    approver of other categories the whole id of a plan hidden from them (and with it, its category)."""
    Accounts(open_store(setup["db"])).add("gina", "governance", password=PASSWORD, categories=("*",))
    gina, csrf = browser(setup, "gina")
    form = {"category": "lookups", "state": "on", "reason": "reviewed", "csrf": csrf}
    assert gina.post("/register", data=form, follow_redirects=False).status_code == 303
    plan = api(setup, "alice").post("/api/plans", json=load_plan("refund")).json()
    with closing(open_store(setup["db"])) as store, store.transaction():  # its events rewritten in the database
        store.command("UPDATE events SET data = replace(data, 'refund', 'refunds') WHERE plan_id = ?", (plan["id"],))
    erin, _ = browser(setup, "erin")  # decides maintenance, not refunds
    page = erin.get("/register").text
    assert 'id="left-out"' in page and "1 plan(s) left out" in page and plan["id"] not in page
    assert "1 of them you may not see" in page
    told = api(setup, "erin").get("/api/register").json()
    assert told["left_out"] == [] and told["left_out_unseen"] == 1 and plan["id"] not in str(told)
    for who in ("alice", "dave", "gina"):  # hers; an approver of refunds; governance
        assert api(setup, who).get("/api/register").json()["left_out"][0].startswith(f"plan {plan['id']}: "), who


def test_after_a_halt_settle_resume_and_roll_back_from_the_dashboard(setup: dict[str, Any]) -> None:
    from tests.helpers import died_during

    plan = api(setup, "alice").post("/api/plans", json=MAIL).json()
    assert api(setup, "dave").post(f"/api/plans/{plan['id']}/approve", json={"hash": plan["hash"]}).status_code == 200
    store = open_store(setup["db"])
    died_during(store, plan["id"], 1)  # the email may or may not have gone out: not idempotent, so a person decides
    assert api(setup, "alice").post(f"/api/plans/{plan['id']}/execute").json()["status"] == "halted"
    assert store.steps(plan["id"])[1].status == "outcome_unknown"
    client, csrf = browser(setup, "dave")
    page = client.get(f"/plans/{plan['id']}/run").text
    assert 'id="settle-1"' in page and 'id="compensate"' in page and 'id="resume"' in page
    settled = client.post(
        f"/plans/{plan['id']}/settle",
        data={"step": "1", "done": "no", "note": "no email in the outbox", "csrf": csrf},
        follow_redirects=False,
    )
    assert settled.status_code == 303 and store.steps(plan["id"])[1].status == "failed"
    done = client.post(
        f"/plans/{plan['id']}/compensate", data={"reason": "cancelled", "csrf": csrf}, follow_redirects=False
    )
    assert done.status_code == 303 and "compensated" in urllib.parse.unquote_plus(done.headers["location"])
    assert api(setup, "audrey").get(f"/api/plans/{plan['id']}").json()["status"] == "compensated"
    kinds = [e["kind"] for e in api(setup, "audrey").get(f"/api/plans/{plan['id']}/trace").json()]
    assert "step.settled" in kinds and kinds[-1] == "compensation.finished"


def test_closing_a_halted_plan_from_the_dashboard(setup: dict[str, Any]) -> None:
    from tests.helpers import died_during

    plan = api(setup, "alice").post("/api/plans", json=MAIL).json()
    api(setup, "dave").post(f"/api/plans/{plan['id']}/approve", json={"hash": plan["hash"]})
    store = open_store(setup["db"])
    died_during(store, plan["id"], 1)
    api(setup, "alice").post(f"/api/plans/{plan['id']}/execute")
    api(setup, "dave").post(f"/api/plans/{plan['id']}/settle", json={"step": 1, "done": False})
    client, csrf = browser(setup, "dave")
    assert 'id="close"' in client.get(f"/plans/{plan['id']}/run").text
    reason = {"reason": "the customer was told by phone"}
    forged = client.post(f"/plans/{plan['id']}/close", data=reason)
    assert forged.status_code == 403 and "CSRF" in forged.text
    cross_site = client.post(
        f"/plans/{plan['id']}/close", data={**reason, "csrf": csrf}, headers={"Sec-Fetch-Site": "cross-site"}
    )
    assert cross_site.status_code == 403
    requester, alice_csrf = browser(setup, "alice")
    assert requester.post(f"/plans/{plan['id']}/close", data={**reason, "csrf": alice_csrf}).status_code == 403
    assert store.get_plan(plan["id"]).status == "halted"  # type: ignore[union-attr]
    done = client.post(f"/plans/{plan['id']}/close", data={**reason, "csrf": csrf}, follow_redirects=False)
    assert done.status_code == 303 and "Closed by dave" in urllib.parse.unquote_plus(done.headers["location"])
    page = client.get(done.headers["location"]).text
    assert "Closed by dave" in page and "was closed by dave" in page and "the customer was told by phone" in page
    assert 'id="close"' not in client.get(f"/plans/{plan['id']}/run").text
    again = client.post(f"/plans/{plan['id']}/resume", data={"csrf": csrf}, follow_redirects=False)
    assert again.status_code == 303 and "was closed by dave" in urllib.parse.unquote_plus(again.headers["location"])
    assert "CLOSED: &#39;the customer was told by phone&#39;" in client.get(f"/plans/{plan['id']}/trace").text
    store.close()


def test_the_plan_page_shows_what_changed_since_the_version_before(setup: dict[str, Any]) -> None:
    plan = api(setup, "alice").post("/api/plans", json=MAIL).json()
    client, _ = browser(setup, "dave")
    assert 'id="changes"' not in client.get(f"/plans/{plan['id']}").text
    edited = {**MAIL, "task": "Tell the customer, kindly"}
    api(setup, "alice").post(f"/api/plans/{plan['id']}/edit", json={"plan": edited})
    page = client.get(f"/plans/{plan['id']}").text
    assert (
        "Changes from version 1" in page
        and "task: &#34;Tell the customer&#34; -&gt; &#34;Tell the customer, kindly&#34;" in page
    )


def test_what_a_plan_touches_counts_a_write_as_undoable_only_with_a_compensating_tool(tmp_path: Path) -> None:
    from plangate import Runtime, tool
    from plangate.server import views

    @tool
    def look(key: str) -> str:
        """Read."""
        return key

    @tool(effect="write")
    def unput(key: str) -> None:
        """Undo a put."""

    @tool(effect="write", compensate="unput")
    def put(key: str) -> None:
        """Write, undone by unput."""

    @tool(effect="write")
    def stamp(key: str) -> None:
        """Write, with nothing to undo it."""

    @tool(effect="irreversible")
    def send(key: str) -> None:
        """Send."""

    catalogue = Catalogue([look, unput, put, stamp, send])
    rt = Runtime(catalogue, db=f"sqlite:///{tmp_path}/touch.db")
    names = ["look", "put", "stamp", "stamp", "send"]
    steps = [{"id": i, "tool": name, "params": {"key": "k"}, "rationale": "r"} for i, name in enumerate(names, 1)]
    record = rt.submit({"task": "t", "category": "c", "steps": steps}, "ann")
    assert views.touch(record, catalogue)[:4] == [
        "1 step(s) that only read",
        "1 step(s) that change something that can be undone (a compensating tool undoes it on rollback)",
        "2 step(s) that change something that nothing undoes (no compensating tool): stamp",
        "1 step(s) that cannot be undone",
    ]


def test_the_undo_of_a_step_cut_off_is_settled_from_the_dashboard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rollback's call cut off with no outcome (its undo tool not idempotent): the run page offers
    a person to settle it, and the plan may then be rolled back to its end."""
    from tests.test_recovery import _calls, _undo_cut_off

    rt, plan_id, _ = _undo_cut_off(tmp_path, monkeypatch, name="server.db")
    rt.close()
    setup = serverkit.setup(tmp_path, Catalogue.from_module(tmp_path / "charges.py"), None)
    client, csrf = browser(setup, "carol")
    page = client.get(f"/plans/{plan_id}/run").text
    assert 'id="settle-undo-1"' in page and "<code>refund_charge</code>" in page
    settled = client.post(
        f"/plans/{plan_id}/settle",
        data={"step": "-1", "done": "yes", "output": '"refunded c5"', "note": "the bank shows it", "csrf": csrf},
        follow_redirects=False,
    )
    assert settled.status_code == 303, settled.text
    assert 'id="settle-undo-1"' not in client.get(f"/plans/{plan_id}/run").text
    reason = {"reason": "finish it", "csrf": csrf}
    done = client.post(f"/plans/{plan_id}/compensate", data=reason, follow_redirects=False)
    assert done.status_code == 303 and "compensated" in urllib.parse.unquote_plus(done.headers["location"])
    assert _calls(tmp_path) == ["charge 5", "refund c5"], "undone once"
