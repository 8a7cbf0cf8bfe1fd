"""Attacks on the first review's fixes (a second review), kept as regression tests.

Each test failed on the code it was written against, before its fix.
"""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue, Policy
from plangate.accounts import Accounts
from plangate.store import open_store
from plangate.tools import tool
from tests.conftest import EXAMPLES
from tests.helpers import plan

PASSWORD = "correct horse battery"


def sql(db: str, *statements: tuple[Any, ...]) -> None:
    """Someone with write access to the database, not to the audit key or the server's secret."""
    with sqlite3.connect(db.removeprefix("sqlite:///")) as conn:
        for statement, *args in statements:
            conn.execute(statement, args)


def setting(db: str, key: str) -> str:
    with sqlite3.connect(db.removeprefix("sqlite:///")) as conn:
        return str(conn.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()[0])


def fresh_process() -> None:
    """What a new process would know: nothing verified yet."""
    from plangate.store import _log

    _log._VERIFIED.clear()


def other_event(db: str) -> None:
    store = open_store(db)
    with store.transaction():
        store.append_event(
            plan_id=None, version=None, step_id=None, kind="other.thing", actor="x", at="2030-01-01T00:00:00.000000Z",
            data={},
        )  # fmt: skip
    store.close()


# -- 1. local mode comes back when the account events are relabelled (not deleted) ------------------


def test_relabelled_account_events_do_not_bring_back_local_mode(tmp_path: Path) -> None:
    """The first fix counts events to see deletion; changing their kind deletes none, so no gap shows."""
    from plangate.errors import PlangateError
    from plangate.identity import actor

    db = f"sqlite:///{tmp_path}/accounts.db"
    accounts = Accounts(open_store(db))
    accounts.add("gina", "governance", password=PASSWORD, categories=("*",))
    accounts.add("alice", "requester", password=PASSWORD)
    accounts.store.close()
    sql(
        db,
        ("UPDATE events SET kind = 'account.renamed' WHERE kind = 'account.changed'",),
        ("DELETE FROM settings WHERE key = 'tail:account.changed'",),
    )
    fresh_process()
    with pytest.raises(PlangateError):
        who = actor(open_store(db), token=None, claimed="gina")
        pytest.fail(f"a store with accounts is in local mode again: --as gina is believed ({who})")


def test_relabelled_register_events_do_not_release_a_held_category(tmp_path: Path) -> None:
    """The same for the register: a category governance held for people is auto-approved again."""
    from plangate.errors import PlangateError
    from plangate.register import Register

    db = f"sqlite:///{tmp_path}/register.db"
    store = open_store(db)
    Accounts(store).add("gina", "governance", password=PASSWORD, categories=("*",))
    Register(store).set("lookups", False, by="gina", reason="a leak last week")
    store.close()
    sql(
        db,
        ("UPDATE events SET kind = 'register.renamed' WHERE kind = 'register.changed'",),
        ("DELETE FROM settings WHERE key = 'tail:register.changed'",),
    )
    fresh_process()
    try:
        entry = Register(open_store(db)).get("lookups")
    except PlangateError:
        return
    assert entry is not None and not entry.auto, "the register's hold on 'lookups' vanished without a trace"


# -- 2. the newest account events cut out of the middle of the log, an older seal put back -----------


def test_an_account_event_cut_from_the_middle_of_the_log_is_refused(tmp_path: Path) -> None:
    """_follows only looks at the event right after the kind's (now) newest one, not at the hole further on."""
    from plangate.errors import StoreError

    db = f"sqlite:///{tmp_path}/accounts.db"
    accounts = Accounts(open_store(db))
    accounts.add("gina", "governance", password=PASSWORD, categories=("*",))
    accounts.add("mallory", "approver", password=PASSWORD, categories=("*",))
    token = accounts.issue_token("mallory")
    old_seal = setting(db, "tail:account.changed")  # read any time by someone who can read the database
    other_event(db)
    accounts.disable("mallory")  # mallory left; the server process knows it
    other_event(db)
    assert accounts.by_token(token) is None
    sql(
        db,
        ("DELETE FROM events WHERE kind = 'account.changed' AND data LIKE '%\"disabled\"%'",),
        ("UPDATE settings SET value = ? WHERE key = 'tail:account.changed'", old_seal),
    )
    for process in ("the long-lived server", "a new process"):
        try:
            user = accounts.by_token(token)
        except StoreError:
            continue
        assert user is None, f"{process}: disabled account {user.name} is back, its token works again"
        if process == "the long-lived server":
            fresh_process()


# -- 3. text a reviewer reads that still skips the rules --------------------------------------------


@pytest.mark.parametrize(
    "char",
    [
        "\u034f",  # COMBINING GRAPHEME JOINER: default-ignorable, draws nothing
        "\u17b4",  # KHMER VOWEL INHERENT AQ: default-ignorable, draws nothing
        "\u180b",  # MONGOLIAN FREE VARIATION SELECTOR ONE
        "\ufe00",  # VARIATION SELECTOR-1 (the 256 selectors hide any bytes in plain sight)
        "\U000e0100",  # VARIATION SELECTOR-17
        "\U000e0002",  # unassigned, in the tag block: default-ignorable
    ],
)
def test_default_ignorable_characters_are_refused_in_plans(char: str) -> None:
    """U+200B is refused as invisible; these draw exactly as little and pass."""
    from plangate.errors import PlanError
    from plangate.plan import Plan

    body = plan(
        {"id": 1, "tool": "send_email", "params": {"to": f"ceo@exa{char}mple.com", "subject": "s", "body": "b"}}
    )
    with pytest.raises(PlanError):
        Plan.parse(body)
        pytest.fail(f"U+{ord(char):04X} accepted in a value a reviewer reads as ceo@example.com")


def test_account_categories_refuse_bidi_text(tmp_path: Path) -> None:
    """users add --category: shown in users list, held against plans' categories, never checked."""
    from plangate.errors import PlangateError

    accounts = Accounts(open_store(f"sqlite:///{tmp_path}/a.db"))
    with pytest.raises(PlangateError):
        accounts.add("dave", "approver", password=PASSWORD, categories=("refunds\u202e\u2066*",))
        pytest.fail("a category with bidi controls was accepted for an account")


def test_library_template_names_refuse_bidi_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """library add --name: the name goes into the audit event (the plan's trace) unchecked."""
    from click.testing import CliRunner

    from plangate.cli import main
    from plangate.runtime import Runtime

    db = f"sqlite:///{tmp_path}/lib.db"
    monkeypatch.setenv("PLANGATE_DB", db)
    rt = Runtime(Catalogue.from_module(EXAMPLES / "business.py"), Policy.load(EXAMPLES / "policy.yaml"), db=db)
    body = plan(
        {"id": 1, "tool": "get_invoice", "params": {"invoice_id": "INV-1"}}, category="lookups", task="Look up INV-1"
    )
    record = rt.submit(body, requested_by="alice")
    assert record.status == "approved", record.status
    rt.close()
    name = "lookup \u202eyad-eno\u202c"
    result = CliRunner().invoke(main, ["library", "add", record.id, "--name", name, "--as", "dave"])
    store = open_store(db)
    names = [t.name for t in store.templates()]
    assert name not in names, f"a template named with bidi controls was kept: {result.output}"


# -- 4. deny rules: a whole plan's check still takes many seconds ------------------------------------


def test_a_whole_plan_of_costly_values_is_checked_within_one_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each step's budget is 20,000 steps plus 16 a character, per rule: 500 steps of a 1 MB plan add up
    to about 25 million steps per costly rule (about 10 seconds here, twice that with two such rules);
    the plan is refused, but only after."""
    from plangate import _patterns
    from plangate.check import check
    from plangate.plan import Plan

    spent = [0]
    real = _patterns.Meter.spend

    def counting(self: _patterns.Meter, steps: int) -> None:
        spent[0] += steps
        real(self, steps)

    monkeypatch.setattr(_patterns.Meter, "spend", counting)
    rules = "".join(f"  - name: s{i}\n    pattern: 'a.{{0,2000}}b{i}'\n" for i in range(1))
    policy = Policy.from_yaml("version: 1\nname: p\ndeny:\n" + rules)
    random.seed(3)
    steps = [
        {"id": i + 1, "tool": "lookup_customer", "params": {"customer_id": "".join(random.choices("ac", k=1900))}}
        for i in range(500)
    ]
    body = plan(*steps)
    assert len(json.dumps(body)) < 1_048_576  # within the API's body limit and the plan's
    check(Plan.parse(body), Catalogue.from_module(EXAMPLES / "business.py"), policy)
    assert spent[0] <= 10_000_000, f"one check spent {spent[0]:,} steps on deny patterns (a few seconds is ~10M)"


# -- 5. a small plan makes a check result (and an audit event) of tens of megabytes ------------------


def test_a_small_plan_does_not_record_megabytes_of_violations(tmp_path: Path) -> None:
    """500 unordered sends to one resource: a violation per pair (124,750), all stored twice, all sent back."""
    from plangate.runtime import Runtime

    db = f"sqlite:///{tmp_path}/big.db"
    rt = Runtime(Catalogue.from_module(EXAMPLES / "business.py"), Policy.load(EXAMPLES / "policy.yaml"), db=db)
    steps = [
        {"id": i + 1, "tool": "send_email", "params": {"to": "a@example.com", "subject": "s", "body": "b"}}
        for i in range(500)
    ]
    body = plan(*steps, category="maintenance")
    size = len(json.dumps(body))  # about 60 KB
    rt.submit(body, requested_by="alice")
    rt.close()
    with sqlite3.connect(db.removeprefix("sqlite:///")) as conn:
        recorded = conn.execute("SELECT MAX(LENGTH(data)) FROM events WHERE kind = 'plan.checked'").fetchone()[0]
    assert recorded <= 20 * size, f"a {size:,}-byte plan made a {recorded:,}-byte audit event"


# -- 6. deny rules do not look at the keys of an object parameter -------------------------------------


@tool(effect="irreversible", external=True)
def post_json(url: str, payload: dict[str, str]) -> str:
    """Send a JSON object somewhere."""
    return "sent"


def test_a_deny_rule_sees_the_keys_of_an_object_parameter() -> None:
    from plangate.check import check
    from plangate.plan import Plan

    policy = Policy.from_yaml(
        "version: 1\nname: p\ndeny:\n  - name: no-keys\n    pattern: 'sk-[A-Za-z0-9]{20}'\n    message: leaks a key\n"
    )
    secret = "sk-" + "A" * 20
    body = plan({"id": 1, "tool": "post_json", "params": {"url": "https://x.example", "payload": {secret: "1"}}})
    result = check(Plan.parse(body), Catalogue([post_json]), policy)
    assert any(v.rule == "deny:no-keys" for v in result.violations), (
        "the secret went out as the key of an object parameter, unseen by the deny rule"
    )


# -- 7. a whole-script look-alike the table does not know -----------------------------------------------


def test_an_armenian_look_alike_of_an_account_name_is_refused(tmp_path: Path) -> None:
    """հսցօ (Armenian, one script) reads as hugo; the look-alike table knows Cyrillic, Greek and Latin only."""
    from plangate.errors import PlangateError
    from plangate.names import same_person

    accounts = Accounts(open_store(f"sqlite:///{tmp_path}/a.db"))
    accounts.add("hugo", "approver", password=PASSWORD, categories=("*",))
    look_alike = "\u0570\u057d\u0581\u0585"
    assert same_person("hugo", look_alike), "four-eyes counts hugo and հսցօ as two people"
    with pytest.raises(PlangateError):
        accounts.add(look_alike, "approver", password=PASSWORD, categories=("*",))
