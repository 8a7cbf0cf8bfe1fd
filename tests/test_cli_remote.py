"""The command line as a client of a real plangate server on loopback: no database, no audit key on this side."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plangate.accounts import Accounts
from plangate.store import open_store
from tests.conftest import EXAMPLES
from tests.serverkit import PASSWORD, serving

REFUND = str(EXAMPLES / "plans" / "refund.json")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("remote")
    db = f"sqlite:///{folder}/server.db"
    accounts = Accounts(open_store(db))
    for name, role, categories in (
        ("gina", "governance", ("*",)),
        ("alice", "requester", ()),
        ("dave", "approver", ("refunds",)),
        ("carol", "approver", ("*",)),
        ("audrey", "auditor", ()),
    ):
        accounts.add(name, role, password=PASSWORD, categories=categories)
    accounts.store.close()
    env = {"PLANGATE_DB": db, "PLANGATE_EXAMPLE_DB": str(folder / "business.db")}
    options = ("--tools", str(EXAMPLES / "business.py"), "--policy", str(EXAMPLES / "policy.yaml"))
    with serving(folder, env, *options) as (url, _):
        yield {"url": url, "db": db, "env": env}


def remote(server: dict[str, Any], tmp_path: Path, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    """``plangate ARGS --server URL`` from a machine with no store: its database path cannot even be made."""
    env = {
        **os.environ,
        "PLANGATE_DB": "sqlite:////proc/no-store-here/plangate.db",
        "PLANGATE_AUDIT_KEY_FILE": "/proc/no-key-here/audit.key",
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "PLANGATE_SERVER": server["url"],
    }
    done = subprocess.run(
        [sys.executable, "-m", "plangate", *args], check=False, env=env, input=stdin, capture_output=True, text=True
    )
    return done.returncode, done.stdout, done.stderr


def local(server: dict[str, Any], *args: str) -> str:
    """The same command against the server's own store, on the server's machine."""
    env = {**os.environ, **server["env"]}
    command = [sys.executable, "-m", "plangate", *args]
    return subprocess.run(command, check=True, env=env, capture_output=True, text=True).stdout


def token(server: dict[str, Any], tmp_path: Path, name: str) -> str:
    code, out, err = remote(server, tmp_path, "login", name, "--password-stdin", "--print", stdin=PASSWORD)
    assert code == 0, err
    return out.strip()


def test_a_remote_operator_runs_the_whole_path_without_the_database(server: dict[str, Any], tmp_path: Path) -> None:
    code, out, err = remote(server, tmp_path, "login", "alice", "--password-stdin", stdin=PASSWORD)
    assert code == 0 and "signed in as alice (requester)" in out, err
    code, out, err = remote(server, tmp_path, "submit", REFUND, "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert (plan["status"], plan["requested_by"]) == ("pending_approval", "alice")
    code, _, err = remote(server, tmp_path, "approve", plan["id"], "--hash", plan["hash"])
    assert code == 4 and "may not decide" in err, "alice's own plan, and not her category"
    dave, carol = token(server, tmp_path, "dave"), token(server, tmp_path, "carol")
    code, out, err = remote(server, tmp_path, "approve", plan["id"], "--hash", plan["hash"], "--token", dave)
    assert code == 0 and "privacy-officer" in out, err
    code, out, err = remote(server, tmp_path, "approve", plan["id"], "--hash", plan["hash"], "--token", carol)
    assert code == 0 and ": approved" in out, err
    code, out, err = remote(server, tmp_path, "execute", plan["id"], "--token", carol)
    assert code == 0 and "succeeded: 4 steps done" in out, err
    tools = ("--tools", str(EXAMPLES / "business.py"))  # a plan sent to the API has no tools module on record
    listings = (("list",), ("list", "--order", "oldest", "--limit", "1"), ("list", "--after", plan["id"][:8]))
    for command in (("show", plan["id"], *tools), ("trace", plan["id"]), *listings):
        code, out, err = remote(server, tmp_path, *command, "--token", carol)
        assert code == 0 and out == local(server, *command), f"{command}: the same output as on the server"
    code, out, _ = remote(server, tmp_path, "audit", "verify", "--token", token(server, tmp_path, "audrey"))
    assert code == 0 and "intact" in out


def test_the_server_refuses_and_the_command_line_says_so_plainly(server: dict[str, Any], tmp_path: Path) -> None:
    code, _, err = remote(server, tmp_path, "submit", REFUND)
    assert code == 4 and err.startswith("plangate: refused: log in first") and err.count("\n") == 1
    code, _, err = remote(server, tmp_path, "login", "alice", "--password-stdin", stdin="wrong password")
    assert code == 4 and "Wrong user or password" in err
    dave = token(server, tmp_path, "dave")
    code, _, err = remote(server, tmp_path, "register", "set", "refunds", "on", "--reason", "x", "--token", dave)
    assert code == 4 and "governance" in err
    code, _, err = remote(server, tmp_path, "audit", "verify", "--token", dave)
    assert code == 4 and "auditors and governance" in err
    code, _, err = remote(server, tmp_path, "show", "no-such-plan", "--token", dave)
    assert code == 2 and "no-such-plan" in err
    gina = token(server, tmp_path, "gina")
    code, out, err = remote(server, tmp_path, "register", "set", "lookups", "off", "--reason", "audit", "--token", gina)
    assert code == 0 and "automatic approval off (by gina: audit)" in out, err
    code, _, err = remote(server, tmp_path, "list", "--server", "http://127.0.0.1:9")
    assert code == 2 and "cannot reach the plangate server at http://127.0.0.1:9" in err


def test_edit_diff_close_and_show_print_the_same_remotely(server: dict[str, Any], tmp_path: Path) -> None:
    """The commands added for halted plans and versions: the same output and exit codes as on the server."""
    alice, dave, carol = (token(server, tmp_path, name) for name in ("alice", "dave", "carol"))
    halting = str(EXAMPLES / "plans" / "halt.json")
    code, out, err = remote(server, tmp_path, "submit", halting, "--json", "--token", alice)
    assert code == 0, err
    plan = json.loads(out)
    code, out, err = remote(server, tmp_path, "diff", plan["id"], "--token", alice)
    assert code == 2 and "has no version before v1" in err
    body = json.loads(Path(halting).read_text())
    body["steps"][1]["params"]["amount"] = 400.0
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(body))
    code, out, err = remote(server, tmp_path, "edit", plan["id"], str(edited), "--json", "--token", alice)
    record = json.loads(out)
    assert code == 0 and (record["version"], record["status"]) == (2, "pending_approval"), err
    code, out, err = remote(server, tmp_path, "edit", plan["id"], str(edited), "--token", alice)
    assert code == 4 and "does not change plan" in err
    code, _, err = remote(server, tmp_path, "approve", plan["id"], "--hash", record["hash"], "--token", dave)
    assert code == 0, err
    code, out, err = remote(server, tmp_path, "execute", plan["id"], "--token", carol)
    assert code == 3 and "halted at step 2" in out, err
    code, _, err = remote(server, tmp_path, "close", plan["id"], "--reason", "refunded by hand", "--token", alice)
    assert code == 4 and "may not decide" in err, "the requester does not close her own plan"
    code, out, err = remote(server, tmp_path, "close", plan["id"], "--reason", "refunded by hand", "--token", dave)
    assert code == 0 and out.endswith(": closed\n  closed: refunded by hand\n"), err
    code, _, err = remote(server, tmp_path, "resume", plan["id"], "--token", carol)
    assert code == 4 and "was closed by dave" in err and err.count("\n") == 1
    tools = ("--tools", str(EXAMPLES / "business.py"))  # the server's: ignored remotely, where the server's count
    for command in (
        ("show", plan["id"], *tools),
        ("diff", plan["id"]),
        ("diff", plan["id"], "--from", "2", "--to", "1", "--json"),
        ("trace", plan["id"]),
        ("list", "--status", "closed"),
    ):
        code, out, err = remote(server, tmp_path, *command, "--token", carol)
        assert code == 0 and out == local(server, *command), f"{command}: the same output as on the server"
    shown = local(server, "show", plan["id"], *tools)
    assert "effect: write" in shown and "status: failed: " in shown and "(closed)" in shown
