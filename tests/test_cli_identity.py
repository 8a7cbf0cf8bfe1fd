"""The command line's doors: once the store has accounts, a name typed with --as proves nothing."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from plangate.cli import main
from plangate.identity import token_path
from plangate.store import open_store
from tests.conftest import EXAMPLES

PASSWORD = "correct horse battery"
TOOLS = str(EXAMPLES / "business.py")
POLICY = str(EXAMPLES / "policy.yaml")
REFUND = str(EXAMPLES / "plans" / "refund.json")


def cli(*args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), input=stdin, env=env)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path}/cli.db"
    monkeypatch.setenv("PLANGATE_DB", url)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return url


def add(name: str, role: str, *extra: str, token: str | None = None) -> tuple[int, str, str]:
    given = ("--token", token) if token else ()
    return cli("users", "add", name, "--role", role, "--password-stdin", *extra, *given, stdin=PASSWORD + "\n")


def login(name: str) -> str:
    code, out, err = cli("login", name, "--password-stdin", "--print", stdin=PASSWORD + "\n")
    assert code == 0, err
    return out.strip()


@pytest.fixture
def people(db: str) -> dict[str, str]:
    """Accounts, and a token for each."""
    assert add("gina", "governance", "--category", "*")[0] == 0
    tokens = {"gina": login("gina")}
    for name, role, *cats in (("alice", "requester"), ("dave", "approver", "refunds"), ("carol", "approver", "*")):
        code, _, err = add(name, role, *(x for c in cats for x in ("--category", c)), token=tokens["gina"])
        assert code == 0, err
    assert add("audrey", "auditor", token=tokens["gina"])[0] == 0
    tokens.update({name: login(name) for name in ("alice", "dave", "carol", "audrey")})
    return tokens


def submitted(token: str) -> dict[str, Any]:
    import json

    code, out, err = cli("submit", REFUND, "--tools", TOOLS, "--policy", POLICY, "--token", token, "--json")
    assert code == 0, err
    return json.loads(out)  # type: ignore[no-any-return]


def decisions(db: str, plan_id: str) -> list[tuple[str, str]]:
    rows = open_store(db).query("SELECT actor, decision FROM approvals WHERE plan_id = ? ORDER BY id", (plan_id,))
    return [(r[0], r[1]) for r in rows]


def test_a_name_typed_with_as_proves_nothing_once_there_are_accounts(people: dict[str, str], db: str) -> None:
    plan = submitted(people["alice"])
    assert plan["requested_by"] == "alice"
    for args in (("--as", "nobody-at-all"), ("--as", "carol"), ()):
        code, _, err = cli("approve", plan["id"], "--hash", plan["hash"], *args)
        assert code == 4 and err.count("\n") == 1, (code, err)
        assert "this store has accounts: sign in with `plangate login NAME`" in err
    code, _, err = cli("approve", plan["id"], "--hash", plan["hash"], "--as", "carol", "--token", people["dave"])
    assert code == 4 and "--as carol does not match the token's account dave" in err
    code, _, err = cli("submit", REFUND, "--tools", TOOLS, "--policy", POLICY, "--as", "alice")
    assert code == 4 and "sign in" in err
    assert decisions(db, plan["id"]) == [], "nothing was recorded"


def test_each_role_does_only_what_it_may(people: dict[str, str], db: str) -> None:
    plan = submitted(people["alice"])
    code, _, err = cli("approve", plan["id"], "--hash", plan["hash"], "--token", people["audrey"])
    assert code == 4 and "auditors read, they do not change anything" in err
    code, _, err = cli("submit", REFUND, "--tools", TOOLS, "--policy", POLICY, "--token", people["audrey"])
    assert code == 4 and "auditor" in err
    code, _, err = cli("approve", plan["id"], "--hash", plan["hash"], "--token", people["alice"])
    assert code == 4 and "may not decide on plans of category 'refunds'" in err
    code, _, err = cli("reject", plan["id"], "--comment", "no", "--token", people["alice"])
    assert code == 4
    code, _, err = cli("register", "set", "refunds", "on", "--reason", "r", "--token", people["carol"])
    assert code == 4 and "governance does that" in err
    assert decisions(db, plan["id"]) == []
    code, out, err = cli("approve", plan["id"], "--hash", plan["hash"], "--token", people["dave"], "--as", "Dave ")
    assert code == 0, err
    code, out, err = cli("approve", plan["id"], "--hash", plan["hash"], "--token", people["carol"])
    assert code == 0 and "approved" in out, err
    assert decisions(db, plan["id"]) == [("dave", "approved"), ("carol", "approved")]
    code, out, err = cli("execute", plan["id"], "--token", people["dave"])
    assert code == 0, err
    events = open_store(db).query("SELECT actor FROM events WHERE plan_id = ? AND kind = 'run.started'", (plan["id"],))
    assert events == [("dave",)], "the run is recorded under the token's account, not 'engine'"


def test_accounts_change_only_with_a_governance_token(people: dict[str, str], db: str) -> None:
    code, _, err = add("mallory", "governance", "--category", "*")
    assert code == 4 and "sign in" in err
    code, _, err = add("mallory", "governance", "--category", "*", token=people["alice"])
    assert code == 4 and "may not change accounts" in err
    code, _, err = cli("users", "token", "gina", "--token", people["alice"])
    assert code == 4
    code, _, err = add("\u0430lice", "approver", token=people["gina"])
    assert code == 2 and "mixes scripts" in err
    code, out, _ = cli("users", "list")
    assert "mallory" not in out and "alice" in out
    events = open_store(db).query("SELECT data FROM events WHERE kind = 'account.changed'")
    assert not any("mallory" in row[0] for row in events)


def test_tokens_expire_get_revoked_and_die_with_a_disabled_account(people: dict[str, str], db: str) -> None:
    code, out, err = cli("users", "token", "dave", "--label", "ci", "--expires", "400d", "--token", people["gina"])
    assert code == 2 and "between 1 hour and 366 days" in err
    code, out, err = cli("users", "token", "dave", "--label", "ci", "--expires", "30d", "--token", people["gina"])
    assert code == 0 and out.startswith("pgt_")
    ci = out.strip()
    code, out, _ = cli("users", "list")
    assert "'ci'" in out and "2 live token(s)" in out
    token_id = ci.split("_")[1]
    assert cli("users", "revoke", "dave", "--token-id", token_id, "--token", people["gina"])[0] == 0
    plan = submitted(people["alice"])
    code, _, err = cli("approve", plan["id"], "--hash", plan["hash"], "--token", ci)
    assert code == 4 and "unknown, expired or revoked" in err
    assert cli("users", "disable", "dave", "--token", people["gina"])[0] == 0
    code, _, err = cli("approve", plan["id"], "--hash", plan["hash"], "--token", people["dave"])
    assert code == 4 and "unknown, expired or revoked, or its account is disabled" in err
    code, _, err = cli("login", "dave", "--password-stdin", stdin=PASSWORD + "\n")
    assert code == 4 and "wrong user or password" in err
    assert cli("users", "enable", "dave", "--token", people["gina"])[0] == 0
    code, _, err = cli("approve", plan["id"], "--hash", plan["hash"], "--token", people["dave"])
    assert code == 0, err
    assert decisions(db, plan["id"]) == [("dave", "approved")]


def test_login_keeps_a_private_token_and_logout_revokes_it(people: dict[str, str], db: str) -> None:
    code, out, err = cli("login", "Carol", "--password-stdin", stdin=PASSWORD + "\n")
    assert code == 0 and "signed in as carol (approver)" in out, err
    assert stat.S_IMODE(token_path().stat().st_mode) == 0o600
    plan = submitted(people["alice"])
    code, out, err = cli("approve", plan["id"], "--hash", plan["hash"])  # the kept token
    assert code == 0, err
    kept = token_path().read_text().strip()
    code, out, _ = cli("logout")
    assert code == 0 and "carol's token revoked" in out and not token_path().exists()
    code, _, err = cli("reject", plan["id"], "--comment", "x", "--token", kept)
    assert code == 4 and "revoked" in err
    code, _, err = cli("login", "carol", "--password-stdin", stdin="wrong password\n")
    assert code == 4 and "wrong user or password" in err and not token_path().exists()


def test_local_mode_records_names_in_one_form(db: str) -> None:
    import json

    code, out, err = cli("submit", REFUND, "--tools", TOOLS, "--policy", POLICY, "--as", "Alice ", "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["requested_by"] == "alice"
    code, _, err = cli("approve", plan["id"], "--hash", plan["hash"], "--as", "ALICE")
    assert code == 4 and "requested plan" in err
    code, _, err = cli("submit", REFUND, "--tools", TOOLS, "--policy", POLICY)
    assert code == 2 and "say who you are with --as NAME" in err
