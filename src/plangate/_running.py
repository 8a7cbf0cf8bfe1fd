"""Running a plan: the claim (the right to run proved, the plan held against the tools and the policy in force),
the engine driven under a renewed lease, a run cut off from its store taken back, and the policy's rollback of a
run that halted. Part of :class:`plangate.runtime.Runtime`."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from plangate import (
    _aio,
    _storeback,
    approval,
    drift,
    ledger,
    lifecycle,
    provenance,
    recovery,
)
from plangate._core import not_react
from plangate._rollingback import RollingBack
from plangate.engine import Engine, Unconfirmed
from plangate.errors import (
    GovernanceError,
    LeaseLostError,
    PlangateError,
    StateError,
    StoreLostError,
)
from plangate.plan import Plan
from plangate.policy import Policy
from plangate.record import Claim
from plangate.results import Progress, RunResult, recorded_result
from plangate.store import (
    CheckRecord,
    Event,
    PlanRow,
    VersionRow,
)

_Proof = tuple[Plan, ledger.PlanLedger, Policy | None, CheckRecord | None]
"""What the right to run proves: the text, its story, the policy in force, the check against it now (if redone)."""

T = TypeVar("T")


class Running(RollingBack):
    """Claiming and running plans (part of :class:`plangate.runtime.Runtime`)."""

    def execute(
        self,
        plan_id: str,
        *,
        actor: str = "engine",
        progress: Callable[[Progress], None] | None = None,
        owner: str | None = None,
    ) -> RunResult:
        """Run an approved plan. A finished plan is not run again: its recorded result comes back."""
        _aio.refuse_in_loop("Runtime.execute", "runtime.aexecute")
        plan, version = self._current(plan_id)
        not_react(plan)
        recovery.refuse_closed(self.store, plan.id, plan.status, "be executed")
        if plan.status in ("succeeded", "halted"):
            return self._recorded(plan, version)
        lifecycle.refuse_held(plan, self._now())
        if plan.status not in ("approved", "running"):
            needs = self._record_of(plan, version).needs
            why = f": it needs approval by {' and by '.join(needs)}" if needs and plan.status != "rejected" else ""
            raise StateError(f"plan {plan.id} is {plan.status}, not approved{why}")
        return self.drive(self.start(plan.id, actor=actor, owner=owner), progress)

    def resume(
        self,
        plan_id: str,
        *,
        actor: str = "engine",
        progress: Callable[[Progress], None] | None = None,
        owner: str | None = None,
    ) -> RunResult:
        """Continue a halted or interrupted run: completed steps are loaded, never run again."""
        _aio.refuse_in_loop("Runtime.resume", "runtime.aresume")
        plan, version = self._current(plan_id)
        not_react(plan)
        recovery.refuse_closed(self.store, plan.id, plan.status, "be resumed")
        if plan.status == "succeeded":
            return self._recorded(plan, version)
        if plan.status not in ("running", "halted", "approved"):
            raise StateError(f"plan {plan.id} is {plan.status}; only an approved plan can run")
        return self.drive(self.start(plan.id, actor=actor, owner=owner), progress)

    def start(
        self,
        plan_id: str,
        *,
        actor: str,
        owner: str | None = None,
        leased: bool = False,
        lease: str | None = None,
        known: Unconfirmed | None = None,
    ) -> Claim:
        """Claim the plan for a run, after proving that exactly this text was approved.

        ``leased``: ``owner`` leased the plan beforehand (a worker's claim); the run starts only
        while that lease is still its own, never after it was given back or taken by another, and
        only once: the run's lease takes its place. ``owner`` is a name: every claim holds a lease of
        its own (:func:`plangate.lifecycle.claimant`), the claim's ``owner``, which its fences name.
        ``lease``: that lease's name, given (a take-back claims again under the run's own lease, the one its
        driver releases: a try whose commit went through as its answer was lost left the plan under it).
        ``known``: what the run this take-back carries on knew when its store went away; refused, the claim
        still records those outcomes (:meth:`Engine.record_known`) before the plan halts or goes back.

        The plan's events are replayed (:mod:`plangate.ledger`): the stored text must hash
        to the current version's hash, the rows must agree with the audit log, and the
        approvals recorded there must cover that hash. When the tools' contracts or the
        policy changed since the check, the plan is held against the current ones; if it no
        longer passes, or needs approvals it lacks, it goes back for approval and the run is
        refused. Nothing runs unless all of that holds, and no two runners hold one plan.
        """
        claimant = lease or (lifecycle.claimant(owner) if owner else lifecycle.runner(actor))
        refusal: str | None = None
        proved = self._proved_before(plan_id)
        with self.store.transaction():
            plan, version = self._locked(plan_id)
            if leased and plan.lease_owner not in (owner, claimant):
                raise LeaseLostError(f"{owner} no longer holds its claim on plan {plan_id}: it does not start")
            held = plan.lease_owner if leased else None
            lifecycle.refuse_held(plan, self._now(), held)  # before the check now in force sends it back or halts it
            if proved is not None and proved[0] == (plan, version, self.store.newest_event(plan.id)):
                body, told, policy, recheck = proved[1]  # nothing of the plan changed since: the proof holds
            else:
                body, told, policy, recheck = self._right_to_run(plan, version)
            recorded = ""  # what became of the outcomes the run knew, for the refusal to say

            def refusing() -> None:  # before the plan leaves ``running``: what the run knew is recorded first
                nonlocal recorded
                rows = told.rows
                if known is not None and known.outcomes and rows is not None and held and plan.status == "running":
                    engine = Engine(store=self.store, catalogue=self._catalogue(), clock=self.clock, policy=policy)
                    recorded = known.refused(
                        *engine.record_known(plan.id, version.version, body, rows, known, actor=actor)
                    )

            recheck = self._held_by_register(body.category, recheck) if recheck else self._held_since(body, version)
            if recheck is not None:
                plan, version, refusal = self._apply_recheck(plan, version, recheck, policy, refusing)
            elif not version.check.ok:
                refusing()
                refusal = f"plan {plan.id} may not run: it does not pass ({drift.first_violation(version.check)})"
            if refusal is not None and plan.status == "running":
                self._halt_cut_off(plan, refusal)
            taken_over = plan.status == "running"  # its runner died (or gave its lease back) mid-run
            if refusal is None:
                resumed = bool(told.steps)
                plan = lifecycle.claim(
                    self.store,
                    plan,
                    owner=claimant,
                    leased=held,
                    at=self._now(),
                    until=self._lease_until(),
                    actor=actor,
                    kind="run.resumed" if resumed or plan.status != "approved" else "run.started",
                    data={"steps": len(body.steps), "hash": version.hash},
                )
        if refusal is not None:
            raise GovernanceError(refusal + recorded)
        failed = ledger.unhalted(told.events) if taken_over else ()
        return Claim(plan=plan, body=body, policy=policy, owner=claimant, actor=actor, rows=told.rows, failed=failed)

    def _halt_cut_off(self, plan: PlanRow, refusal: str) -> None:
        """A run cut off (its runner died, or gave its lease back at a drain, or its store went away) that the
        tools or the policy now in force refuse to go on with halts for a person, who may settle its steps, edit,
        close or resume it. Left ``running``, every worker would claim it again for ever, and no person could
        act on it. (A run another runner still holds never gets here: :func:`lifecycle.refuse_held`.)"""
        now = self._now()
        lifecycle.move(self.store, plan, "halted", actor="checker", at=now, kind="run.refused", data={"error": refusal})

    def _right_to_run(self, plan: PlanRow, version: VersionRow) -> _Proof:
        """The plan may run as read (:func:`plangate.ledger.right_to_run`); its text, its story, the policy
        in force and, where the tools or the policy changed since the check, the check against them now."""
        not_react(plan)
        recovery.refuse_closed(self.store, plan.id, plan.status, "run")
        body, told = ledger.right_to_run(self.store, plan, version)
        drift.check_tools_module(plan, version, body, self._catalogue(), self.tools)
        policy = self._policy_now(version)
        return body, told, policy, drift.recheck(plan, version, body, self._catalogue(), policy)

    def _proved_before(self, plan_id: str) -> tuple[tuple[PlanRow, VersionRow, str | None], _Proof] | None:
        """The right to run, proved from one snapshot before the log's lock is taken (so that the lock is not
        held while the plan's events are read and verified), with what it was proved from: the plan's row,
        its version and its newest event, whose hash covers the plan's whole chain. The claim uses the
        proof only if all three are the same under the lock; else, or if this fails, it proves again there."""
        try:
            with self.store.snapshot():
                plan, version = self._current(plan_id)
                proof = self._right_to_run(plan, version)
        except PlangateError:
            return None
        events = proof[1].events  # the plan's events, verified in this snapshot: the newest is the last
        return (plan, version, events[-1].hash if events else None), proof

    def drive(
        self,
        claim: Claim,
        progress: Callable[[Progress], None] | None = None,
        *,
        known: Unconfirmed | None = None,
        rollback_owner: str | None = None,
        stop: threading.Event | None = None,
    ) -> RunResult:
        """Run a claimed plan to its end or a halt, renewing the lease as it goes.

        A run cut off from its store (a PostgreSQL restart, a network cut) is taken back here, whoever drives
        it (:meth:`_take_back`): the outcomes its tools answered are recorded once the store is back, where
        they still may be. ``known``: the outcomes a run of the same lease knew when its store went away (the
        :class:`~plangate.errors.StoreLostError` it raised carries them). ``rollback_owner``: the lease the
        policy's rollback of a halted run takes (a worker names it, to release it at its drain). ``stop``: set
        at a worker's drain's end, after which the run gives up waiting for the store, and so does the policy's
        rollback, which gives its lease back at once if it begins after all. The run is taken back under its own
        lease: the name its driver knows, and releases (a worker's drain), goes on naming it.
        """
        _aio.refuse_in_loop("Runtime.drive", "runtime.aexecute")
        result: RunResult | None = None
        while result is None:
            try:
                result = self._run_engine(claim, progress, known)
            except StoreLostError as cut:
                taken = self._take_back(claim, cut, stop)
                if isinstance(taken, RunResult):  # it had ended: its last commit went through
                    result = taken
                else:
                    claim, known = taken, cut.known
        return self._rolled_back_if_due(claim, result, rollback_owner, stop)

    def _run_engine(
        self, claim: Claim, progress: Callable[[Progress], None] | None, known: Unconfirmed | None
    ) -> RunResult:
        keeper = lifecycle.LeaseKeeper(self.store, claim.plan.id, claim.owner, self.lease_seconds, self._lease_until)
        engine = Engine(
            store=self.store,
            catalogue=self._catalogue(),
            clock=self.clock,
            policy=claim.policy,
            max_concurrency=self.max_concurrency,
            progress=progress,
            owner=claim.owner,
            lease_lost=keeper.lost,
            traces=self.traces,
        )
        with keeper:
            return engine.run(
                claim.plan.id,
                claim.plan.version,
                claim.body,
                actor=claim.actor,
                rows=claim.rows,
                claimed=claim.plan,
                failed=claim.failed,
                known=known,
            )

    def _take_back(self, claim: Claim, cut: StoreLostError, stop: threading.Event | None) -> Claim | RunResult:
        """The store went away mid-run: wait for it (:func:`plangate._storeback.waited_for`), at most until the
        run's lease would have run out, and claim the run again under that same lease (compare-and-set:
        :meth:`start` with ``leased``), to record what it knew. The store not back in time (or ``stop`` set):
        a StoreLostError that names the outcomes known and not recorded, which the next run decides."""

        def claimed() -> Claim | RunResult:
            # Under the run's own lease, not one of the take-back's: whoever releases it (a worker's drain) releases
            # the run wherever the claim lands, and a try cut in flight that took it leaves it the next try's.
            try:
                return self.start(
                    claim.plan.id, actor=claim.actor, owner=claim.owner, leased=True, lease=claim.owner, known=cut.known
                )
            except (LeaseLostError, StateError) as refused:
                return self._taken_by_another(claim.plan.id, cut, refused)

        def gave_up(why: str) -> StoreLostError:
            return StoreLostError(f"{cut}; the store was not back {why}: {cut.known.unrecorded()}", cut.known)

        return self._when_back(claimed, gave_up, stop)

    def _taken_by_another(self, plan_id: str, cut: StoreLostError, refused: PlangateError) -> RunResult:
        """The claim to take a run back was refused: the lease ran out and another runner took the plan over,
        or the plan ended. A plan found ended with every outcome the run knew on record (its last commit went
        through, only the answer was lost) gives back its result as recorded; else nothing is written, and the
        error says what became of the outcomes: they are that runner's to decide, by the usual rules. A plan
        whose newest move is a refusal by governance was refused by an earlier try whose answer was lost (or by
        whoever claimed it since): that is still the refusal (read as the run's own end, a plan halted so got
        the policy's rollback, which a refused plan never gets: it halts for a person), whatever the outcomes it
        recorded (a failure, one of unknown outcome) or left (their tools are gone)."""
        rows = self.store.steps(plan_id)
        refusal = _refusal(plan_id, list(self.store.events(plan_id)))
        if refusal is not None:
            raise GovernanceError(refusal + cut.known.refused(rows)) from cut
        if cut.known.recorded_in(rows) and (ended := self.ended(plan_id)) is not None:
            return ended
        raise LeaseLostError(f"plan {plan_id}'s store is back, but {refused}: {cut.known.told(rows)}") from cut

    def _when_back(
        self, then: Callable[[], T], gave_up: Callable[[str], Exception], stop: threading.Event | None = None
    ) -> T:
        """``then``, on a new connection, once the store that went away is back (:func:`_storeback.waited_for`:
        at most until the run's lease would have run out, or ``stop`` is set; else ``gave_up(why)`` is raised)."""
        return _storeback.waited_for(
            self.lease_seconds,
            stop or threading.Event(),
            reconnect=self._reconnect,
            claim=then,
            store=lambda: self.store,
            gave_up=gave_up,
        )

    def _reconnect(self) -> None:
        """A new connection to the store in place of one that broke (a StoreError while the store is away)."""
        self.store = _storeback.reconnected(self.store)

    def _rolled_back_if_due(
        self, claim: Claim, result: RunResult, rollback_owner: str | None, stop: threading.Event | None
    ) -> RunResult:
        """The policy's rollback of a halted run (``compensation.on_halt: auto``), unless a step's outcome is
        unknown: a person settles it first. ``stop``: as for :meth:`drive`."""
        policy = claim.policy
        if result.ok or policy is None or policy.compensation.on_halt != "auto":
            return result
        unknown = (result.error or "").startswith("outcome unknown") or recovery.unknown(
            self.store.steps(claim.plan.id).items()
        )
        if unknown:
            return result
        # One lease for every try: a begin whose commit went through as its answer was lost is the next try's own
        owner = rollback_owner or lifecycle.runner(f"policy:{policy.name}")

        def roll_back() -> object:
            return self._roll_back(
                claim.plan.id,
                actor=f"policy:{policy.name}",
                reason="the policy rolls back halted plans",
                by_person=False,
                owner=owner,
                stop=stop,
                ours=True,
            )

        try:
            roll_back()
        except Exception as exc:  # the store gone as it began: begun again once it is back (the begin is a
            if not self.store.broken():  # compare-and-set, so one that went through is not begun twice)
                raise
            plan_id, cause = claim.plan.id, " ".join(str(exc).split())

            def gave_up(why: str) -> StoreLostError:
                return StoreLostError(
                    f"plan {plan_id} halted, and its store went away as the policy's rollback began ({cause}); the "
                    f"store was not back {why}: run plangate compensate {plan_id} once it is",
                    Unconfirmed(),
                )

            # a try whose end went through as its answer was lost: ended under its lease, not begun again
            self._when_back(lambda: self._rollback_ended(plan_id, owner) or roll_back(), gave_up, stop)
        return result

    def _rollback_ended(self, plan_id: str, owner: str) -> bool:
        """Whether the plan's newest rollback was begun under the lease ``owner`` and has ended since."""
        began = next((e for e in reversed(list(self.store.events(plan_id))) if e.kind == "compensation.started"), None)
        plan = self.store.get_plan(plan_id)
        ended = plan is not None and plan.status in ("compensated", "compensation_incomplete")
        return ended and began is not None and _moved(began)[2] == owner

    def _apply_recheck(
        self,
        plan: PlanRow,
        version: VersionRow,
        checked: CheckRecord,
        policy: Policy | None,
        refusing: Callable[[], None],
    ) -> tuple[PlanRow, VersionRow, str | None]:
        """Record the new check; send the plan back for approval if it no longer may run (``refusing`` is
        called first, once it is known that it may not)."""
        if policy is not None:
            self.store.save_policy(policy.hash, policy.name, policy.canonical_json())
        policy_hash = policy.hash if policy else None
        self.store.update_version_check(plan.id, plan.version, checked, policy_hash)
        version = replace(version, check=checked, policy_hash=policy_hash)
        self._record(plan, "plan.checked", "checker", checked.to_dict())
        why = checked.recheck
        if not checked.ok:  # not a decision to take back: it may not run while the tools or policy are so
            refusing()
            reason = f"{why}, and it no longer passes: {drift.first_violation(checked)}"
            return plan, version, f"plan {plan.id} may not run: {reason}"
        needs = approval.missing(checked.policy, self.store.approvals(plan.id, plan.version), policy)
        if needs and plan.status in ("approved", "running", "halted"):
            refusing()
            reason = f"{why}, and it now needs approval by {' and by '.join(needs)}"
            plan = lifecycle.move(
                self.store,
                plan,
                "pending_approval",
                actor="checker",
                at=self._now(),
                data={"needs": needs, "reason": reason},
            )
            return plan, version, _back_for_approval(plan.id, reason)
        return plan, version, None

    def ended(self, plan_id: str) -> RunResult | None:
        """The recorded result of a plan whose run ended (succeeded, or halted); None while it has not."""
        plan, version = self._current(plan_id)
        return self._recorded(plan, version) if plan.status in ("succeeded", "halted") else None

    def _recorded(self, plan: PlanRow, version: VersionRow) -> RunResult:
        body = Plan.parse(version.body)
        flows = provenance.analyse(body, self.catalogue) if body.answer is not None else provenance.EMPTY
        return recorded_result(plan.id, plan.version, body, self.store.steps(plan.id), plan.status, flows=flows)


def _back_for_approval(plan_id: str, reason: str) -> str:
    return f"plan {plan_id} may not run: {reason}; it is back for approval"


def _refusal(plan_id: str, events: Sequence[Event]) -> str | None:
    """What the checker's refusal of a claim said (it halted a cut-off run, or sent the plan back for approval),
    where that refusal is the plan's newest move into or out of ``running``: no run claimed the plan or ended
    since (a person's settlement, edit or approval may have come after it; the check of an edit, a move of the
    checker's too, is no refusal of a claim); else None."""
    moved = next((event for event in reversed(events) if "running" in _moved(event)[:2]), None)
    if moved is None or moved.actor != "checker":
        return None
    if moved.kind == "run.refused":
        return str(moved.data.get("error"))
    if moved.kind == "plan.pending_approval":
        return _back_for_approval(plan_id, str(moved.data.get("reason")))
    return None


def _moved(event: Event) -> tuple[object, object, object]:
    """The statuses an event moved its plan from and to, and the lease it moved it under (none: it is no move)."""
    transition = event.data.get("transition")
    if not isinstance(transition, dict):
        return None, None, None
    return transition.get("from"), transition.get("to"), transition.get("lease")
