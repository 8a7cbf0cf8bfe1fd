"""Time limits and retries of tool calls, and the threads that let a run outlive a hung call.

A call runs under a limit: its tool's ``timeout``, else the policy's ``limits.tool_timeout``,
else :data:`DEFAULT_TIMEOUT`, so a tool that hangs never holds a run, a worker or the server
for ever. A retry of an idempotent tool waits a :class:`Backoff` delay first.

A Python thread cannot be stopped: a sync call that overran its limit keeps its thread
until it returns. So sync tools run on daemon threads (:class:`Threads`) that neither the
run nor the process waits for, and a run's loop runs on a thread of its own under a
:class:`Watch`: the caller's thread waits for the result and, when a call made inline on the
loop's thread (no hand-off: the fast path of a sequential plan) overruns, takes the run over
and goes on without that thread.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

if TYPE_CHECKING:
    from plangate.policy import Policy
    from plangate.tools import Tool

DEFAULT_TIMEOUT = 300.0
"""Seconds a call may take when neither its tool nor the policy says."""
LEAST_LEASE_SECONDS = 1.0
"""The shortest lease a worker takes: renewed every third of it, a shorter one ran out between renewals on a
busy machine (a hundredth of a second: 2 runs in 40 taken over alive, halted as outcome unknown)."""
MOST_SECONDS = 365 * 86400.0
"""The longest lease, drain or timeout a worker takes: a year (a longer one is a mistake, not a length of time),
well within what a wait on a lock or a Temporal workflow's durations hold."""

_IDLE_WAKE = 60.0  # how long the watcher sleeps with no call to watch: a later, sooner deadline wakes it
P = ParamSpec("P")
T = TypeVar("T")


def call_limit(tool: Tool, policy: Policy | None) -> float:
    """Seconds one call of ``tool`` may take; never over the policy's ``max_tool_timeout``, nor a year.

    The checker refuses a plan whose tool declares more than the ceiling, so the cut here
    only matters for a catalogue changed under a running plan. A tool may declare any limit:
    one beyond a year (:data:`MOST_SECONDS`) is a year, as a wait on a thread cannot be told
    more (past ``threading.TIMEOUT_MAX`` it raises, after the tool was called).
    """
    limits = policy.limits if policy is not None else None
    seconds = tool.timeout or (limits.tool_timeout if limits else None) or DEFAULT_TIMEOUT
    ceiling = limits.max_tool_timeout if limits else None
    return min(seconds, MOST_SECONDS, MOST_SECONDS if ceiling is None else ceiling)


def retries(tool: Tool, policy: Policy | None) -> int:
    """How many times a failed call of ``tool`` is made again; never over the policy's ``max_retries``."""
    ceiling = policy.limits.max_retries if policy is not None else None
    return min(tool.retries, ceiling) if ceiling is not None else tool.retries


def budget(tool: Tool, policy: Policy | None, backoff: Backoff | None = None) -> float:
    """The most seconds a step's call may take with all its retries and their waits (for an orchestrator)."""
    backoff = backoff or Backoff()
    again = retries(tool, policy)
    return call_limit(tool, policy) * (again + 1) + _waits((backoff.first, backoff.cap), again)


def _waits(waits: tuple[float, float], count: int) -> float:
    """The waits before ``count`` calls made again in a row (:func:`doubled` after 1, 2, ... failures), summed in
    at most 65 terms: once a wait reaches its cap (or its exponent its bound) the rest are that wait again. A tool
    may declare any number of retries: summed one at a time, a billion of them held the worker."""
    total = 0.0
    for times in range(1, min(count, 65) + 1):
        wait = doubled(waits, times)
        if wait >= waits[1] or times == 65:
            return total + wait * (count - times + 1)
        total += wait
    return total


def doubled(waits: tuple[float, float], times: int) -> float:
    """The wait after ``times`` failures in a row: ``waits[0]``, doubled each time, up to ``waits[1]``.

    The exponent is bounded: a float times 2 ** 1024 overflows, and failures go on for as long as
    an outage or a broken plan lasts."""
    return min(waits[0] * float(2 ** min(max(times - 1, 0), 64)), waits[1])


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """Exponential backoff with a cap, and jitter drawn from the idempotency key, not from chance.

    The wait before call ``n`` (2, 3, ...) is ``first * 2 ** (n - 2)``, at most ``cap``, less
    up to half of it: steps that failed together do not all call again together, and the same
    step waits the same on every run, so tests and replays see the same delays.
    """

    first: float = 0.5
    cap: float = 30.0

    def delay(self, key: str, attempt: int) -> float:
        full = doubled((self.first, self.cap), attempt - 1)
        digest = hashlib.sha256(f"{key}#{attempt}".encode()).digest()
        spread = int.from_bytes(digest[:8], "big") / 2**64
        return round(full * (1 - spread / 2), 3)


STORE_RETRY_SECONDS = (0.5, 30.0)
"""While the store cannot be reached for a claim (a plain or a Temporal worker's): the first wait before
trying again, doubled each time up to the second."""


class Outage:
    """Claims that failed in a row while the store is out of reach: the wait before the next
    (:func:`doubled`, over STORE_RETRY_SECONDS), said once as it starts and once when it is over."""

    def __init__(self, log: logging.Logger, who: str) -> None:
        self.log, self.who = log, who
        self.times = 0
        self.problem: str | None = None
        """What the first failed try said, while they fail (None: the last one did not)."""

    def failed(self, exc: Exception) -> float:
        """One more failed try: the seconds to wait before the next."""
        self.times += 1
        if self.times == 1:
            self.log.error("%s: cannot claim: %s; trying again, less often while it lasts", self.who, exc)
            self.problem = str(exc)
        return doubled(STORE_RETRY_SECONDS, self.times)

    def over(self) -> None:
        """A try did not fail."""
        if self.times:
            self.log.warning("%s: the store answers again: claiming", self.who)
            self.times, self.problem = 0, None


class Threads(Executor):
    """Daemon threads for sync tools, started as needed and reused when idle; each call runs in a copy of
    the context it was submitted from.

    A call that never returns keeps its thread; a new one takes the next call, and nothing
    waits for the lost one: not the run, not ``shutdown``, not the process at exit (it would
    wait for a :class:`~concurrent.futures.ThreadPoolExecutor`'s threads).
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._closed = False
        self._fresh()

    def _fresh(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._count = 0
        self._pid = os.getpid()

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        if self._closed:
            raise RuntimeError("cannot submit a call after shutdown")
        if self._pid != os.getpid():  # a forked child has none of its parent's threads
            self._fresh()
        future: Future[T] = Future()
        # In a copy of the caller's context, as asyncio.to_thread: a thread's own would carry what the last
        # call on it set (another run's context variables) and none of the caller's.
        self._jobs.put((future, functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)))
        if not self._idle.acquire(blocking=False):
            self._count += 1
            try:
                threading.Thread(target=self._work, name=f"{self._name}-{self._count}", daemon=True).start()
            except RuntimeError:  # no thread to be had (the process is out of them)
                self._count -= 1
                if future.cancel():  # left queued, the next thread started would make the call, awaited by none
                    raise
        return future  # (a thread that came free meanwhile took it)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, call = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except BaseException as exc:  # noqa: BLE001 - the caller reads it from the future
                    future.set_exception(exc)
            del job, future, call  # a finished call's result is not kept alive by an idle thread
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Let the threads end when they are free; never waits for them (``wait`` is ignored)."""
        self._closed = True
        if cancel_futures:
            leftover = []
            while True:
                try:
                    leftover.append(self._jobs.get_nowait())
                except queue.Empty:
                    break
            for job in leftover:
                if job is not None:
                    job[0].cancel()
        for _ in range(self._count):  # one for each thread: a busy one takes its own when it is done
            self._jobs.put(None)


class Overdue:
    """Calls of each tool that run on threads, with their deadlines: one past its deadline overran, and holds
    its thread until it returns, whether or not anyone waits for it.

    A thread cannot be stopped, so a tool whose calls never return would take a new thread at every call,
    plan after plan, until the process could start none. Past ``most`` such calls of one tool, its next call
    is not made (:meth:`begin` says why) until some return; other tools' calls go on.
    """

    def __init__(self, most: int = 32) -> None:
        self.most = most
        self._lock = threading.Lock()
        self._calls: dict[str, list[float]] = {}  # tool name -> the deadlines of its calls still running

    def begin(self, name: str, seconds: float) -> float | str:
        """The call's deadline, to give back to :meth:`end` once it returns; or why it may not be made."""
        now = time.monotonic()
        with self._lock:
            running = self._calls.setdefault(name, [])
            overran = sum(1 for deadline in running if deadline < now)
            if overran >= self.most:
                return (
                    f"{overran} calls of {name!r} overran their limit and still hold their threads; no more are "
                    "made until they return"
                )
            running.append(now + seconds)
        return now + seconds

    def end(self, name: str, deadline: float) -> None:
        with self._lock:
            running = self._calls[name]
            running.remove(deadline)
            if not running:
                del self._calls[name]

    def overdue(self, name: str) -> int:
        """How many calls of the tool are past their deadline and still running."""
        now = time.monotonic()
        with self._lock:
            return sum(1 for deadline in self._calls.get(name, ()) if deadline < now)


OVERDUE = Overdue()
"""The process's calls on threads (sync tools, and async ones an orchestrator calls on a thread), by tool."""

_SHARED: dict[str, Threads] = {}


def shared(name: str) -> Threads:
    """The process's pool of that name, made on first use (not on import: Temporal's workflow sandbox
    imports this module and may not make one). ``plangate-run``: runs' loops; ``plangate-step``: sync tools."""
    pool = _SHARED.get(name)
    return pool if pool is not None else _SHARED.setdefault(name, Threads(name))


class Abandoned(BaseException):
    """The run's thread lost the run during an inline call (it overran); it must stop at once, touching nothing."""


class Inline:
    """A sync call running on the run's own thread (a plain class: one is made per step)."""

    __slots__ = ("deadline", "seconds", "step_id")

    def __init__(self, step_id: int, seconds: float, deadline: float) -> None:
        self.step_id, self.seconds, self.deadline = step_id, seconds, deadline


class Watch:
    """A run's loop on a thread of its own, watched from the caller's thread.

    The loop registers each inline call with :meth:`begin` and :meth:`end`. When one
    overruns, the caller's thread claims it, and ``overran(call)`` gives the body that
    carries the run on from there, on a new thread; the old thread, when the call returns,
    finds in :meth:`end` that it lost the run and raises :class:`Abandoned`. The watcher
    wakes for a deadline, not for each call: a sequential plan pays two uncontended locks
    a step.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()  # taken bare where nothing waits: cheaper than the condition's wrapper
        self._cond = threading.Condition(self._lock)
        self._inline: Inline | None = None
        self._wake = math.inf
        self._done = False
        self._result: Any = None
        self._error: BaseException | None = None
        self.stopped = False
        """Set when the caller stopped waiting (an interrupt): the loop starts no more calls."""

    def run(self, body: Callable[[], object], overran: Callable[[Inline], Callable[[], object]]) -> Any:
        """Run ``body``: what it returns (or raises, raised here), or what it delivered before it ended."""
        try:
            while True:
                self._start(body)
                call = self._wait()
                if call is None:
                    break
                body = overran(call)
        except BaseException:
            self.stopped = True
            raise
        if self._error is not None:
            raise self._error
        return self._result

    def begin(self, step_id: int, seconds: float) -> Inline:
        if self.stopped:
            raise Abandoned  # nobody waits for the run any more: call nothing
        call = Inline(step_id, seconds, time.monotonic() + seconds)
        with self._lock:
            self._inline = call
            if call.deadline < self._wake:
                self._cond.notify()
        return call

    def end(self, call: Inline) -> None:
        with self._lock:
            if self._inline is call:
                self._inline = None
                return
        raise Abandoned

    def deliver(self, result: Any = None, error: BaseException | None = None) -> None:
        with self._cond:
            if not self._done:
                self._done, self._result, self._error = True, result, error
                self._cond.notify()

    def _start(self, body: Callable[[], object]) -> None:
        shared("plangate-run").submit(self._thread, body)  # in a copy of the caller's context (Threads.submit)

    def _thread(self, body: Callable[[], object]) -> None:
        try:
            result = body()
        except Abandoned:
            return
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            self.deliver(error=exc)
            return
        self.deliver(result)  # nothing happens if the body delivered before it ended

    def _wait(self) -> Inline | None:
        """The call that overran, claimed; None once the run delivered."""
        with self._cond:
            while not self._done:
                call, now = self._inline, time.monotonic()
                if call is not None and call.deadline <= now:
                    self._inline = None
                    return call
                self._wake = call.deadline if call is not None else now + _IDLE_WAKE
                self._cond.wait(self._wake - now)
            return None
