"""The bridge from a running event loop to plangate's synchronous core.

The store speaks to SQLite or PostgreSQL synchronously, and a run's engine has an event
loop of its own on a thread of its own (see :class:`plangate.timeouts.Watch`). So an
``a``-method runs its sync twin on a daemon thread (:func:`off_loop`) and the caller's loop
only awaits a future: it is never blocked, and no tool is ever handed the caller's loop.

Cancelling the awaiting task stops the waiting, never the work: the thread carries the call
on to the end it records (a run to its end or its halt, a decision committed or not), as if
the caller had gone away. Long calls get a store connection of their own
(:func:`reopened`), so that runs on one runtime go on side by side.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Callable
from typing import TypeVar

from plangate import timeouts
from plangate.errors import UsageError
from plangate.store import Store, open_store

T = TypeVar("T")


def in_loop() -> bool:
    """Whether this thread is running an event loop now."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def refuse_in_loop(called: str, instead: str) -> None:
    """Refuse a call that would block a running loop for as long as tools or a model take."""
    if in_loop():
        raise UsageError(
            f"{called} was called inside a running event loop, which it would block while tools run: "
            f"use `await {instead}(...)`"
        )


async def off_loop(fn: Callable[[], T]) -> T:
    """``fn()`` on a daemon thread, awaited; the caller's context variables go with it."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[T] = loop.create_future()

    def finished(done: concurrent.futures.Future[T]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits for this any more
            loop.call_soon_threadsafe(_settle, waiter, done)

    timeouts.shared("plangate-async").submit(fn).add_done_callback(finished)  # in a copy of this context
    return await waiter


def _settle(waiter: asyncio.Future[T], done: concurrent.futures.Future[T]) -> None:
    if waiter.cancelled():  # the awaiting task was cancelled: the call ran on regardless
        return
    error = done.exception()
    if error is not None:
        waiter.set_exception(error)
    else:
        waiter.set_result(done.result())


def reopened(store: Store) -> Store | None:
    """A connection of its own to the same store; None for one that cannot be opened twice (in memory)."""
    url = getattr(store, "url", None)
    if not isinstance(url, str) or ":memory:" in url or not url.startswith(("sqlite:", "postgres")):
        return None
    full = getattr(store, "synchronous", None) == "full"  # a SQLite store's durability goes with it
    return open_store(f"{url}?synchronous=full" if full else url)
