"""The dashboard in a real browser: Chromium (Debian's) driven by Playwright, against a real server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from plangate.server._security import HEADERS
from tests.conftest import EXAMPLES
from tests.serverkit import serving

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PASSWORD = "correct horse battery"
# Screenshots go to a temporary folder; PLANGATE_SCREENSHOTS=docs/screenshots refreshes the README's.
SHOTS = Path(os.environ.get("PLANGATE_SCREENSHOTS") or tempfile.mkdtemp(prefix="plangate-shots-"))
PLAN = {
    "task": "Refund 10 EUR of invoice 42",
    "category": "refunds",
    "steps": [
        {
            "id": 1,
            "tool": "get_invoice",
            "params": {"invoice_id": "42"},
            "rationale": "Check the invoice is paid.",
            "expected_output": "object",
        },
        {
            "id": 2,
            "tool": "issue_refund",
            "params": {"invoice_id": "42", "amount": 10.0},
            "rationale": "The partial refund the customer asked for.",
            "condition": '${1.status} == "paid"',
            "rollback": "void_refund(refund_id=${2.refund_id})",
        },
    ],
}


def plangate(*args: str, env: dict[str, str], stdin: str | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "plangate", *args], env=env, input=stdin, capture_output=True, text=True, check=True
    )
    return done.stdout


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("dashboard")
    env = {
        **os.environ,
        "PLANGATE_DB": f"sqlite:///{folder}/plangate.db",
        "PLANGATE_EXAMPLE_DB": str(folder / "business.db"),
    }
    for name, role, categories in (
        ("gina", "governance", ["*"]),
        ("alice", "requester", []),
        ("dave", "approver", ["refunds"]),
        ("carol", "approver", ["*"]),
    ):
        plangate(
            "users",
            "add",
            name,
            "--role",
            role,
            *(f"--category={c}" for c in categories),
            "--password-stdin",
            env=env,
            stdin=PASSWORD + "\n",
        )
        if name == "gina":  # after the first account, accounts change only with a governance token
            env["PLANGATE_TOKEN"] = plangate("login", "gina", "--password-stdin", "--print", env=env, stdin=PASSWORD)
    token = plangate("users", "token", "alice", env=env).strip()
    options = ("--tools", str(EXAMPLES / "business.py"), "--policy", str(EXAMPLES / "policy.yaml"))
    with serving(folder, env, *options) as (url, _):
        yield {"url": url, "token": token}


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), "make test installs Debian's chromium"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield launched
        launched.close()


def submit(server: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{server['url']}/api/plans",
        data=json.dumps(PLAN).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {server['token']}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request) as reply:
        return json.loads(reply.read())  # type: ignore[no-any-return]


def log_in(browser: Browser, server: dict[str, Any], name: str) -> Page:
    page = browser.new_context(viewport={"width": 1200, "height": 900}).new_page()
    page.goto(f"{server['url']}/login")
    page.fill("input[name=name]", name)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    expect(page.locator("header .who")).to_contain_text(name)
    return page


def test_review_edit_approve_execute(server: dict[str, Any], browser: Browser) -> None:
    plan = submit(server)
    dave = log_in(browser, server, "dave")
    expect(dave.locator("table")).to_contain_text(plan["task"])
    dave.screenshot(path=str(SHOTS / "queue.png"), full_page=True)
    dave.click(f"a[href='/plans/{plan['id']}']")
    expect(dave.locator("svg[aria-label='the order steps run in']")).to_be_visible()
    expect(dave.locator("body")).to_contain_text("1 step(s) that change something that can be undone")
    dave.screenshot(path=str(SHOTS / "plan.png"), full_page=True)

    dave.click("text=Edit (a new version)")
    text = dave.input_value("#plan-json").replace('"amount": 10.0', '"amount": 12.5')
    dave.fill("#plan-json", text)
    dave.click("#preview")
    expect(dave.locator("#diff")).to_contain_text('+          "amount": 12.5')
    expect(dave.locator("#diff")).to_contain_text('-          "amount": 10.0')
    expect(dave.locator("#recheck")).to_contain_text("passes the checker and the policy")
    dave.screenshot(path=str(SHOTS / "edit.png"), full_page=True)
    dave.click("#save")
    expect(dave.locator("body")).to_contain_text("version 2")
    expect(dave.locator("#approve")).to_have_count(1)
    dave.click("#approve")
    expect(dave.locator("[role=alert]")).to_contain_text(
        "wrote a version of plan"
    )  # an editor may not approve their edit

    carol = log_in(browser, server, "carol")
    refused: list[str] = []
    carol.on(
        "console", lambda message: refused.append(message.text) if "Content Security Policy" in message.text else None
    )
    carol.goto(f"{server['url']}/plans/{plan['id']}")
    carol.fill("form[action$='/approve'] input[name=comment]", "12.5 EUR is right")
    carol.click("#approve")
    expect(carol.locator("[role=alert]")).to_contain_text("Approved by carol")
    carol.click("#execute")
    expect(carol.locator("#run-status")).to_have_text("succeeded", timeout=15_000)
    expect(carol.locator("#status-2")).to_have_text("succeeded")
    expect(carol.locator("#detail-2")).to_contain_text('"amount": 12.5')
    carol.screenshot(path=str(SHOTS / "run.png"), full_page=True)
    carol.click("text=Trace")
    bars = carol.locator("svg.timeline g.bar")
    expect(bars).to_have_count(2)  # one attempt of each step
    for index in range(2):
        box = bars.nth(index).locator("rect").bounding_box()
        assert box is not None and box["width"] >= 4 and box["height"] >= 10
    expect(carol.locator("svg.timeline g.mk.m-edit")).to_have_count(1)
    expect(carol.locator("#lane-step-2")).to_contain_text("✓ succeeded")
    expect(carol.locator("#moments")).to_contain_text("12.5 EUR is right")
    expect(carol.locator("svg[aria-label='the order steps run in'] .n-succeeded")).to_have_count(2)
    expect(carol.locator("#events pre")).to_contain_text("run SUCCEEDED")  # the raw events, folded away
    carol.screenshot(path=str(SHOTS / "timeline.png"), full_page=True)
    assert refused == [], "the timeline page runs under the CSP"

    # The same task again, unedited (10 EUR), run and then compared with the first run.
    again = submit(server)
    carol.goto(f"{server['url']}/plans/{again['id']}")
    carol.click("#approve")
    carol.click("#execute")
    expect(carol.locator("#run-status")).to_have_text("succeeded", timeout=15_000)
    carol.goto(f"{server['url']}/plans/{again['id']}")
    carol.fill("#compare-with", plan["id"])
    carol.click("form[action$='/compare'] button")
    expect(carol.locator("h1")).to_have_text("Compare runs")
    expect(carol.locator("#compare tr.differs")).to_have_count(1)  # step 2's amount, and so its output
    changed = carol.locator("#compare-step-2 pre.json span.changed")  # the amount, in and out; the refund's id
    expect(changed).to_contain_text(
        ['"amount": 10.0', '"amount": 10.0', '"refund_id"', '"amount": 12.5', '"amount": 12.5', '"refund_id"']
    )
    expect(carol.locator("#compare-step-1 .pill")).to_have_text("same")
    carol.screenshot(path=str(SHOTS / "compare.png"), full_page=True)
    assert refused == [], "the compare page runs under the CSP"


def test_self_approval_and_forms_without_csrf_are_refused(server: dict[str, Any], browser: Browser) -> None:
    plan = submit(server)
    alice = log_in(browser, server, "alice")
    alice.goto(f"{server['url']}/plans/{plan['id']}")
    expect(alice.locator("#approve")).to_have_count(0)
    csrf = alice.input_value("header input[name=csrf]")
    status = alice.evaluate(
        """async ([id, hash, csrf]) => {
        const form = new URLSearchParams({plan_hash: hash, csrf});
        const reply = await fetch(`/plans/${id}/approve`, {method: "POST", body: form});
        return [reply.status, await reply.text()];
    }""",
        [plan["id"], plan["hash"], csrf],
    )
    assert status[0] == 403 and "may not decide" in status[1]

    dave = log_in(browser, server, "dave")
    dave.goto(f"{server['url']}/plans/{plan['id']}")
    dave.evaluate("document.querySelector(\"form[action$='/approve'] input[name=csrf]\").remove()")
    dave.click("#approve")
    expect(dave.locator("body")).to_contain_text("no valid CSRF token")
    dave.goto(f"{server['url']}/plans/{plan['id']}")
    expect(dave.locator("body")).to_contain_text("pending approval")


@contextmanager
def another_site(html: str) -> Iterator[str]:
    """A page served from another loopback origin (another port: same site, so Lax cookies still go along)."""
    body = html.encode()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    with ThreadingHTTPServer(("127.0.0.1", 0), Page) as site:
        threading.Thread(target=site.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{site.server_address[1]}/"
        finally:
            site.shutdown()


def test_pages_carry_the_security_headers_and_run_under_their_csp(server: dict[str, Any], browser: Browser) -> None:
    plan = submit(server)
    dave = log_in(browser, server, "dave")
    refused: list[str] = []
    dave.on(
        "console", lambda message: refused.append(message.text) if "Content Security Policy" in message.text else None
    )
    for path in ("/", *(f"/plans/{plan['id']}{page}" for page in ("", "/edit", "/trace", "/run"))):
        reply = dave.goto(f"{server['url']}{path}")
        assert reply is not None and reply.status == 200
        for name, value in HEADERS:
            assert reply.headers[name.lower()] == value, (path, name)
    styled = dave.evaluate("getComputedStyle(document.querySelector('header')).backgroundColor")
    assert styled == "rgb(255, 255, 255)", "the stylesheet loads under the CSP"
    expect(dave.locator("#run-status")).to_have_attribute("data-progress", f"/api/plans/{plan['id']}/progress")
    assert refused == []


def test_the_plan_page_refuses_to_render_in_another_sites_frame(server: dict[str, Any], browser: Browser) -> None:
    plan = submit(server)
    dave = log_in(browser, server, "dave")
    page = f"{server['url']}/plans/{plan['id']}"
    dave.goto(page)
    expect(dave.locator("#approve")).to_have_count(1)  # outside a frame, the Approve form is there
    with another_site(f'<!doctype html><iframe id="victim" src="{page}" width="900" height="600"></iframe>') as site:
        dave.goto(site)
        dave.wait_for_load_state("load")
        dave.wait_for_timeout(500)
        frames = [f for f in dave.frames if f is not dave.main_frame]
        assert len(frames) == 1
        assert frames[0].url != page, "Chromium blocked the framed page (an error page in its place)"
        assert frames[0].locator("#approve").count() == 0
    dave.goto(page)
    expect(dave.locator("body")).to_contain_text("pending approval")


TAIL_SEEN = """([pre, word]) => {
    const node = document.createTreeWalker(pre, NodeFilter.SHOW_TEXT).nextNode();
    const at = node.data.indexOf(word), range = document.createRange();
    range.setStart(node, at); range.setEnd(node, at + word.length);
    const seen = range.getBoundingClientRect(), box = pre.getBoundingClientRect();
    return seen.left >= box.left && seen.right <= box.right && seen.right <= window.innerWidth;
}"""


def test_a_parameter_s_tail_is_on_the_review_page_without_scrolling(server: dict[str, Any], browser: Browser) -> None:
    """A value padded past the width of its cell: the reviewer saw the first recipient and not the second."""
    padded = "ceo@example.com" + " " * 200 + ", drop@attacker.example"
    plan = {
        "task": "Tell the customer their refund is on its way",
        "category": "refunds",
        "steps": [
            {"id": 1, "tool": "send_email", "params": {"to": padded, "subject": "Refund", "body": "On its way."},
             "rationale": "The customer asked."},
        ],
    }  # fmt: skip
    request = urllib.request.Request(
        f"{server['url']}/api/plans",
        data=json.dumps(plan).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {server['token']}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request) as reply:
        plan_id = json.loads(reply.read())["id"]
    dave = log_in(browser, server, "dave")
    dave.goto(f"{server['url']}/plans/{plan_id}")
    pre = dave.locator("#step-1 pre").element_handle()
    assert dave.evaluate(TAIL_SEEN, [pre, "drop@attacker.example"]), "the second recipient is out of sight"
