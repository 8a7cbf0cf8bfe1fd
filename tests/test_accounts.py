"""Accounts as the audit log records them: names, tokens, sessions, and what a database writer cannot do."""

from __future__ import annotations

import sqlite3
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from plangate import ledger
from plangate._keys import SECRET_KEY
from plangate.accounts import Accounts, User, duration
from plangate.errors import GovernanceError, NotFoundError, SelfApprovalError, StoreError, UsageError
from plangate.names import canonical, new_name, same_person
from plangate.policy import Policy
from plangate.runtime import Runtime
from plangate.store import open_store
from tests.conftest import load_plan

PASSWORD = "correct horse battery"


class Clock:
    def __init__(self) -> None:
        self.moment = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)

    def now(self) -> datetime:
        return self.moment


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/accounts.db"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def accounts(db: str, clock: Clock) -> Accounts:
    made = Accounts(open_store(db), clock)
    made.add("gina", "governance", password=PASSWORD, categories=("*",))
    made.add("alice", "requester", password=PASSWORD)
    return made


def sql(db: str, statement: str, *args: object) -> None:
    """Someone with write access to the database, not to the audit key."""
    with sqlite3.connect(db.removeprefix("sqlite:///")) as conn:
        conn.execute(statement, args)


# -- names ------------------------------------------------------------------------------------------


def test_one_person_one_name() -> None:
    assert canonical("Alice") == canonical("alice ") == canonical("ＡＬＩＣＥ") == "alice"
    assert same_person("alice", "\u0430lice") and same_person("alice", "\u0430l\u0456c\u0435")
    with pytest.raises(UsageError, match="mixes scripts"):
        new_name("\u0430lice")  # a Cyrillic a among Latin letters
    with pytest.raises(UsageError, match="letters, digits"):
        new_name("alice\u202e")
    with pytest.raises(UsageError, match="empty"):
        new_name("   ")


def test_look_alike_names_are_refused_and_spellings_are_one_account(accounts: Accounts) -> None:
    assert accounts.get("Alice ") == accounts.get("ALICE") == accounts.get("alice")
    with pytest.raises(UsageError, match="looks like the existing account 'alice'"):
        accounts.add("\u0430\u04cf\u0456\u0441\u0435", "approver", categories=("*",))  # all Cyrillic
    with pytest.raises(UsageError, match="looks like the existing account 'alice'"):
        accounts.add("a1ice", "approver", categories=("*",))
    accounts.add(" Alice", "requester")  # the same account, changed
    assert [u.name for u in accounts.all()] == ["alice", "gina"]


def test_four_eyes_holds_across_spellings_and_look_alikes(tmp_path: Path, catalogue: object, policy: Policy) -> None:
    rt = Runtime(catalogue, policy, db=f"sqlite:///{tmp_path}/p.db")  # type: ignore[arg-type]
    record = rt.submit(load_plan("refund"), requested_by="alice")
    for spelling in ("Alice", "alice ", "ALICE", "\u0430lice"):
        with pytest.raises(SelfApprovalError, match="requested plan"):
            rt.approve(record.id, spelling, record.hash)
    rt.approve(record.id, "dave", record.hash)
    with pytest.raises(GovernanceError, match="already approved"):
        rt.approve(record.id, "Dave ", record.hash)


def test_policy_users_are_found_by_any_spelling() -> None:
    policy = Policy.from_yaml("version: 1\nname: p\nroles: {support: {}}\nusers: {Alice: support}\n")
    assert policy.users == {"alice": "support"}
    with pytest.raises(Exception, match="listed twice"):
        Policy.from_yaml("version: 1\nname: p\nroles: {support: {}}\nusers: {Alice: support, 'alice ': support}\n")


# -- every change is an audit event, and the events are the accounts ---------------------------------


def test_every_account_change_is_an_audit_event(accounts: Accounts, db: str) -> None:
    gina = accounts.get("gina")
    accounts.add("dave", "approver", categories=("refunds",), slack_id="U012AB3CD", by=gina)
    token = accounts.issue_token("dave", "laptop", by=gina)
    accounts.add("dave", "approver", categories=("refunds", "maintenance"), by=gina)
    accounts.disable("dave", by=gina)
    accounts.enable("dave", by=gina)
    accounts.revoke("dave", by=gina)
    changes = [(e.actor, e.data["name"], e.data["change"]) for e in accounts.store.verified_events("account.changed")]
    assert changes == [
        ("local operator", "gina", "saved"),
        ("local operator", "alice", "saved"),
        ("gina", "dave", "saved"),
        ("gina", "dave", "token.issued"),
        ("gina", "dave", "saved"),
        ("gina", "dave", "disabled"),
        ("gina", "dave", "enabled"),
        ("gina", "dave", "token.revoked"),
    ]
    assert token not in str([e.data for e in accounts.store.verified_events("account.changed")])
    assert ledger.verify(accounts.store).ok


def test_rows_written_in_the_database_make_no_one_anyone(accounts: Accounts, db: str) -> None:
    from argon2 import PasswordHasher

    forged = PasswordHasher().hash("attacker-password")
    sql(db, "INSERT INTO users (name, role, categories, password_hash, created_at) VALUES (?, ?, ?, ?, ?)",
        "mallory", "governance", '["*"]', forged, "2026-01-01T00:00:00Z")  # fmt: skip
    sql(db, "UPDATE users SET role = 'governance', categories = '[\"*\"]' WHERE name = 'alice'")
    sql(db, "UPDATE users SET password_hash = ? WHERE name = 'gina'", forged)
    token = "pgt_00000000_forged"
    import hashlib

    sql(db, "INSERT INTO api_tokens (digest, user_name, label, created_at, id, expires_at) VALUES (?, ?, ?, ?, ?, ?)",
        hashlib.sha256(token.encode()).hexdigest(), "gina", "x", "2026-01-01T00:00:00Z", "00000000",
        "2099-01-01T00:00:00Z")  # fmt: skip
    assert accounts.get("mallory") is None and accounts.login("mallory", "attacker-password") is None
    assert accounts.get("alice") == User(name="alice", role="requester")
    assert accounts.login("gina", "attacker-password") is None and accounts.login("gina", PASSWORD) is None
    assert accounts.by_token(token) is None


def test_an_account_event_changed_in_the_database_is_refused(accounts: Accounts, db: str) -> None:
    sql(db, "UPDATE events SET data = replace(data, '\"requester\"', '\"governance\"') WHERE kind = 'account.changed'")
    with pytest.raises(StoreError, match=r"account\.changed events were changed outside plangate"):
        accounts.get("alice")


def test_only_governance_changes_accounts(accounts: Accounts) -> None:
    alice = accounts.get("alice")
    with pytest.raises(GovernanceError, match="may not change accounts"):
        accounts.add("alice", "governance", by=alice)
    with pytest.raises(GovernanceError, match="may not change accounts"):
        accounts.issue_token("gina", by=alice)
    assert accounts.issue_token("alice", "own", by=alice).startswith("pgt_")  # a token for oneself
    gina = accounts.get("gina")
    accounts.disable("alice", by=gina)
    with pytest.raises(GovernanceError, match="not an active account"):
        accounts.issue_token("alice", by=alice)
    with pytest.raises(UsageError, match="cannot disable itself"):
        accounts.disable("gina", by=gina)
    with pytest.raises(NotFoundError, match="no account 'nobody'"):
        accounts.disable("nobody", by=gina)


# -- tokens ------------------------------------------------------------------------------------------


def test_tokens_expire_and_can_be_revoked(accounts: Accounts, clock: Clock) -> None:
    short = accounts.issue_token("alice", "ci", lifetime=duration("12h"))
    default = accounts.issue_token("alice", "laptop")
    assert accounts.by_token(short) == accounts.by_token(default) == accounts.get("alice")
    clock.moment += timedelta(hours=13)
    assert accounts.by_token(short) is None and accounts.by_token(default) is not None
    clock.moment += timedelta(days=90)
    assert accounts.by_token(default) is None, "the default lifetime is not forever"
    third = accounts.issue_token("alice", "third")
    fourth = accounts.issue_token("alice", "fourth")
    listed = {t.label: t for t in accounts.tokens("alice")}
    revoked = accounts.revoke("alice", listed["third"].id)
    assert [t.label for t in revoked] == ["third"]
    assert accounts.by_token(third) is None and accounts.by_token(fourth) is not None
    with pytest.raises(NotFoundError, match="no live token"):
        accounts.revoke("alice", listed["third"].id)
    accounts.revoke("alice")
    assert accounts.by_token(fourth) is None
    assert all(t.revoked_at for t in accounts.tokens("alice") if t.label in ("third", "fourth"))


def test_token_lifetimes() -> None:
    assert duration("90d") == timedelta(days=90) and duration("12h") == timedelta(hours=12)
    for bad in ("forever", "0d", "400d", "-1d", "90"):
        with pytest.raises(UsageError, match=r"lifetime|between"):
            duration(bad)


# -- sessions ----------------------------------------------------------------------------------------


def test_sessions_end_at_logout_disable_and_revoke(accounts: Accounts, clock: Clock, db: str) -> None:
    alice = accounts.get("alice")
    assert alice is not None
    first = accounts.open_session(alice, hours=8)
    assert accounts.session_user(first) == alice
    accounts.end_session(first)
    assert accounts.session_user(first) is None, "logout ends the session"
    second, third = accounts.open_session(alice, hours=8), accounts.open_session(alice, hours=8)
    token = accounts.issue_token("alice")
    clock.moment += timedelta(seconds=1)
    accounts.disable("alice")
    assert accounts.session_user(second) is None and accounts.by_token(token) is None
    assert accounts.login("alice", PASSWORD) is None
    accounts.enable("alice")
    assert accounts.session_user(second) is None, "a disabled account's sessions stay ended"
    clock.moment += timedelta(seconds=1)
    fourth = accounts.open_session(alice, hours=8)
    assert accounts.session_user(fourth) == alice
    clock.moment += timedelta(seconds=1)
    accounts.revoke("alice")
    assert accounts.session_user(fourth) is None and accounts.session_user(third) is None
    fifth = accounts.open_session(alice, hours=1)
    clock.moment += timedelta(hours=2)
    assert accounts.session_user(fifth) is None
    changes = [e.data["change"] for e in accounts.store.verified_events("account.changed")]
    assert changes[-5:] == ["signed-out", "token.issued", "disabled", "enabled", "token.revoked"]


def test_a_logout_cut_out_of_the_log_does_not_revive_the_session(accounts: Accounts, db: str, clock: Clock) -> None:
    alice = accounts.get("alice")
    assert alice is not None
    session = accounts.open_session(alice, hours=8)
    accounts.end_session(session)
    sql(db, "DELETE FROM events WHERE kind = 'account.changed' AND data LIKE '%signed-out%'")
    with pytest.raises(StoreError, match="changed outside plangate"):
        Accounts(open_store(db), clock).session_user(session)


def test_deleting_every_account_event_does_not_bring_back_local_mode(accounts: Accounts, db: str) -> None:
    from plangate.identity import actor

    sql(db, "DELETE FROM events WHERE kind = 'account.changed'")
    sql(db, "DELETE FROM users")
    fresh = Accounts(open_store(db))
    with pytest.raises(StoreError, match="deleted outside plangate"):
        actor(fresh.store, token=None, claimed="gina")
    sql(db, "DELETE FROM settings WHERE key = 'tail:account.changed'")
    with pytest.raises(StoreError, match="events were deleted"):
        actor(Accounts(open_store(db)).store, token=None, claimed="gina")


def test_the_signing_secret_lives_outside_the_database(accounts: Accounts, db: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    path = tmp_path / "keys" / "secret.key"
    monkeypatch.setenv("PLANGATE_SECRET_KEY_FILE", str(path))
    secret = SECRET_KEY.get()
    assert len(secret) >= 32 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert SECRET_KEY.get() == secret
    rows = accounts.store.query("SELECT key FROM settings")
    assert all("secret" not in key for (key,) in rows)
    monkeypatch.setenv("PLANGATE_SECRET_KEY", "s" * 40)
    assert SECRET_KEY.get() == b"s" * 40


# -- who acts: local mode, token mode ----------------------------------------------------------------


def test_local_mode_records_the_name_given_in_canonical_form(tmp_path: Path) -> None:
    from plangate.identity import actor

    store = open_store(f"sqlite:///{tmp_path}/local.db")
    assert actor(store, token=None, claimed=" Alice") == actor(store, token=None, claimed="ALICE")
    assert actor(store, token=None, claimed=None, default="engine").name == "engine"
    with pytest.raises(UsageError, match="--as NAME"):
        actor(store, token=None, claimed="  ")


def test_token_mode_needs_a_live_token_and_the_name_must_match(accounts: Accounts, clock: Clock) -> None:
    from plangate.errors import NotPermittedError, SignInRequiredError
    from plangate.identity import actor, permit

    with pytest.raises(SignInRequiredError, match="this store has accounts: sign in with `plangate login NAME`"):
        actor(accounts.store, token=None, claimed="nobody-at-all")
    with pytest.raises(SignInRequiredError, match="unknown, expired or revoked"):
        actor(accounts.store, token="pgt_forged", claimed=None)
    token = accounts.issue_token("alice", lifetime=duration("1h"))
    assert actor(accounts.store, token=token, claimed=None, clock=clock).name == "alice"
    assert actor(accounts.store, token=token, claimed="Alice ", clock=clock).user == accounts.get("alice")
    with pytest.raises(NotPermittedError, match="--as gina does not match the token's account alice"):
        actor(accounts.store, token=token, claimed="gina", clock=clock)
    clock.moment += timedelta(hours=2)
    with pytest.raises(SignInRequiredError, match="expired"):
        actor(accounts.store, token=token, claimed=None, clock=clock)
    alice, gina = accounts.get("alice"), accounts.get("gina")
    with pytest.raises(NotPermittedError, match="may not change the accounts"):
        permit(alice, "accounts")
    with pytest.raises(NotPermittedError, match="may not decide on plans of category 'refunds'"):
        permit(alice, "decide", "refunds")
    permit(gina, "decide", "refunds")
    permit(None, "accounts")  # the local operator


def test_the_token_file_is_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from plangate.identity import find_token, forget_token, save_token, token_path

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert find_token() is None
    path = save_token("pgt_abc_def")
    assert path == token_path() and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert find_token() == "pgt_abc_def" and find_token("pgt_given") == "pgt_given"
    monkeypatch.setenv("PLANGATE_TOKEN", "pgt_env")
    assert find_token() == "pgt_env"
    monkeypatch.delenv("PLANGATE_TOKEN")
    path.chmod(0o644)
    with pytest.raises(UsageError, match="only you may read: chmod 600"):
        find_token()
    assert forget_token() and not forget_token()
    import os

    os.mkfifo(path)
    with pytest.raises(UsageError, match="regular file"):
        find_token()


def test_reading_accounts_while_another_process_changes_them_sees_no_tampering(db: str) -> None:
    """The events and their seal are read in separate statements: a write in between is not an attack."""
    import threading

    writer = Accounts(open_store(db))
    writer.add("gina", "governance")
    token = writer.issue_token("gina")
    problems: list[Exception] = []
    done = threading.Event()

    def write() -> None:
        store = open_store(db)
        for i in range(40):
            Accounts(store).issue_token("gina", f"t{i}")
        done.set()

    thread = threading.Thread(target=write)
    thread.start()
    reader = Accounts(open_store(db))
    while not done.is_set():
        try:
            assert reader.by_token(token) is not None
        except StoreError as exc:
            problems.append(exc)
    thread.join()
    assert not problems, problems[:1]
