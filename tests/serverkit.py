"""One server setup for the server's tests: accounts of every role, their API tokens, a logged-in browser."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from plangate import Catalogue, Policy
from plangate.accounts import Accounts
from plangate.server import create_app
from plangate.store import open_store
from tests.helpers import wait_until_up

PASSWORD = "correct horse battery"
PEOPLE = {
    "alice": ("requester", ()),
    "dave": ("approver", ("refunds",)),
    "carol": ("approver", ("*",)),
    "erin": ("approver", ("maintenance",)),
    "audrey": ("auditor", ()),
    "gina": ("governance", ("*",)),
}

MAIL = {
    "task": "Tell the customer",
    "category": "refunds",
    "steps": [
        {
            "id": 1,
            "tool": "send_email",
            "params": {"to": "ada@example.com", "subject": "s", "body": "b"},
            "rationale": "r",
        }
    ],
}
"""A plan of one email: not idempotent, so an unknown outcome needs a person."""


def setup(tmp_path: Path, catalogue: Catalogue, policy: Policy | None, **options: Any) -> dict[str, Any]:
    db = f"sqlite:///{tmp_path}/server.db"
    accounts = Accounts(open_store(db))
    for name, (role, categories) in PEOPLE.items():
        accounts.add(name, role, password=PASSWORD, categories=categories)
    tokens = {name: accounts.issue_token(name) for name in PEOPLE}
    accounts.store.close()
    app = create_app(catalogue, policy, db=db, **{"secure_cookies": False, **options})
    return {"app": app, "db": db, "tokens": tokens}


def api(setup: dict[str, Any], who: str, **options: Any) -> TestClient:
    client = TestClient(setup["app"], **options)
    client.headers["Authorization"] = f"Bearer {setup['tokens'][who]}"
    return client


def csrf_in(page: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]


def browser(setup: dict[str, Any], who: str, **options: Any) -> tuple[TestClient, str]:
    """A logged-in browser session, and its CSRF token."""
    client = TestClient(setup["app"], **options)
    token = csrf_in(client.get("/login").text)
    done = client.post("/login", data={"name": who, "password": PASSWORD, "csrf": token}, follow_redirects=False)
    assert done.status_code == 303, done.text
    return client, csrf_in(client.get("/").text)


def state(setup: dict[str, Any]) -> tuple[Any, ...]:
    """Everything a refused request must leave as it was: the plans, their approvals, the audit log, the register."""
    store = open_store(setup["db"])
    try:
        plans = store.list_plans(limit=10_000)
        approvals = [a for p in plans for a in store.approvals(p.id)]
        return (plans, approvals, len(list(store.events())), store.query("SELECT * FROM register"))
    finally:
        store.close()


@contextlib.contextmanager
def serving(folder: Path, env: dict[str, str], *options: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A real ``plangate serve`` on a free loopback port, started with ``options``: its URL and its process."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "plangate", "serve", "--port", str(port), *options]
    with (
        (folder / "server.log").open("wb") as log,
        subprocess.Popen(command, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT) as process,
    ):
        url = f"http://127.0.0.1:{port}"
        wait_until_up(f"{url}/login", process, folder / "server.log", seconds=30)
        try:
            yield url, process
        finally:
            process.terminate()
            process.wait(10)
