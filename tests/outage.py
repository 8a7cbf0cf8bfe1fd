"""A store outage in the middle of a run, shared by the tests of whoever takes the run back (a worker, a
runtime called directly, the command line, the API).

The PostgreSQL connections are cut (as a server restart, ``pg_terminate_backend`` or a network cut
does) from inside a step's tool call, so the cut lands exactly while the step is in its call: the
tool has answered, and the run's next transaction finds its connection gone. The tools here are
also the catalogue of the module ``tests.outage`` (``--tools tests.outage`` on the command line).
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import psycopg
import pytest

from plangate import Catalogue, RunContext, _storeback, ledger, lifecycle, timeouts, tool
from plangate._clock import SystemClock, iso
from plangate.errors import StoreError
from plangate.runtime import Runtime
from plangate.store import Store, open_store
from plangate.store.postgres import PostgresStore
from tests.helpers import plan, until

TOOLS = "tests.outage"
"""This module as a tools spec: the plans submitted here record it."""
CALLS: list[tuple[str, int]] = []
DB: dict[str, str] = {}  # the database the tools cut the connections of


def quick_retries(pg_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The body of each outage test module's autouse fixture: quick waits for the store, calls counted afresh."""
    monkeypatch.setattr(timeouts, "STORE_RETRY_SECONDS", (0.05, 0.2))
    CALLS.clear()
    DB["url"] = pg_db
    yield
    DB.clear()


def cut_every_connection() -> None:
    """Every other connection to the database is ended by the server, the run's and its lease's included."""
    with closing(psycopg.connect(DB["url"], autocommit=True)) as admin:
        cut = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    assert cut


@tool(effect="irreversible")
def pay(amount: int, ctx: RunContext) -> str:
    """Pay; the store goes away while the payment is made (it succeeds)."""
    CALLS.append((ctx.plan_id, ctx.step_id))
    cut_every_connection()
    return f"paid {amount}"


@tool(effect="write", idempotent=True)
def put(n: int, ctx: RunContext) -> int:
    """An idempotent write; the store goes away during its first call."""
    CALLS.append((ctx.plan_id, ctx.step_id))
    if len(CALLS) == 1:
        cut_every_connection()
    return n


@tool(effect="irreversible")
def ship(n: int, ctx: RunContext) -> int:
    """A step that is not idempotent after the cut."""
    CALLS.append((ctx.plan_id, ctx.step_id))
    return n


@tool(effect="write", idempotent=True)
def note(n: int, ctx: RunContext) -> int:
    """A step after the cut: the run carries on."""
    CALLS.append((ctx.plan_id, ctx.step_id))
    return n


def tools() -> list[Any]:
    return [
        *(pay, put, note, ship, pay_first, pay_beside, pay_then_stop),
        *(pay_and_lose_the_lease, pay_then_cut_the_commit, pay_then_tamper, ship_too_slowly),
    ]


@tool(effect="irreversible", timeout=0.2)
async def ship_too_slowly(n: int, ctx: RunContext) -> int:
    """A shipment that overruns its limit every time: it may have happened."""
    CALLS.append((ctx.plan_id, ctx.step_id))
    await asyncio.sleep(30)
    return n


@tool(effect="irreversible")
def pay_then_tamper(amount: int, ctx: RunContext) -> str:
    """Pay; the store goes away, and someone changes the step's record outside plangate meanwhile."""
    CALLS.append((ctx.plan_id, ctx.step_id))
    cut_every_connection()
    with closing(psycopg.connect(DB["url"], autocommit=True)) as admin:
        admin.execute("UPDATE steps SET params = 'not json' WHERE plan_id = %s", (ctx.plan_id,))
    return f"paid {amount}"


STOPPING: list[Any] = []  # the worker a SIGTERM stops while its run is cut off


@tool(effect="irreversible")
def pay_then_stop(amount: int, ctx: RunContext) -> str:
    """Pay; the store goes away while the payment is made, and the worker is told to stop (a SIGTERM)."""
    CALLS.append((ctx.plan_id, ctx.step_id))
    cut_every_connection()
    STOPPING[0].stop()
    return f"paid {amount}"


def store_stays_away(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once cut, the store stays out of reach: each try to connect to it again is refused (a plan's runtime's
    and a ReAct agent's alike)."""

    def refused(store: Store) -> Store:
        raise StoreError("cannot open the PostgreSQL store: connection refused")

    monkeypatch.setattr(_storeback, "reconnected", refused)


def submitted(db: str, *steps: dict[str, Any]) -> str:
    """A plan of these steps, submitted with this module's tools and approved: its id."""
    rt = Runtime(Catalogue(tools()), db=db, tools=TOOLS)
    record = rt.submit(plan(*steps), "ann")
    rt.approve(record.id, "ben", record.hash)
    rt.close()
    return record.id


def ran_once_and_verifies(
    db: str, plan_id: str, steps: int, restarted: int | None = None, catalogue: Catalogue | None = None
) -> None:
    """Each step's tool was called once and its outcome recorded once; only ``restarted``, whose start was
    recorded as the store went away, before its call, started twice; the whole log verifies, and its replay
    over ``catalogue`` (this module's tools unless told) agrees with it."""
    assert sorted(collections.Counter(CALLS).values()) == [1] * steps  # each step's tool called once
    with closing(open_store(db)) as store:
        kinds = collections.Counter((e.kind, e.step_id) for e in store.events(plan_id))
        assert all(kinds[("step.succeeded", s)] == 1 for s in range(1, steps + 1))  # recorded once
        assert all(kinds[("step.started", s)] == 1 + (s == restarted) for s in range(1, steps + 1))
        assert kinds[("step.retrying", restarted)] == (restarted is not None)
        report = ledger.verify(store)
        assert report.ok, str(report)
        row = store.get_plan(plan_id)
        assert row is not None and row.lease_owner is None
    rt = Runtime(catalogue or Catalogue(tools()), db=db)
    replayed = rt.replay(plan_id)  # the engine's decisions made again over the log agree with it
    rt.close()
    assert replayed.ok, replayed


PAID = threading.Event()


@tool(effect="irreversible")
def pay_first(amount: int, ctx: RunContext) -> str:
    """Pay; the store goes away while the payment is made; the payment beside it then ends too."""
    CALLS.append((ctx.plan_id, ctx.step_id))
    cut_every_connection()
    PAID.set()
    return f"paid {amount}"


@tool(effect="irreversible")
def pay_beside(amount: int, ctx: RunContext) -> str:
    """A payment in flight beside the first, which ends once the store is gone."""
    CALLS.append((ctx.plan_id, ctx.step_id))
    assert PAID.wait(30)
    return f"paid {amount} too"


@tool(effect="irreversible")
def pay_and_lose_the_lease(amount: int, ctx: RunContext) -> str:
    """Pay; the store goes away, the lease runs out meanwhile, and another runner takes the plan over."""
    CALLS.append((ctx.plan_id, ctx.step_id))
    cut_every_connection()
    with closing(open_store(DB["url"])) as store:
        until(
            "the lease ran out",
            lambda: not lifecycle.lease_is_live(store.get_plan(ctx.plan_id), iso(SystemClock().now())),  # type: ignore[arg-type]
            limit=20,
        )
    taken_over: list[Any] = []

    def take_over() -> None:
        rt = Runtime(Catalogue(tools()), db=DB["url"])
        taken_over.append(rt.resume(ctx.plan_id))
        rt.close()

    thread = threading.Thread(target=take_over)
    thread.start()  # on a thread of its own: this one is the run's, inside the engine's loop
    thread.join(30)
    assert taken_over[0].status == "halted"  # the other runner's rules: a payment started, no outcome
    return f"paid {amount}"


ARMED: dict[str, int] = {}  # the thread whose next commit is cut in flight


@tool(effect="irreversible")
def pay_then_cut_the_commit(amount: int, ctx: RunContext) -> str:
    """Pay; the transaction that records the payment commits, and its connection breaks before the answer."""
    CALLS.append((ctx.plan_id, ctx.step_id))
    ARMED["thread"] = threading.get_ident()
    return f"paid {amount}"


def cut_armed_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The armed thread's next commit goes through, and its connection breaks before the answer comes."""
    real = PostgresStore._at_once

    def at_once(self: PostgresStore, query: str, params: tuple[Any, ...] = ()) -> Any:
        answer = real(self, query, params)
        if query == "COMMIT" and ARMED.get("thread") == threading.get_ident():
            del ARMED["thread"]
            pid = self._conn.info.backend_pid
            with closing(psycopg.connect(DB["url"], autocommit=True)) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            raise psycopg.OperationalError("the connection broke before the commit's answer came")
        return answer

    monkeypatch.setattr(PostgresStore, "_at_once", at_once)
