"""Calling a tool under its time limit, inline, on a thread or on the event loop, and what came back, checked.

Each way of calling gives an :class:`Outcome` and never raises a tool's exception: a raise or
an overrun is a failure that may be retried (``retryable``); an output that does not fit the
tool's declared type or the step's ``expected_output`` is a failure that would only happen again.
What a tool raises that is not an ``Exception`` (``SystemExit`` from a library that calls
``sys.exit``, ``KeyboardInterrupt``, a ``CancelledError`` of its own) is its failure too: a call
runs on a thread that no signal reaches, so only the tool can have raised it, and raised through
the run it would end the run unrecorded, and a worker's runner with it.

What came back is read where the call ran, within its limit (:func:`answered`): an error's text or an
output's JSON is the tool's code too (``__str__``, ``__hash__``, ``__eq__``), and read by the engine after
the call, one that raised ended the run with the step started and no outcome, and one that hung held the run
and its lease for ever. Each call runs in a context of its own, copied from its run's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
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
    try:
        outcome = answered(step, tool, fn or tool.fn, kwargs, seconds)
    finally:
        watch.end(call)  # raises Abandoned when the call overran and the run went on without it
    return outcome


def bounded(
    step: Step, tool: Tool, kwargs: dict[str, Any], seconds: float, pool: Any, *, fn: Fn | None = None
) -> Outcome:
    """A call on a thread of ``pool``, waited for up to its limit (no event loop, no watch)."""
    start = time.perf_counter()
    fn = fn or tool.fn
    try:
        future = pool.submit(_answered_on_a_loop if tool.is_async else answered, step, tool, fn, kwargs, seconds)
    except RuntimeError as exc:
        return _no_thread(step.id, exc, start)
    try:
        outcome: Outcome = future.result(timeout=seconds)
    except concurrent.futures.TimeoutError:
        return timed_out(step.id, seconds, start)
    return outcome  # anything else raised is not the tool's: this thread was interrupted while it waited


async def on_loop(
    step: Step, tool: Tool, kwargs: dict[str, Any], seconds: float, pool: Any, *, fn: Fn | None = None
) -> Outcome:
    """An async tool on the event loop, a sync one on a thread of ``pool``; either is let go when it overruns."""
    start = time.perf_counter()
    fn = fn or tool.fn
    if tool.is_async:
        future: asyncio.Future[Outcome] = asyncio.ensure_future(answered_async(step, tool, fn, kwargs))
    else:
        try:
            future = asyncio.get_running_loop().run_in_executor(pool, answered, step, tool, fn, kwargs, seconds)
        except RuntimeError as exc:
            return _no_thread(step.id, exc, start)
    done, _ = await asyncio.wait((future,), timeout=seconds)  # a cancellation here is the run's: raised
    if not done:
        future.cancel()  # not waited for: an async tool that ignores it must not hold the run
        return timed_out(step.id, seconds, start)
    return future.result()


def answered(step: Step, tool: Tool, fn: Fn, kwargs: dict[str, Any], seconds: float) -> Outcome:
    """One sync call of up to ``seconds`` and what came back, read on the call's own thread, so within its
    limit: an error whose text, or an output whose JSON, raises or hangs is the call's failure or overrun,
    never the run's. The call runs in a copy of this thread's context (as an async tool's task does): what it
    sets there, no later call sees, of its plan or of another whose call this thread takes next."""
    return _holding(step, tool, seconds, functools.partial(_answered, step, tool, fn, kwargs))


def _answered(step: Step, tool: Tool, fn: Fn, kwargs: dict[str, Any]) -> Outcome:
    start = time.perf_counter()
    try:
        value = contextvars.copy_context().run(fn, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - a tool's failure is recorded, never raised through
        return raised(step.id, exc, start)
    return checked(step, tool, value, start)


def _answered_on_a_loop(step: Step, tool: Tool, fn: Fn, kwargs: dict[str, Any], seconds: float) -> Outcome:
    """:func:`answered_async` on an event loop of its own (a thread of the pool has none)."""
    return _holding(step, tool, seconds, lambda: asyncio.run(answered_async(step, tool, fn, kwargs)))


def _holding(step: Step, tool: Tool, seconds: float, call: Callable[[], Outcome]) -> Outcome:
    """``call()``, counted among the tool's calls that hold a thread; not made while too many of those overran
    their limits and never returned (:class:`plangate.timeouts.Overdue`)."""
    deadline = timeouts.OVERDUE.begin(tool.name, seconds)
    if isinstance(deadline, str):
        return not_called(step.id, deadline, time.perf_counter())
    try:
        return call()
    finally:
        timeouts.OVERDUE.end(tool.name, deadline)


async def answered_async(step: Step, tool: Tool, fn: Fn, kwargs: dict[str, Any]) -> Outcome:
    """:func:`answered` for an async tool, on the event loop (a task has a context of its own). What a task
    raises that is not an ``Exception`` (``SystemExit``, ``KeyboardInterrupt``) would be raised through the
    event loop, ending the run there: caught here, it is the call's failure, as the tool's own
    ``CancelledError`` is."""
    start = time.perf_counter()
    try:
        value = await fn(**kwargs)
    except BaseException as exc:  # noqa: BLE001 - a tool's failure is recorded, never raised through
        return raised(step.id, exc, start)
    return checked(step, tool, value, start)


def timed_out(step_id: int, seconds: float, start: float) -> Outcome:
    return Outcome(
        step_id=step_id,
        ok=False,
        ms=_ms(start),
        retryable=True,
        timed_out=seconds,
        error=f"timed out: the call took longer than its limit of {seconds:g} s",
    )


def not_called(step_id: int, why: str, start: float) -> Outcome:
    """The tool was not called (no thread for it, or too many of its calls still hold theirs): the step may
    run again under the usual rules, never read as of unknown outcome."""
    return Outcome(step_id=step_id, ok=False, error=f"not called: {why}", ms=_ms(start), retryable=True)


def _no_thread(step_id: int, exc: RuntimeError, start: float) -> Outcome:
    """The pool could start no thread for the call (the process is out of them): not called."""
    return not_called(step_id, f"no thread could be had to call the tool on ({exc})", start)


def raised(step_id: int, exc: BaseException, start: float) -> Outcome:
    text = said(exc)
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
    except BaseException as exc:  # noqa: BLE001 - what came back cannot be read: the call's failure, not the run's
        error = f"the output of {tool.name!r} could not be read: {type(exc).__name__}: {said(exc)}"
        return Outcome(step_id=step.id, ok=False, ms=_ms(start), error=error)
    expected = expected_types(step.expected_output)
    kind = value_type(output)
    if expected is not None and kind not in expected and not (kind == "integer" and "number" in expected):
        error = f"expected output {step.expected_output}, got {kind}"
        return Outcome(step_id=step.id, ok=False, ms=_ms(start), error=error)
    return Outcome(step_id=step.id, ok=True, output=output, ms=_ms(start))


def said(exc: BaseException) -> str:
    """What an exception says, as a plain string (a ``str`` subclass's own methods are left behind); one
    whose message cannot be read is said to be so."""
    try:
        return str.__str__(str(exc))
    except BaseException as failed:  # noqa: BLE001 - the tool's object misbehaved, not the run
        return f"(its message could not be read: {type(failed).__name__})"


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000
