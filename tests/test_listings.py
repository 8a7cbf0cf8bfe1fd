"""Listings on a busy installation: what a caller may see and asked for, newest or oldest first, paged."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from click.testing import CliRunner

from plangate import Catalogue, Policy
from plangate._clock import SystemClock
from plangate.cli import main
from plangate.runtime import Runtime
from plangate.server import views
from plangate.store import EVERY_PLAN, PlanQuery, ReadScope, Store, open_store
from plangate.store._schema import MIGRATIONS
from plangate.store._sql import _listing
from plangate.store.postgres import _dialect
from tests import serverkit
from tests.conftest import load_plan
from tests.helpers import FixedClock
from tests.serverkit import MAIL, api, browser

CLEANUP = load_plan("cleanup")
"""A plan in maintenance that the check rejects at once: over and done with."""
CHORE = {**MAIL, "category": "maintenance"}
"""A plan in maintenance that waits for a person."""
LOOKUP = {
    "task": "Look up invoice 42",
    "category": "lookups",
    "steps": [{"id": 1, "tool": "get_invoice", "params": {"invoice_id": "42"}, "rationale": "r"}],
}
"""A plan that only reads."""
VOID = {
    "task": "Void refund r1",
    "category": "refunds",
    "steps": [{"id": 1, "tool": "void_refund", "params": {"refund_id": "r1"}, "rationale": "r"}],
}
"""A plan that writes, and no more."""
LINK = re.compile(r'href="/plans/([0-9a-f-]{36})"')


@pytest.fixture
def setup(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> dict[str, Any]:
    return serverkit.setup(tmp_path, catalogue, policy)


class Earlier(FixedClock):
    """A millisecond a reading from 2020 on, and random ids: plans made with it come before any made now, in order."""

    def __init__(self) -> None:
        super().__init__(datetime(2020, 1, 1, tzinfo=UTC))

    def new_id(self) -> str:
        return SystemClock().new_id()


def others(db: str, catalogue: Catalogue, policy: Policy | None, count: int, plan: dict[str, Any]) -> list[str]:
    """``count`` plans of bob's, submitted before the one a test looks for."""
    rt = Runtime(catalogue, policy, db=db, clock=Earlier())
    try:
        return [rt.submit(plan, "bob").id for _ in range(count)]
    finally:
        rt.close()


def ids(reply: Any) -> list[str]:
    assert reply.status_code == 200, reply.text
    return [plan["id"] for plan in reply.json()]


def test_a_plan_waiting_after_hundreds_of_finished_ones_shows(
    setup: dict[str, Any], catalogue: Catalogue, policy: Policy
) -> None:
    others(setup["db"], catalogue, policy, 600, CLEANUP)
    waiting = api(setup, "alice").post("/api/plans", json=load_plan("refund")).json()
    assert waiting["status"] == "pending_approval"
    for who in ("dave", "gina"):
        client, _ = browser(setup, who)
        assert waiting["id"] in client.get("/").text, f"{who}'s queue"
    gina, _ = browser(setup, "gina")
    assert LINK.findall(gina.get("/plans").text)[0] == waiting["id"], "newest first"
    assert ids(api(setup, "dave").get("/api/plans")) == [waiting["id"]], "dave reads refunds, not maintenance"
    assert ids(api(setup, "gina").get("/api/plans", params={"order": "newest", "limit": 1})) == [waiting["id"]]


def test_a_requesters_own_plan_is_listed_among_plans_they_may_not_read(
    setup: dict[str, Any], catalogue: Catalogue, policy: Policy
) -> None:
    others(setup["db"], catalogue, policy, 520, CHORE)
    own = api(setup, "alice").post("/api/plans", json=load_plan("refund")).json()
    assert own["status"] == "pending_approval"
    assert ids(api(setup, "alice").get("/api/plans")) == [own["id"]]
    for who in ("alice", "dave"):  # dave decides refunds, not maintenance
        client, _ = browser(setup, who)
        assert own["id"] in client.get("/").text and own["id"] in client.get("/plans").text, who


# -- the store: each backend --------------------------------------------------------------------


def walk(store: Store, query: PlanQuery, limit: int) -> Iterator[str]:
    """Every plan ``query`` selects, a page of ``limit`` at a time, each page going on from the last."""
    end = "before" if query.order == "newest" else "after"
    while page := store.list_plans(query, limit):
        yield from (row.id for row in page)
        query = PlanQuery(**{**query.__dict__, end: page[-1].id})


SCOPES = [
    ReadScope(requester="alice"),  # her plans under every spelling of her name
    ReadScope(requester="dave", categories=("refunds",)),
    ReadScope(requester="erin", categories=("re_unds",)),  # '_' is itself, not any character
    ReadScope(requester="erin", categories=("r%",)),  # '%' too
    ReadScope(requester="carol", categories=("r*",)),  # SQLite's LIKE would take "Refunds" too
    ReadScope(requester="carol", categories=("[Rr]efunds", "?ookups")),
    ReadScope(requester="carol", categories=("*",)),
    ReadScope(requester="carol"),  # nothing
]


def test_a_limit_counts_only_the_plans_a_scope_admits(any_db: str, catalogue: Catalogue) -> None:
    names = ["alice", "Alice ", "ＡＬＩＣＥ", "bob", "dave"]
    categories = ["refunds", "Refunds", "re_unds", "maintenance", "lookups", "r%"]
    rt = Runtime(catalogue, None, db=any_db, clock=Earlier())
    for n in range(30):  # every name with every category
        made = rt.submit({**MAIL, "category": categories[n % 6]}, names[n % 5])
        if n % 4 == 0:
            rt.reject(made.id, "gina", "not now")
    store = rt.store
    for order in ("oldest", "newest"):
        every = store.list_plans(PlanQuery(order=order), 1_000)
        assert len(every) == 30 and every == sorted(
            every, key=lambda p: (p.created_at, p.id), reverse=order == "newest"
        )
        for scope in SCOPES:
            for query in (PlanQuery(scope=scope, order=order), PlanQuery(scope=scope, order=order, status="rejected")):
                seen = [p for p in every if scope.admits(category=p.category, requested_by=p.requested_by)]
                seen = [p for p in seen if query.status in (None, p.status)]
                for limit in (1, 2, 5, 40):
                    assert store.list_plans(query, limit) == seen[:limit], (scope, query.status, limit)
                assert list(walk(store, query, 2)) == [p.id for p in seen], (scope, query.status)
    assert {p.requested_by for p in store.list_plans(PlanQuery(scope=SCOPES[0]), 100)} == set(names[:3])
    rt.close()


def test_listings_read_an_index_in_order_and_sort_nothing(any_db: str) -> None:
    """However many plans there are, a page reads its first rows in an index's order and stops."""
    at = ("2026-01-01T00:00:00.000000Z", "x")
    queries = [
        (PlanQuery(order="newest"), None, "plans_created"),
        (PlanQuery(order="newest"), at, "plans_created"),
        (PlanQuery(status="pending_approval", kind="plan", order="newest"), at, "plans_status"),
        (PlanQuery(scope=ReadScope(requester="alice"), order="newest"), at, "plans_requester"),
        (PlanQuery(scope=ReadScope(requester="dave", categories=("refunds", "r*"))), None, "plans_created"),
    ]
    with closing(open_store(any_db)) as store:
        for query, before, index in queries:
            sql, params = _listing(query, before, None)
            if any_db.startswith("postgresql"):
                with psycopg.connect(any_db, autocommit=True) as conn:
                    conn.execute("SET enable_sort = off")  # sorting looks dear: only an ordered index avoids it
                    conn.execute("SET enable_seqscan = off")  # so does reading the table: an empty one costs nothing
                    rows = conn.execute("EXPLAIN " + sql.replace("?", "%s"), (*params, 50)).fetchall()
                    plan = "\n".join(row[0] for row in rows)
            else:
                plan = "\n".join(str(row) for row in store.query("EXPLAIN QUERY PLAN " + sql, (*params, 50)))
            assert index in plan and "Sort" not in plan and "TEMP B-TREE" not in plan, (query, plan)


def test_a_store_from_before_lists_each_requesters_plans(any_db: str) -> None:
    """Plans written before listings filtered by requester get their requester's canonical name as they migrate."""
    rows = [("p1", "Alice "), ("p2", "bob"), ("p3", "ＡＬＩＣＥ"), ("p4", "alice")]
    old = [str(statement) for migration in MIGRATIONS[:10] for statement in migration]  # SQL, every one
    insert = "INSERT INTO plans (id, status, version, hash, task, category, requested_by, created_at, updated_at)"
    values = [(i, "rejected", 1, "h", "t", "refunds", who, f"2026-01-0{i[1]}T00:00:00.000000Z", "x") for i, who in rows]
    if any_db.startswith("postgresql"):
        with psycopg.connect(any_db, autocommit=True) as conn:
            conn.execute("CREATE TABLE plangate_schema (version INTEGER NOT NULL)")
            conn.execute("INSERT INTO plangate_schema (version) VALUES (10)")
            for statement in old:
                conn.execute(_dialect(statement))  # type: ignore[arg-type]
            conn.cursor().executemany(f"{insert} VALUES ({', '.join(['%s'] * 9)})", values)
    else:
        with closing(sqlite3.connect(any_db.removeprefix("sqlite:///"))) as conn, conn:
            for statement in old:
                conn.execute(statement)
            conn.execute("PRAGMA user_version = 10")
            conn.executemany(f"{insert} VALUES ({', '.join(['?'] * 9)})", values)
    with closing(open_store(any_db)) as store:
        assert store.query("SELECT id, requester FROM plans ORDER BY id") == [
            ("p1", "alice"),
            ("p2", "bob"),
            ("p3", "alice"),
            ("p4", "alice"),
        ]
        query = PlanQuery(scope=ReadScope(requester="alice"), order="newest")
        assert [p.id for p in store.list_plans(query)] == ["p4", "p3", "p1"]
        assert [p.id for p in store.list_plans(EVERY_PLAN, 2)] == ["p1", "p2"]


# -- the API, the dashboard, the command line ----------------------------------------------------


def test_the_api_pages_through_every_plan_once(setup: dict[str, Any], catalogue: Catalogue, policy: Policy) -> None:
    theirs = others(setup["db"], catalogue, policy, 3, CHORE)
    alice = api(setup, "alice")
    hers = [alice.post("/api/plans", json=MAIL).json()["id"] for _ in range(7)]

    def pages(who: str, order: str, end: str) -> list[str]:
        found: list[str] = []
        params: dict[str, Any] = {"order": order, "limit": 3}
        while page := ids(api(setup, who).get("/api/plans", params=params)):
            assert len(page) <= 3
            found, params = found + page, {**params, end: page[-1]}
        return found

    assert pages("gina", "oldest", "after") == [*theirs, *hers]
    assert pages("gina", "newest", "before") == [*reversed(hers), *reversed(theirs)]
    assert pages("alice", "newest", "before") == list(reversed(hers))
    assert ids(alice.get("/api/plans", params={"after": hers[2][:8], "before": hers[5]})) == hers[3:5]
    for params, status in [
        ({"limit": 0}, 422),
        ({"limit": 501}, 422),
        ({"order": "sideways"}, 422),
        ({"status": "asleep"}, 422),
        ({"before": "0" * 8}, 404),
        ({"after": theirs[0]}, 403),  # a plan hidden from alice: nothing about it, not even when it was made
    ]:
        reply = alice.get("/api/plans", params=params)
        assert reply.status_code == status, (params, reply.text)
    assert "may not see plan" in alice.get("/api/plans", params={"after": theirs[0]}).json()["error"]


def test_the_dashboard_says_how_many_it_shows_and_links_to_older_plans(
    setup: dict[str, Any], catalogue: Catalogue, policy: Policy
) -> None:
    made = others(setup["db"], catalogue, policy, 150, CHORE)
    gina, _ = browser(setup, "gina")
    first = gina.get("/").text
    assert "100 plans, newest first." in first and LINK.findall(first) == made[:-101:-1]
    older = re.search(r'<a href="(/\?before=[0-9a-f-]{36})" rel="next">Older plans</a>', first)
    assert older is not None and older.group(1) == f"/?before={made[50]}"
    second = gina.get(older.group(1)).text
    assert f"50 plans, newest first, submitted before plan {made[50][:8]}." in second
    assert LINK.findall(second) == made[49::-1] and "Older plans" not in second and "Newest plans" in second
    erin, _ = browser(setup, "erin")  # decides maintenance: sees them; dave does not
    assert len(LINK.findall(erin.get("/plans").text)) == 100
    dave, _ = browser(setup, "dave")
    assert "0 plans, newest first." in dave.get("/plans").text


def test_a_risk_filter_reads_a_bounded_page_and_goes_on(
    setup: dict[str, Any], catalogue: Catalogue, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(views, "PAGE", 2)
    monkeypatch.setattr(views, "SCAN", 4)
    rt = Runtime(catalogue, policy, db=setup["db"], clock=Earlier())
    made = [(rt.submit(plan, "bob").id, plan) for plan in [CHORE, CHORE, LOOKUP, CHORE, VOID, CHORE, CHORE] * 2]
    rt.close()
    gina, _ = browser(setup, "gina")
    for level, plans in (("irreversible", (CHORE,)), ("write", (VOID,)), ("read", (LOOKUP,))):
        seen, path = [], f"/plans?risk={level}"
        while path:
            page = gina.get(path).text
            found = LINK.findall(page)
            assert len(found) <= 2 and (not found or f"of risk {level}" in page)
            seen += found
            more = re.search(r'<a href="(/plans\?[^"]+)" rel="next">', page)
            path = more.group(1).replace("&amp;", "&") if more else ""
        assert seen == [plan_id for plan_id, plan in reversed(made) if plan in plans], level


def cli(*args: str) -> list[str]:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout.splitlines()


def test_the_command_line_lists_newest_first_and_pages_on(
    tmp_path: Path, catalogue: Catalogue, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = f"sqlite:///{tmp_path}/plangate.db"
    monkeypatch.setenv("PLANGATE_DB", db)
    made = others(db, catalogue, policy, 5, CHORE)
    first = cli("list", "--limit", "2")
    assert [line[:8] for line in first[:2]] == [made[4][:8], made[3][:8]]
    assert first[2] == f"(the first 2; for the next ones: --before {made[3]})"
    assert [line[:8] for line in cli("list", "--limit", "2", "--before", made[3])[:2]] == [made[2][:8], made[1][:8]]
    assert [line[:8] for line in cli("list", "--before", made[1][:8])] == [made[0][:8]]
    oldest = cli("list", "--order", "oldest", "--limit", "3", "--after", made[0])
    assert [line[:8] for line in oldest[:3]] == [p[:8] for p in made[1:4]] and oldest[3].endswith(f"--after {made[3]})")
    result = CliRunner().invoke(main, ["list", "--limit", "501"])
    assert result.exit_code == 2 and "501 is not in the range 1<=x<=500" in result.stderr
