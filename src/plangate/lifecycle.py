"""The plan lifecycle: one table of states and transitions, one function that performs one.

Every status change in plangate goes through :func:`move`: the runtime's decisions, the
engine's start and end, workers, compensation, ReAct. A move is a compare-and-set on the
plan's row (``UPDATE … WHERE status = :expected AND lease = :expected_lease``) in the
same transaction as its audit event, so of two racing moves from one state exactly one
commits and the other is refused with what happened instead; nobody acts on a state that
was already left.

::

    submit ─▶ pending_approval ─▶ approved ─▶ running ─▶ succeeded
                 │   ▲                ▲  │        │
                 ▼   │ edit           │  │        └──▶ halted ─▶ running (resume)
              rejected ──────────────-┘  │               │
                                          │               ├──▶ pending_approval | approved | rejected (a correction)
                                          │               ├──▶ closed (ended for good, with a reason)
                                          │               └──▶ compensating ─▶ compensated
                                          │                                  └▶ compensation_incomplete ─▶ compensating
                                          │                                                            └▶ closed
                                          └──▶ pending_approval (an edit, or drift since approval)

Starting a run is a *claim*: ``approved`` (or ``halted``, or ``running`` under a dead
lease) becomes ``running`` under a lease that names the runner and lasts until a time the
runner keeps renewing. A second runner finds the plan running under a live lease and is
refused; a runner that died leaves a lease that expires (or, on the same machine, names a
process that no longer exists), and then the plan may be taken over.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

from plangate import metrics
from plangate.errors import StateError
from plangate.store import PlanRow, PlanStatus, Store

TRANSITIONS: Mapping[PlanStatus, frozenset[PlanStatus]] = {
    "pending_approval": frozenset({"approved", "rejected", "pending_approval"}),
    "approved": frozenset({"running", "rejected", "pending_approval", "approved"}),
    "rejected": frozenset({"pending_approval", "approved", "rejected"}),
    "running": frozenset({"succeeded", "halted", "running", "pending_approval"}),
    "halted": frozenset({"running", "pending_approval", "approved", "rejected", "compensating", "closed"}),
    "compensating": frozenset({"compensated", "compensation_incomplete", "compensating"}),
    "compensation_incomplete": frozenset({"compensating", "closed"}),
    "succeeded": frozenset(),
    "compensated": frozenset(),
    "closed": frozenset(),
}
"""From each state, the states a plan may move to. ``running -> pending_approval`` is a
ReAct run pausing for an approval; a move to the same state is an edit that keeps the
status, or a runner taking over a dead runner's lease. ``closed`` ends a halted plan (or a
rollback that could not undo everything) that nobody will resume: like ``succeeded`` and
``compensated``, nothing leaves it."""

Lease = tuple[str | None, str | None]
NO_LEASE: Lease = (None, None)


def runner(label: str, *, process: bool = True) -> str:
    """A lease owner's name, unique to one runner: who runs, on which machine, in which process.

    Two runners in one process (two threads, two runtimes) get different names, so a
    lease never lets a second runner in as if it were the first. Without ``process`` the
    name does not name this process: for a run that outlives it (a Temporal workflow, whose
    steps other processes run), whose lease only its expiry ends.
    """
    where = f"{_machine()}:{os.getpid()}" if process else _machine()
    return f"{label}#{secrets.token_hex(4)}@{where}"


def claimant(owner: str) -> str:
    """The lease owner of one claim by ``owner``: its name, with a token of this claim's own.

    A name may be given twice (a caller that names its runner, a worker's lease started twice); each
    claim still holds a lease of its own, so a run's fence never passes for another claim of the same
    name. The token goes before the machine and process the name ends with (:func:`runner`), by which
    :func:`lease_is_live` still judges the lease.
    """
    name, at, where = owner.rpartition("@")
    token = secrets.token_hex(4)
    return f"{name}.{token}@{where}" if at else f"{owner}.{token}"


@functools.cache
def _machine() -> str:
    """This process's machine and process namespace: the host name, the boot id and the pid namespace.

    Two containers may share a host name and reuse each other's process ids; only a lease
    written under the same boot and pid namespace may be judged by whether its process exists.
    """
    host = socket.gethostname()
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
        namespace = os.readlink("/proc/self/ns/pid").removeprefix("pid:[").removesuffix("]")
    except OSError:
        return host
    return f"{host}/{boot}/{namespace}"


def lease_is_live(plan: PlanRow, now: str) -> bool:
    """Whether someone holds the plan: a lease that has not expired, of a process that still exists.

    A lease names its machine and process (:func:`runner`); in this machine's boot and
    process namespace a lease whose process is gone is dead at once, so a crashed run can be
    resumed without waiting. Anywhere else, only its expiry ends it.
    """
    owner, until = plan.lease_owner, plan.lease_until
    if owner is None or until is None or until < now:
        return False
    machine, _, pid = owner.rpartition("@")[2].rpartition(":")
    if machine == _machine() and "/" in machine and pid.isdigit():
        return _process_exists(int(pid))
    return True


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


def move(
    store: Store,
    plan: PlanRow,
    to: PlanStatus,
    *,
    actor: str,
    at: str,
    kind: str | None = None,
    data: Mapping[str, Any] | None = None,
    lease: Lease = NO_LEASE,
    step_id: int | None = None,
    held_by: str | None = None,
) -> PlanRow:
    """Move ``plan`` (as read in this transaction) to ``to``, or refuse; record the event.

    Must run inside ``store.transaction()``. The event (``kind``, default ``plan.TO``)
    carries ``transition: {from, to}``, which is how the audit log tells a plan's status.
    ``held_by``: the runner whose lease ``plan`` is under, as it claimed it: the plan moves only
    while that runner still holds it, whatever end its lease was renewed to since.
    """
    if to not in TRANSITIONS.get(plan.status, frozenset()):
        raise StateError(f"{_what(plan)} {plan.id} is {plan.status}; it cannot become {to}")
    store.lock_log()  # the log's lock before the plan's row, in every writer: no two wait on each other
    if not store.transition(
        plan.id,
        expected=plan.status,
        expected_version=plan.version,
        expected_lease=(plan.lease_owner, plan.lease_until) if held_by is None else held_by,
        to=to,
        at=at,
        lease=lease,
    ):
        raise StateError(_changed(store, plan))
    transition: dict[str, Any] = {"from": plan.status, "to": to}
    if lease[0] is not None:
        transition["lease"] = lease[0]
    store.append_event(
        plan_id=plan.id,
        version=plan.version,
        step_id=step_id,
        kind=kind or f"plan.{to}",
        actor=actor,
        at=at,
        data={**(data or {}), "transition": transition},
    )
    metrics.plan_moved(plan, to, at, data)
    return replace(plan, status=to, updated_at=at, lease_owner=lease[0], lease_until=lease[1])


def claim(
    store: Store,
    plan: PlanRow,
    *,
    owner: str,
    at: str,
    until: str,
    actor: str,
    kind: str,
    data: Mapping[str, Any],
    leased: str | None = None,
) -> PlanRow:
    """Start (or take over) a run: ``running`` under a lease held by ``owner`` until ``until``.

    ``leased``: the lease the claimer already holds (a worker's, on the plans of its batch), which the
    run's lease takes the place of; any other live lease is another runner's, whatever its name.
    """
    refuse_held(plan, at, leased)
    if plan.status in ("succeeded", "compensating", "compensated", "compensation_incomplete", "closed"):
        raise StateError(f"plan {plan.id} has already run: it is {plan.status}")
    if plan.status not in ("approved", "halted", "running"):
        raise StateError(f"plan {plan.id} is {plan.status}, not approved")
    return move(store, plan, "running", actor=actor, at=at, kind=kind, data=data, lease=(owner, until))


def refuse_held(plan: PlanRow, at: str, leased: str | None = None) -> None:
    """Refuse to act on a plan another runner holds under a live lease (running it, or starting it): a claim, and
    anything a claim would do to the plan first (send it back for approval, halt it), is that runner's alone.
    ``leased``: the lease the caller holds itself (see :func:`claim`). A runner on another machine may be gone, and
    only its lease's end says so: the refusal says when that is, and what may be done then."""
    if plan.status not in ("running", "approved") or plan.lease_owner == leased or not lease_is_live(plan, at):
        return
    doing = "is already running under" if plan.status == "running" else "is being started by"
    then = "resumed" if plan.status == "running" else "run"
    raise StateError(
        f"plan {plan.id} {doing} {plan.lease_owner} (lease until {plan.lease_until}): if its runner stopped, it may "
        f"be {then} once that lease has run out"
    )


def hold(store: Store, plan: PlanRow, at: str) -> None:
    """Fail unless the plan is still exactly as read (status and lease), without changing it.

    A decision that writes beside the plan (settling a step) uses this so that a run that
    claimed the plan meanwhile makes the decision fail, not the other way round.
    """
    lease = (plan.lease_owner, plan.lease_until)
    store.lock_log()
    if not store.transition(
        plan.id,
        expected=plan.status,
        expected_version=plan.version,
        expected_lease=lease,
        to=plan.status,
        at=at,
        lease=lease,
    ):
        raise StateError(_changed(store, plan))


def require_idle(plan: PlanRow, now: str, doing: str, mine: str | None = None) -> None:
    """Refuse ``doing`` while a runner holds the plan (``mine``: a lease of the caller's own, not another's)."""
    if plan.status in ("running", "compensating") and plan.lease_owner != mine and lease_is_live(plan, now):
        raise StateError(f"plan {plan.id} is {plan.status} under {plan.lease_owner}: {doing} must wait until it stops")


def _changed(store: Store, plan: PlanRow) -> str:
    now = store.get_plan(plan.id)
    if now is None:
        return f"plan {plan.id} no longer exists"
    if now.status == "running":
        return f"plan {plan.id} is already running under {now.lease_owner}"
    if now.status == plan.status:
        return f"plan {plan.id} was just taken by {now.lease_owner} (lease until {now.lease_until})"
    return f"{_what(plan)} {plan.id} changed meanwhile: it was {plan.status} and is now {now.status}"


def _what(plan: PlanRow) -> str:
    return "ReAct run" if plan.kind == "react" else "plan"


_log = logging.getLogger("plangate.lifecycle")


class LeaseKeeper:
    """Renews a run's lease on a timer, so a long step never loses it; says when it was lost.

    Used as a context manager around a run. ``lost`` is set when a renewal finds the lease
    held by someone else (the plan was taken over after this runner looked dead), or when no
    renewal has succeeded for two thirds of the lease (the store out of reach, however long
    each failed try took): the run then stops starting steps while the lease still holds, so
    no other runner can have taken the plan over while a step of this one starts. A renewal
    that fails is tried again every second (at most) until then.
    """

    def __init__(self, store: Store, plan_id: str, owner: str, seconds: float, until: Callable[[], str]) -> None:
        self.store, self.plan_id, self.owner = store, plan_id, owner
        self.seconds, self.every, self.until = seconds, seconds / 3, until
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name=f"plangate-lease-{plan_id[:8]}", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()

    def _renew(self) -> None:
        renewed = time.monotonic()  # the lease was taken (or last renewed) no earlier than this
        failing = False
        while not self._stop.wait(min(self.every, 1.0) if failing else self.every):
            try:
                held = self.store.renew(self.plan_id, self.owner, self.until())
            except Exception as exc:  # noqa: BLE001 - the store out of reach: tried again, and given up in time
                if not failing:
                    _log.warning("plan %s: renewing the lease failed: %s; trying again", self.plan_id, exc)
                failing = True
                since = time.monotonic() - renewed  # counted from the last renewal, however long a failure took
                if since >= self.seconds * 2 / 3:
                    _log.error("plan %s: the lease not renewed for %.0f s: the run stops", self.plan_id, since)
                    self.lost.set()
                    return
                continue
            renewed, failing = time.monotonic(), False
            if not held:
                self.lost.set()
                return
