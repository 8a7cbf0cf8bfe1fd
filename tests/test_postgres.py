"""The PostgreSQL store and workers, against a real PostgreSQL server on loopback."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import closing

import psycopg
import pytest

from plangate import Catalogue, Policy
from plangate.runtime import Runtime
from plangate.store import open_store
from plangate.testing import fresh_database, postgres_cluster
from tests.conftest import load_plan

_COUNTER = iter(range(10**6))


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with postgres_cluster() as url:
        yield url


@pytest.fixture
def db(server: str) -> str:
    return fresh_database(server, f"plangate_{os.getpid()}_{next(_COUNTER)}")


def test_the_governed_path_on_postgresql(db: str, catalogue: Catalogue, policy: Policy) -> None:
    rt = Runtime(catalogue, policy, db=db)
    record = rt.submit(load_plan("refund"), "alice")
    rt.approve(record.id, "dave", record.hash)
    rt.approve(record.id, "carol", record.hash)
    result = rt.execute(record.id)
    assert result.ok and result.outputs[4] == "message-1"
    assert rt.execute(record.id).ran == ()
    assert [e.kind for e in rt.trace(record.id)][-1] == "run.succeeded"
    assert rt.store.verify_audit().ok
    rt.close()
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("UPDATE events SET actor = 'mallory' WHERE seq = 5")
    with closing(open_store(db)) as store:
        report = store.verify_audit()
    assert not report.ok and report.bad_seq == 5 and "it was edited" in (report.problem or "")


def test_concurrent_writers_chain_the_audit_log(db: str, catalogue: Catalogue) -> None:
    def submit_many() -> None:
        rt = Runtime(catalogue, db=db)
        for _ in range(10):
            rt.submit(load_plan("refund"), "alice")
        rt.close()

    threads = [threading.Thread(target=submit_many) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with closing(open_store(db)) as store:
        report = store.verify_audit()
    assert report.ok and report.events == 40 * 3
