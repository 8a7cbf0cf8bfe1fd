"""A store that went away mid-run (a PostgreSQL restart, a network cut): the wait for it to answer again,
and the connection made again, shared by whoever takes a run back (a plan's runtime, a ReAct agent)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from plangate import _aio, timeouts
from plangate.errors import StoreError
from plangate.store import Store

T = TypeVar("T")


def waited_for(
    seconds: float,
    stop: threading.Event,
    *,
    reconnect: Callable[[], object],
    claim: Callable[[], T],
    store: Callable[[], Store],
    gave_up: Callable[[str], Exception],
) -> T:
    """``reconnect`` then ``claim`` (take the run back under its own lease) tried after waits that double (as
    a worker's claims do), at most until the run's lease of ``seconds`` would have run out. A connection that
    cannot be made, or a claim whose connection broke again, is tried again; any other failure of the claim
    (a store back that refuses it: a record changed outside plangate, the audit key) is raised at once. Not
    back in time (or ``stop`` set): ``gave_up(why)`` is raised. ``store``: the run's store as it is now."""
    deadline, times = time.monotonic() + seconds, 0
    while True:
        times += 1
        # The last wait ends at the deadline: one the doubling would carry past it gave up with a third of
        # the lease to go. A try that late is safe: the claim finds the lease another's if it was taken.
        left = deadline - time.monotonic()
        given_up = left > 0 and stop.wait(min(timeouts.doubled(timeouts.STORE_RETRY_SECONDS, times), left))
        if left <= 0 or given_up:
            raise gave_up("before its runner gave it up" if given_up else f"within the run's lease ({seconds:g} s)")
        try:
            reconnect()
        except Exception:  # noqa: BLE001 - not back yet (a connection refused, or gone again as it opened)
            continue
        try:
            return claim()
        except Exception:
            if not store().broken():  # not the store gone again: a failure of its own, not waited out
                raise


def reconnected(store: Store) -> Store:
    """A new connection to the store in place of one that broke (a StoreError while the store is away)."""
    made = _aio.reopened(store)
    if made is None:  # a store in memory never goes away; nothing else to connect to
        raise StoreError("the store cannot be opened again")
    with contextlib.suppress(Exception):  # a broken connection may refuse to close
        store.close()
    return made
