"""Rolling a halted plan back: a person's rollback, the policy's carried on after its runner stopped, and the
check any act on a halted plan passes first. Part of :class:`plangate.runtime.Runtime`."""

from __future__ import annotations

import threading

from plangate import (
    _aio,
    _input,
    approval,
    ledger,
    lifecycle,
    recovery,
)
from plangate._core import AFTER_HALT, RuntimeCore, as_checked, not_react
from plangate.compensation import Compensation, CompensationResult
from plangate.errors import (
    GovernanceError,
    LeaseLostError,
    StateError,
    UsageError,
)
from plangate.plan import Plan
from plangate.store import (
    PlanRow,
    VersionRow,
)


class RollingBack(RuntimeCore):
    """Rolling a halted plan back (part of :class:`plangate.runtime.Runtime`)."""

    def compensate(self, plan_id: str, *, actor: str, reason: str, category: str | None = None) -> CompensationResult:
        """Undo a halted plan's completed steps in reverse order (see :mod:`plangate.compensation`).

        A decision like an approval (never the requester or an author); a rollback that died
        is taken over once its lease has run out. ``category``: the plan's category when the
        caller checked its own right to decide (see :func:`as_checked`).
        """
        _aio.refuse_in_loop("Runtime.compensate", "runtime.acompensate")
        return self._roll_back(plan_id, actor=actor, reason=reason, by_person=True, category=category)

    def carry_on_rollback(
        self, plan_id: str, *, owner: str | None = None, stop: threading.Event | None = None
    ) -> CompensationResult:
        """Carry on a rollback the policy began (``compensation.on_halt: auto``) whose runner stopped, once its
        lease has run out: as the policy, under the rules of any rollback (nothing undone twice). A rollback
        a person began is theirs to run again (``plangate compensate``), and so is one the policy in force no
        longer begins on its own. Workers call this for the rollbacks they find cut off, naming the lease
        (``owner``, a :func:`lifecycle.runner` name beginning ``policy:``) that their drain gives back, and the
        drain's end (``stop``: a rollback begun after it gives its lease back at once)."""
        _aio.refuse_in_loop("Runtime.carry_on_rollback", "runtime.acompensate")
        with self.store.snapshot():
            plan, version = self._current(plan_id)
            actor = self._policys_rollback(plan, version, ledger.story(self.store, plan, "be rolled back"))
        reason = "the policy's rollback, carried on after its runner stopped"
        return self._roll_back(plan_id, actor=actor, reason=reason, by_person=False, owner=owner, stop=stop)

    def _roll_back(
        self,
        plan_id: str,
        *,
        actor: str,
        reason: str,
        by_person: bool,
        category: str | None = None,
        owner: str | None = None,
        stop: threading.Event | None = None,
        ours: bool = False,
    ) -> CompensationResult:
        """Begin (or take over) the rollback under the lease ``owner`` and run it. ``stop``: its runner's drain
        ended, which gave that lease back first; a rollback begun after it gives the lease back at once. ``ours``:
        a plan under ``owner`` is this caller's, whose begin went through as its answer was lost (begun again)."""
        if not _input.check_text(reason, "reason", what="rollback").strip():
            raise UsageError("say why the plan is rolled back")
        owner = owner or lifecycle.runner(actor)
        with self.store.transaction():
            plan, version = self._locked(plan_id)
            not_react(plan)
            allowed = ("halted", "compensation_incomplete", "compensating")  # compensating: one that died
            person = actor if by_person else None
            mine = owner if ours else None
            told = self._check_after_halt(
                plan, version, person, doing="compensate", allowed=allowed, category=category, mine=mine
            )
            if person is None and plan.status != "halted":  # proven again under the lock: a person may have taken
                actor = self._policys_rollback(plan, version, told)  # it over since the caller's proof, and left it
            plan = lifecycle.move(
                self.store,
                plan,
                "compensating",
                actor=actor,
                at=self._now(),
                kind="compensation.started",
                data={"reason": reason},
                lease=(owner, self._lease_until()),
            )
        # The drain sets stop, then releases the lease: unset here, its release comes after this begin and frees
        # the lease; set, its release may have come first, and found nothing to free.
        if stop is not None and stop.is_set():
            self.store.release(plan.id, owner)
            raise LeaseLostError(f"plan {plan_id}'s rollback began as its runner's drain ended: left for the next one")
        keeper = lifecycle.LeaseKeeper(self.store, plan.id, owner, self.lease_seconds, self._lease_until)
        rollback = Compensation(
            store=self.store,
            catalogue=self._catalogue(),
            clock=self.clock,
            plan=plan,
            body=Plan.parse(version.body),
            actor=actor,
            rows=told.rows or {},  # as held against the log: never read again, unchecked, once the plan is claimed
            lease_lost=keeper.lost,
        )
        with keeper:
            return rollback.run()

    def _policys_rollback(self, plan: PlanRow, version: VersionRow, told: ledger.PlanLedger) -> str:
        """Who began the rollback the policy may carry on (``policy:NAME``), as the audit log says; else a refusal.
        A rollback a person began (or took over, or left incomplete) is theirs to run again, and so is one the
        policy in force no longer begins on its own."""
        began = [event.actor for event in told.events if event.kind == "compensation.started"]
        if not began:
            raise StateError(f"plan {plan.id} is {plan.status}: it has no rollback to carry on")
        policy, rollback = self._policy_now(version), f"the rollback of plan {plan.id} ({plan.status})"
        if not began[-1].startswith("policy:"):
            raise GovernanceError(f"{rollback} was begun by {began[-1]}: theirs to run again (plangate compensate)")
        if policy is None or policy.compensation.on_halt != "auto":
            raise GovernanceError(
                f"{rollback} was begun by {began[-1]}, and the policy in force does not roll back on its own: a "
                "person runs it again (plangate compensate)"
            )
        if plan.status != "compensating":
            raise StateError(f"plan {plan.id} is {plan.status}: it has no rollback to carry on")
        return began[-1]

    def _check_after_halt(
        self,
        plan: PlanRow,
        version: VersionRow,
        person: str | None,
        *,
        doing: str,
        allowed: tuple[str, ...],
        category: str | None,
        mine: str | None = None,
    ) -> ledger.PlanLedger:
        """Settling, rolling back or closing: a halted plan no run holds (but the caller's own lease, ``mine``), of
        the category the caller's right was checked on, a person who may decide (None: the policy's own rollback),
        and rows that agree with the audit log; the plan's story, with those rows."""
        as_checked(plan, category, doing)
        recovery.refuse_closed(self.store, plan.id, plan.status, AFTER_HALT[doing])
        lifecycle.require_idle(plan, self._now(), "closing it" if doing == "close" else f"to {doing} a step", mine)
        if plan.status not in allowed:
            what = " can be closed" if doing == "close" else "'s steps can be settled or undone"
            raise StateError(f"plan {plan.id} is {plan.status}; only a halted plan{what}")
        if person is not None:
            approval.check_may_decide(plan, self._authors(plan), person, self._policy_for(version), doing)
        told = ledger.story(self.store, plan, "be rolled back" if doing == "compensate" else doing)
        if doing == "compensate":  # an effect that may have happened is neither undone nor left unsaid
            recovery.refuse_unknown((told.rows or {}).items(), "roll back")
        return told
