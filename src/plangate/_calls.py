"""Calling a tool under its time limit, inline, on a thread or on the event loop, and what came back, checked.

Each way of calling gives an :class:`Outcome` and never raises a tool's exception: a raise or
an overrun is a failure that may be retried (``retryable``); an output that does not fit the
tool's declared type or the step's ``expected_output`` is a failure that would only happen again.
What a tool raises that is not an ``Exception`` (``SystemExit`` from a library that calls
``sys.exit``, ``KeyboardInterrupt``, a ``CancelledError`` of its own) is its failure too: a call
runs on a thread that no signal reaches, so only the tool can have raised it, and raised through
the run it would end the run unrecorded, and a worker's runner with it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from plangate import timeouts
from plangate._jsontypes import value_type
from plangate.errors import OutcomeUnknownError
from plangate.plan import Step, expected_types
from plangate.tools import Tool

Fn = Callable[..., Any]


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """How one call ended."""

    step_id: int
    ok: bool
    output: Any = None
    error: str | None = None
    ms: float = 0.0
    retryable: bool = False  # the tool raised or overran (a wrong output is not repeated: it would be again)
    timed_out: float | None = None  # the limit, in seconds, that the call overran
    handled: bool = False  # already recorded (a retry that could not start): nothing left to record
    unknown: str | None = None  # the call may have had its effect (its connection broke): why


def inline(
    step: Step, tool: Tool, kwargs: dict[str, Any], seconds: float, watch: timeouts.Watch, *, fn: Fn | None = None
) -> Outcome:
    """A sync call on this thread, under the watch's eye: if it overruns, the run goes on without it.

    ``fn``, when given, is called in place of the tool's function (the same function, wrapped: traced).
    """
    call = watch.begin(step.id, seconds)
    start = time.perf_counter()
    try:
        value = (fn or tool.fn)(**kwargs)
    except BaseException as exc:  # noqa: BLE001 - a tool's failure is recorded, never raised through
        return raised(step.id, exc, start)
    finally:
        watch.end(call)  # raises Abandoned when the call overran and the run went on without it
    return checked(step, tool, value, start)


def bounded(
    step: Step, tool: Tool, kwargs: dict[str, Any], seconds: float, pool: Any, *, fn: Fn | None = None
) -> Outcome:
    """A call on a thread of ``pool``, waited for up to its limit (no event loop, no watch)."""
    start = time.perf_counter()
    fn = fn or tool.fn
    call = functools.partial(asyncio.run, fn(**kwargs)) if tool.is_async else functools.partial(fn, **kwargs)
    future = pool.submit(call)
    try:
        value = future.result(timeout=seconds)
    except concurrent.futures.TimeoutError:
        return timed_out(step.id, seconds, start)
    except BaseException as exc:
        if not (future.done() and not future.cancelled() and future.exception() is exc):
            raise  # not the tool's: this thread was interrupted while it waited
        return raised(step.id, exc, start)
    return checked(step, tool, value, start)


async def on_loop(
    step: Step, tool: Tool, kwargs: dict[str, Any], seconds: float, pool: Any, *, fn: Fn | None = None
) -> Outcome:
    """An async tool on the event loop, a sync one on a thread of ``pool``; either is let go when it overruns."""
    start = time.perf_counter()
    fn = fn or tool.fn
    if tool.is_async:
        future: asyncio.Future[Any] = asyncio.ensure_future(_contained(fn(**kwargs)))
    else:
        future = asyncio.get_running_loop().run_in_executor(pool, functools.partial(fn, **kwargs))
    done, _ = await asyncio.wait((future,), timeout=seconds)  # a cancellation here is the run's: raised
    if not done:
        future.cancel()  # not waited for: an async tool that ignores it must not hold the run
        return timed_out(step.id, seconds, start)
    try:
        value = future.result()
    except BaseException as exc:  # noqa: BLE001 - a tool's failure (its own cancellation too), never raised through
        return raised(step.id, exc, start)
    return checked(step, tool, value, start)


class _Escaped(Exception):  # noqa: N818 - not an error of its own: what a tool raised, carried
    """A ``SystemExit`` or ``KeyboardInterrupt`` an async tool raised, carried as an ``Exception``."""

    def __init__(self, raised: BaseException) -> None:
        super().__init__(raised)
        self.raised = raised


async def _contained(call: Any) -> Any:
    """Await an async tool's call; its ``SystemExit`` or ``KeyboardInterrupt``, which a task would raise
    through the event loop (ending the run there), comes back as the call's failure."""
    try:
        return await call
    except (SystemExit, KeyboardInterrupt) as exc:
        raise _Escaped(exc) from None


def timed_out(step_id: int, seconds: float, start: float) -> Outcome:
    return Outcome(
        step_id=step_id,
        ok=False,
        ms=_ms(start),
        retryable=True,
        timed_out=seconds,
        error=f"timed out: the call took longer than its limit of {seconds:g} s",
    )


def raised(step_id: int, exc: BaseException, start: float) -> Outcome:
    if isinstance(exc, _Escaped):
        exc = exc.raised
    text = str(exc)
    error = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    unknown = text if isinstance(exc, OutcomeUnknownError) else None
    return Outcome(step_id=step_id, ok=False, error=error, ms=_ms(start), retryable=True, unknown=unknown)


def checked(step: Step, tool: Tool, value: Any, start: float) -> Outcome:
    """The value a call returned, held to the tool's declared type and the step's ``expected_output``."""
    try:
        output = tool.dump_output(value)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        error = f"the output does not match {tool.name!r}'s declared type: {first['msg']}"
        return Outcome(step_id=step.id, ok=False, ms=_ms(start), error=error)
    expected = expected_types(step.expected_output)
    kind = value_type(output)
    if expected is not None and kind not in expected and not (kind == "integer" and "number" in expected):
        error = f"expected output {step.expected_output}, got {kind}"
        return Outcome(step_id=step.id, ok=False, ms=_ms(start), error=error)
    return Outcome(step_id=step.id, ok=True, output=output, ms=_ms(start))


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000
