"""Workers on machines whose clocks disagree with the database server's: a lease is a time written
by one machine's clock and read by another's, so a worker too far off claims nothing, and says why."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import closing
from datetime import datetime, timedelta

import psycopg
import pytest

from plangate import Catalogue
from plangate import worker as worker_module
from plangate._clock import SystemClock, iso
from plangate.store import open_store
from plangate.worker import Worker
from tests import concurrencytools as tools
from tests.test_worker_concurrency import submit


class Skewed(SystemClock):
    """The system's clock, ``seconds`` ahead (behind when negative)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def now(self) -> datetime:
        return super().now() + timedelta(seconds=self.seconds)


@pytest.fixture
def calls() -> Iterator[list[tuple[str, int]]]:
    tools.CALLS.clear()
    yield tools.CALLS
    tools.CALLS.clear()


def worker(db: str, clock: SystemClock, lease: float = 30.0) -> Worker:
    return Worker(Catalogue([tools.count]), db=db, clock=clock, lease_seconds=lease, concurrency=1)


def lease_live(db: str, plan_id: str, owner: str, seconds: float) -> None:
    """``owner`` (a runner elsewhere, alive) holds the plan for ``seconds`` more, by the true clock."""
    now = datetime.now().astimezone()
    with closing(open_store(db)) as store:
        assert store.claim_batch(owner, iso(now), iso(now + timedelta(seconds=seconds)), 1) == [plan_id]


def test_a_worker_whose_clock_runs_ahead_does_not_take_over_a_live_lease(
    pg_db: str, calls: list[tuple[str, int]]
) -> None:
    (plan_id,) = submit(pg_db, ["count"], 1)
    lease_live(pg_db, plan_id, "runner-elsewhere#1", 30)
    ahead = worker(pg_db, Skewed(60))  # by its clock, the live lease ran out 30 s ago
    try:
        assert ahead.run_one() is None
    finally:
        ahead.close()
    assert calls == []  # the plan was not taken from its live runner
    with closing(open_store(pg_db)) as store:
        assert store.get_plan(plan_id).lease_owner == "runner-elsewhere#1"  # type: ignore[union-attr]
    assert ahead.clock_problem is not None
    off = re.search(r"at least ([0-9.]+) s ahead of the database server's", ahead.clock_problem)
    assert off is not None and 59 < float(off.group(1)) <= 60
    assert "at most 7.5 s off" in ahead.clock_problem


def test_a_worker_whose_clock_lags_claims_nothing_either(pg_db: str, calls: list[tuple[str, int]]) -> None:
    submit(pg_db, ["count"], 1)
    behind = worker(pg_db, Skewed(-20))  # its leases would run out 20 s early on everyone else's clock
    try:
        assert behind.run_one() is None
    finally:
        behind.close()
    assert calls == []
    off = re.search(r"at least ([0-9.]+) s behind", behind.clock_problem or "")
    assert off is not None and 19 < float(off.group(1)) <= 20


def test_a_worker_within_a_quarter_of_the_lease_claims_and_runs(pg_db: str, calls: list[tuple[str, int]]) -> None:
    (plan_id,) = submit(pg_db, ["count"], 1)
    close_enough = worker(pg_db, Skewed(5))  # under 7.5 s: every lease renewed in time stays live for all
    try:
        result = close_enough.run_one()
    finally:
        close_enough.close()
    assert result is not None and result.plan_id == plan_id and result.ok
    assert close_enough.clock_problem is None
    assert len(calls) == 1


def test_a_worker_claims_again_once_its_clock_is_set_right(
    pg_db: str, calls: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It looks again every CLOCK_RECHECK_SECONDS while it claims nothing, not at the minute's check."""
    monkeypatch.setattr(worker_module, "CLOCK_RECHECK_SECONDS", 0.0)  # looked at again at the next claim
    (plan_id,) = submit(pg_db, ["count"], 1)
    clock = Skewed(3600)
    w = worker(pg_db, clock)
    try:
        assert w.run_one() is None and w.clock_problem is not None
        clock.seconds = 0  # NTP set it right
        result = w.run_one()
    finally:
        w.close()
    assert result is not None and result.plan_id == plan_id and result.ok
    assert w.clock_problem is None


def test_sqlite_has_no_server_clock_to_compare_with(tmp_path: object) -> None:
    with closing(open_store(f"sqlite:///{tmp_path}/plangate.db")) as store:
        assert store.database_time() is None  # every process opening the file shares one machine's clock


def test_the_database_server_s_clock_is_read_as_it_is_now(pg_db: str) -> None:
    with closing(open_store(pg_db)) as store:
        first = store.database_time()
        with store.transaction():  # clock_timestamp(), not the transaction's start
            inside = [store.database_time(), store.database_time()]
    assert first is not None and inside[0] is not None and inside[1] is not None
    assert first <= inside[0] < inside[1]
    assert abs((datetime.now().astimezone() - inside[1]).total_seconds()) < 5  # one machine here: one clock


def test_a_clock_check_the_store_did_not_answer_is_made_at_the_next_claim(
    pg_db: str, calls: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first comparison fails (the store out of reach as the worker starts): it was counted as made,
    and for the next minute the worker, its clock an hour ahead, claimed as if the clocks agreed."""
    from plangate.store.postgres import PostgresStore

    submit(pg_db, ["count"], 1)
    real = PostgresStore.database_time
    answers = iter([psycopg.OperationalError("the server closed the connection")])

    def flaky(self: PostgresStore) -> datetime:
        for failure in answers:
            raise failure
        return real(self)

    monkeypatch.setattr(PostgresStore, "database_time", flaky)
    ahead = worker(pg_db, Skewed(3600))
    try:
        with pytest.raises(psycopg.OperationalError):
            ahead.run_one()
        assert ahead.run_one() is None
    finally:
        ahead.close()
    assert calls == [] and ahead.clock_problem is not None


def test_a_slow_answer_from_the_server_does_not_make_agreeing_clocks_look_apart(
    pg_db: str, calls: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server may read its clock anywhere in the round trip: at its very end here, two seconds after the
    worker's read before it (a busy machine). Taken as the middle, that looked a second off, over a quarter of
    a 2-second lease, and the worker claimed nothing for a minute, though the clocks agree. A slow answer tells
    nothing either way: the worker asks again at its next claim, and claims once an answer comes quickly."""
    from plangate.store.postgres import PostgresStore

    monkeypatch.setattr(worker_module, "CLOCK_RECHECK_SECONDS", 0.0)  # looked at again at the next claim
    (plan_id,) = submit(pg_db, ["count"], 1)
    clock = Skewed(-2.0)  # the worker's read before the question: two seconds before the server's
    real = PostgresStore.database_time

    def late(self: PostgresStore) -> datetime:
        moment = real(self)
        clock.seconds = 0.0  # its read after the answer: the server's own moment
        monkeypatch.setattr(PostgresStore, "database_time", real)  # the next answer comes at once
        return moment

    monkeypatch.setattr(PostgresStore, "database_time", late)
    w = worker(pg_db, clock, lease=2.0)
    try:
        assert w.run_one() is None
        assert re.search(r"may be anywhere from -2\.\d s to [+-]0\.\d s off", w.clock_problem or "")
        result = w.run_one()
    finally:
        w.close()
    assert w.clock_problem is None
    assert result is not None and result.plan_id == plan_id and result.ok and len(calls) == 1


def test_a_round_trip_too_slow_to_tell_the_clocks_apart_claims_nothing_until_one_can(
    pg_db: str, calls: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker 20 s ahead whose question took 20 s to answer (a busy machine): the server's time fell inside
    the round trip, so the clocks looked to agree, and the worker took a live runner's plan over (by its clock,
    the lease had run out). The offset lay anywhere from 0 to 20 s: it claims nothing until an answer tells."""
    from plangate.store.postgres import PostgresStore

    monkeypatch.setattr(worker_module, "CLOCK_RECHECK_SECONDS", 0.0)  # looked at again at the next claim
    (plan_id,) = submit(pg_db, ["count"], 1)
    lease_live(pg_db, plan_id, "runner-elsewhere#1", 10)
    clock = Skewed(0.0)  # its read before the question: 20 s before the server's moment, on its own clock
    real = PostgresStore.database_time

    def slow(self: PostgresStore) -> datetime:
        clock.seconds = 20.0  # its read after the answer: the server's moment, on a clock 20 s ahead
        return real(self)

    monkeypatch.setattr(PostgresStore, "database_time", slow)
    w = worker(pg_db, clock, lease=8.0)
    try:
        assert w.run_one() is None
        assert re.search(r"took 20\.\d s to answer.* from [+-]0\.\d s to \+20\.\d s off", w.clock_problem or "")
        assert "at most 2 s off" in (w.clock_problem or "")
        monkeypatch.setattr(PostgresStore, "database_time", real)  # a quick answer: 20 s ahead, for certain
        assert w.run_one() is None
        assert re.search(r"at least (19|20)\.\d s ahead of", w.clock_problem or "")
    finally:
        w.close()
    assert calls == []  # the plan was not taken from its live runner
    with closing(open_store(pg_db)) as store:
        assert store.get_plan(plan_id).lease_owner == "runner-elsewhere#1"  # type: ignore[union-attr]
