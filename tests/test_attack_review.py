"""Attacks on "every door holds" found in an attacker's review, kept as regression tests (each failed before)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue, Policy
from plangate.accounts import Accounts
from plangate.store import open_store
from tests.conftest import load_plan
from tests.serverkit import browser, setup

PASSWORD = "correct horse battery"


def sql(db: str, statement: str, *args: object) -> None:
    """Someone with write access to the database, not to the audit key or the server's secret."""
    with sqlite3.connect(db.removeprefix("sqlite:///")) as conn:
        conn.execute(statement, args)


@pytest.fixture
def server(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> dict[str, Any]:
    return setup(tmp_path, catalogue, policy)


# -- 1. sessions: tests/test_server_identity.py and tests/test_accounts.py (a session is its signed cookie) ----


# -- 2. deleting the account events puts a store with accounts back in local mode --------------------


def test_deleting_the_account_events_does_not_bring_back_local_mode(tmp_path: Path) -> None:
    from plangate.errors import PlangateError
    from plangate.identity import actor

    db = f"sqlite:///{tmp_path}/accounts.db"
    accounts = Accounts(open_store(db))
    accounts.add("gina", "governance", password=PASSWORD, categories=("*",))
    accounts.add("alice", "requester", password=PASSWORD)
    accounts.store.close()
    sql(db, "DELETE FROM events WHERE kind = 'account.changed'")  # the seal tail:account.changed is left as it was
    store = open_store(db)
    with pytest.raises(PlangateError):
        who = actor(store, token=None, claimed="gina")  # no token: only local mode would take a typed name
        pytest.fail(f"a store that had accounts is in local mode again: --as gina is believed ({who})")


# -- 3. text a reviewer reads that skips the bidi/control check ---------------------------------------


BIDI = "cancelled \u202eyad-eno\u202c"  # shows as "cancelled one-day"


def test_dashboard_forms_refuse_bidi_text_like_the_api(server: dict[str, Any]) -> None:
    from tests.test_server_api import halted

    plan = halted(server)
    client, csrf = browser(server, "dave")
    note = client.post(
        f"/plans/{plan['id']}/settle", data={"step": "1", "done": "no", "note": BIDI, "csrf": csrf},
        follow_redirects=False,
    )  # fmt: skip
    reason = client.post(f"/plans/{plan['id']}/compensate", data={"reason": BIDI, "csrf": csrf}, follow_redirects=False)
    gina, gcsrf = browser(server, "gina")
    register = gina.post(
        "/register", data={"category": "refunds\u202e", "state": "on", "reason": BIDI, "csrf": gcsrf},
        follow_redirects=False,
    )  # fmt: skip
    accepted = {
        name: reply.status_code
        for name, reply in (("settle note", note), ("compensate reason", reason), ("register", register))
        if reply.status_code < 400
    }
    assert not accepted, f"bidi text accepted through the dashboard's forms (the JSON API refuses it): {accepted}"


@pytest.mark.parametrize(
    "char",
    ["\u00ad", "\u2062", "\u2064", "\u180e", "\u206a", "\ufff9", "\u3164", "\U000e0041"],
    ids=["soft-hyphen", "invisible-times", "invisible-plus", "mongolian-vs", "inhibit-swapping", "annotation",
         "hangul-filler", "tag-letter-A"],
)  # fmt: skip
def test_invisible_format_characters_are_refused_in_plans(char: str) -> None:
    from plangate.errors import PlanError
    from plangate.plan import Plan
    from tests.helpers import plan

    with pytest.raises(PlanError):
        Plan.parse(plan({"id": 1, "tool": "calculate", "params": {"expression": "1+1"}}, task=f"refund{char} ok"))


# -- 4. look-alike names ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "look_alike", ["al\u0131ce", "\u0251lice", "rnallory"], ids=["dotless-i", "latin-alpha", "rn-m"]
)
def test_look_alike_account_names_are_refused(tmp_path: Path, look_alike: str) -> None:
    from plangate.errors import UsageError

    accounts = Accounts(open_store(f"sqlite:///{tmp_path}/a.db"))
    accounts.add("alice", "requester")
    accounts.add("mallory", "requester")
    with pytest.raises(UsageError, match="looks like"):
        accounts.add(look_alike, "approver", categories=("*",))


@pytest.mark.parametrize("spelling", ["alice\u00ad", "alice\u200d", "al\u0131ce"], ids=["shy", "zwj", "dotless-i"])
def test_four_eyes_holds_for_invisible_and_latin_look_alikes(
    tmp_path: Path, catalogue: Catalogue, policy: Policy, spelling: str
) -> None:
    from plangate.errors import PlangateError
    from plangate.runtime import Runtime

    rt = Runtime(catalogue, policy, db=f"sqlite:///{tmp_path}/p.db")
    record = rt.submit(load_plan("refund"), requested_by="alice")
    with pytest.raises(PlangateError):
        rt.approve(record.id, spelling, record.hash)
        pytest.fail(f"{spelling!r} approved alice's own plan")


# -- 5. a deny pattern with a bounded repetition makes a check of a large plan take minutes -----------


def test_a_deny_pattern_too_costly_for_a_value_refuses_it_instead_of_running_for_minutes() -> None:
    import random

    from plangate.check import check
    from plangate.plan import Plan
    from tests.conftest import EXAMPLES
    from tests.helpers import plan

    policy = Policy.from_yaml("version: 1\nname: p\ndeny:\n  - name: secrets\n    pattern: 'a.{0,2000}b'\n")
    random.seed(1)
    value = "".join(random.choice("ac") for _ in range(5_000))  # a requester's text: 5 KB of 64 KB allowed
    catalogue = Catalogue.from_module(EXAMPLES / "business.py")
    costly = check(Plan.parse(plan({"id": 1, "tool": "calculate", "params": {"expression": value}})), catalogue, policy)
    denied = [v for v in costly.violations if v.rule.startswith("deny")]
    assert [(v.rule, v.step) for v in denied] == [("deny:secrets", 1)]
    assert "could not be checked against the denied pattern" in denied[0].message
    plain = Policy.from_yaml("version: 1\nname: p\ndeny:\n  - name: secrets\n    pattern: 'sk-[a-z]{20}'\n")
    long = "a" * 60_000
    fine = check(Plan.parse(plan({"id": 1, "tool": "calculate", "params": {"expression": long}})), catalogue, plain)
    assert not [v for v in fine.violations if v.rule.startswith("deny")], "a plain pattern reads a long value"


# -- 6. the command line lets any requester run (or resume) a plan the server would not even show them --


def test_the_command_line_runs_only_plans_its_caller_may_see(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_cli_identity import POLICY, REFUND, TOOLS, add, cli, login, submitted

    monkeypatch.setenv("PLANGATE_DB", f"sqlite:///{tmp_path}/cli.db")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert add("gina", "governance", "--category", "*")[0] == 0
    gina = login("gina")
    for name, role, *extra in (
        ("alice", "requester"),
        ("bob", "requester"),
        ("dave", "approver", "--category", "*"),
        ("carol", "approver", "--category", "*"),
    ):
        assert add(name, role, *extra, token=gina)[0] == 0
    alice, bob, dave, carol = login("alice"), login("bob"), login("dave"), login("carol")
    plan = submitted(alice)
    for approver in (dave, carol):  # the refund needs a person and the privacy officer
        assert cli("approve", plan["id"], "--hash", plan["hash"], "--token", approver)[0] == 0
    assert TOOLS and POLICY and REFUND
    code, out, err = cli("execute", plan["id"], "--token", bob)  # bob: a requester, not of this plan
    assert code == 4, f"bob ran alice's refund from the command line (the server answers 403): {code} {out} {err}"


def test_many_short_values_share_one_budget() -> None:
    """Each of thousands of short values is cheap alone; together they would still take minutes."""
    import random

    from plangate.check import check
    from plangate.plan import Plan
    from tests.conftest import EXAMPLES
    from tests.helpers import plan

    policy = Policy.from_yaml("version: 1\nname: p\ndeny:\n  - name: secrets\n    pattern: 'a.{0,2000}b'\n")
    random.seed(2)
    values = ["".join(random.choice("ac") for _ in range(50)) for _ in range(2_000)]  # each cheap enough alone
    catalogue = Catalogue.from_module(EXAMPLES / "business.py")
    costly = check(
        Plan.parse(plan({"id": 1, "tool": "calculate", "params": {"expression": values}})), catalogue, policy
    )
    denied = [v for v in costly.violations if v.rule == "deny:secrets"]
    assert len(denied) == 1 and "within its budget" in denied[0].message
