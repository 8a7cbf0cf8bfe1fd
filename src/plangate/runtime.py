"""The runtime: the public face of the governed path.

``submit`` → check and policy → approval (a person, or automatic where governance has
cleared the category) → ``execute`` by the deterministic engine → ``trace``. Every
transition is recorded, in the same transaction as the state it changes, as an event in
the hash-chained audit log under the plan's UUID.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any, TypeVar

from plangate import (
    _aio,
    _input,
    _storeback,
    approval,
    drift,
    ledger,
    lifecycle,
    metrics,
    plandiff,
    provenance,
    recovery,
    replay,
    rundiff,
    tracing,
)
from plangate._clock import Clock, SystemClock, iso
from plangate._overrides import governed
from plangate.check import CheckResult, check
from plangate.compensation import Compensation, CompensationResult
from plangate.engine import DEFAULT_CONCURRENCY, Engine, Unconfirmed
from plangate.errors import (
    GovernanceError,
    LeaseLostError,
    NotFoundError,
    PlangateError,
    StateError,
    StoreLostError,
    UsageError,
    quoted_id,
)
from plangate.plan import Plan
from plangate.plandiff import PlanDiff
from plangate.planner import PlanningResult
from plangate.policy import Policy
from plangate.record import Claim, PlanRecord
from plangate.replay import ReplayResult
from plangate.results import Progress, RunResult, recorded_result
from plangate.rundiff import RunDiff
from plangate.store import (
    EVERY_PLAN,
    ApprovalRow,
    CheckRecord,
    Event,
    PlanQuery,
    PlanRow,
    Store,
    VersionRow,
    open_store,
)
from plangate.tools import Catalogue
from plangate.tracing import Traces, traced_decision

_Proof = tuple[Plan, ledger.PlanLedger, Policy | None, CheckRecord | None]
"""What the right to run proves: the text, its story, the policy in force, the check against it now (if redone)."""

PlanInput = Plan | Mapping[str, Any] | str | bytes
T = TypeVar("T")


class Runtime:
    """Submit, approve, execute and trace plans over one catalogue, policy and store.

    A facade: the states and their transitions live in :mod:`plangate.lifecycle`, who may
    decide in :mod:`plangate.approval`, the right to run in :mod:`plangate.ledger`, the run
    itself in :mod:`plangate.engine`.

    ``db`` is a store URL (``sqlite:///PATH``; default ``$PLANGATE_DB`` or
    ``./.plangate/plangate.db``) or an open :class:`~plangate.store.Store`. Time and ids
    come from ``clock``, so tests and replays can fix them. ``policy`` is the policy in
    force now: plans are checked against it when submitted, and held against it again
    when they run if it changed since they were approved.

    Inside a running event loop, use the ``a`` methods (``await runtime.aexecute(id)``):
    one runtime may be shared by many tasks. See "Sync and async" in docs/architecture.md.
    """

    def __init__(
        self,
        catalogue: Catalogue | None = None,
        policy: Policy | None = None,
        db: str | Store | None = None,
        *,
        clock: Clock | None = None,
        max_concurrency: int = DEFAULT_CONCURRENCY,
        tools: str | None = None,
        notify: Callable[[PlanRecord], str | None] | None = None,
        lease_seconds: float = 30.0,
        traces: Traces | None = None,
    ) -> None:
        self.policy = policy
        self.catalogue = catalogue
        self.store = db if isinstance(db, Store) else open_store(db)
        self.clock = clock or SystemClock()
        self.max_concurrency = max_concurrency
        self.tools = tools
        self.notify = notify
        self.lease_seconds = lease_seconds
        self.traces = traces or tracing.default()  # runs' and approvals' spans: the process's unless given
        self._turns = threading.RLock()  # the a-methods take turns on this runtime's store connection

    @property
    def catalogue(self) -> Catalogue | None:
        """The runtime's tools as its policy says they are (the policy's ``tools`` section applied)."""
        return governed(self._given, self.policy) if self._given is not None else None

    @catalogue.setter
    def catalogue(self, catalogue: Catalogue | None) -> None:
        self._given = catalogue

    # -- submit, decide, edit --------------------------------------------------------------
    def submit(
        self, plan: PlanInput | PlanningResult, requested_by: str, role: str | None = None, *, via: str | None = None
    ) -> PlanRecord:
        """Check and hold a plan against the policy, record it, and say what it needs.

        ``role`` may only name the role the policy gives ``requested_by``: a claim of a role
        the user does not hold is refused. Given a :class:`~plangate.planner.PlanningResult`,
        how the plan was made is recorded in the audit log with it; the model's thinking
        stays there and is never passed on to a tool. ``via`` names the channel the plan
        came by (``mcp``), recorded with its submission.
        """
        planning: PlanningResult | None = None
        if isinstance(plan, PlanningResult):
            planning, parsed = plan, plan.plan
        else:
            parsed = plan if isinstance(plan, Plan) else Plan.parse(plan)
        role = approval.held_role(self.policy, requested_by, role)
        result = check(parsed, self._catalogue(), self.policy, user=requested_by, role=role)
        plan_id, now = self.clock.new_id(), self._now()
        row = PlanRow(
            id=plan_id,
            status="pending_approval",
            version=1,
            hash=parsed.hash,
            task=parsed.task,
            category=parsed.category,
            requested_by=requested_by,
            role=role,
            tools=self.tools,
            created_at=now,
            updated_at=now,
        )
        with self.store.transaction():
            self.store.insert_plan(row)
            self._record(
                row,
                "plan.submitted",
                requested_by,
                {
                    "hash": parsed.hash,
                    "task": parsed.task,
                    "category": parsed.category,
                    "role": role,
                    "steps": len(parsed.steps),
                    "tools": self.tools,
                    "transition": {"from": None, "to": "pending_approval"},
                    **({"via": via} if via else {}),
                },
            )
            if planning is not None:
                self._record(row, "plan.planned", planning.model or "library", planning.record())
                self.store.link_calls([call.id for call in planning.calls], plan_id)
            row = self._new_version(row, parsed, requested_by, result, self.policy)
        metrics.submitted()
        return self._notified(self.get(plan_id))

    @traced_decision("approved")
    def approve(
        self,
        plan_id: str,
        approver: str,
        plan_hash: str,
        comment: str | None = None,
        role: str | None = None,
        *,
        plan_version: int | None = None,
    ) -> PlanRecord:
        """Approve the current version, named by its hash (and by its number, when ``plan_version`` is given).
        Nobody approves a plan they asked for or wrote."""
        if not plan_hash:
            raise UsageError("an approval names the hash of the version you reviewed; none was given")
        if comment is not None:
            _input.check_text(comment, "comment", what="approval")
        with self.store.transaction():
            plan, version = self._locked(plan_id)
            recovery.refuse_closed(self.store, plan.id, plan.status, "be approved")
            approval.check_can_decide(plan, approver, plan_hash, plan_version)
            if "approved" not in lifecycle.TRANSITIONS.get(plan.status, frozenset()):
                raise StateError(f"plan {plan.id} is {plan.status}; it cannot become approved")
            ledger.story(self.store, plan, "be approved", version)  # who asked, who wrote, what: from the log
            approvals = self.store.approvals(plan.id, plan.version)
            approval.check_can_approve(plan, self._authors(plan), approver, approvals)
            recorded = self._policy_for(version)
            held = approval.held_role(recorded, approver, role)
            row = self._decision(plan, version, "approved", actor=approver, role=held, comment=comment)
            self.store.insert_approval(row)
            needs = approval.missing(version.check.policy, [*approvals, row], recorded)
            self._record(
                plan,
                "plan.approval",
                approver,
                {"decision": "approved", "hash": plan.hash, "role": held, "comment": comment, "still_needs": needs},
            )
            if not needs:
                plan = lifecycle.move(
                    self.store, plan, "approved", actor=approver, at=self._now(), data={"by": "person"}
                )
        return self._record_of(plan, version)

    @traced_decision("rejected")
    def reject(
        self,
        plan_id: str,
        approver: str,
        comment: str,
        plan_hash: str | None = None,
        *,
        plan_version: int | None = None,
        category: str | None = None,
    ) -> PlanRecord:
        """Reject the current version (the one named by ``plan_hash`` and ``plan_version``, when given), saying why.

        ``category``: the plan's category when the caller checked its own right to decide (see :func:`_as_checked`).
        """
        if comment is None or not _input.check_text(comment, "comment", what="rejection").strip():
            raise UsageError("a rejection needs a comment saying why")
        with self.store.transaction():
            plan, version = self._locked(plan_id)
            _as_checked(plan, category, "reject")
            recovery.refuse_closed(self.store, plan.id, plan.status, "be rejected")
            approval.check_can_decide(plan, approver, plan_hash, plan_version)
            ledger.story(self.store, plan, "be rejected", version)  # what it is, and what the log says of it
            role = approval.role_of(self._policy_for(version), approver)
            self.store.insert_approval(
                self._decision(plan, version, "rejected", actor=approver, role=role, comment=comment)
            )
            self._record(
                plan,
                "plan.approval",
                approver,
                {"decision": "rejected", "hash": plan.hash, "role": role, "comment": comment},
            )
            plan = lifecycle.move(
                self.store, plan, "rejected", actor=approver, at=self._now(), data={"by": "person", "comment": comment}
            )
        return self._record_of(plan, version)

    def edit(self, plan_id: str, new_plan: PlanInput, editor: str, *, category: str | None = None) -> PlanRecord:
        """Make a new version: re-checked (its category too), and every earlier approval void.

        It is held against the policy in force: the runtime's, or else the one the current
        version was checked against (an edit never drops the policy a plan was under).
        ``category``: the plan's category when the caller checked its own right to edit (see :func:`_as_checked`).
        """
        parsed = new_plan if isinstance(new_plan, Plan) else Plan.parse(new_plan)
        with self.store.transaction():
            plan, old = self._locked(plan_id)
            _as_checked(plan, category, "edit")
            _not_react(plan)
            recovery.refuse_closed(self.store, plan.id, plan.status, "be edited")
            if plan.purged_at is not None:  # purged as finished for good: its evidence is gone, it never runs again
                raise StateError(f"plan {plan.id}'s payloads were purged on {plan.purged_at}; it cannot be edited")
            if plan.status not in ("pending_approval", "approved", "rejected", "halted"):
                raise StateError(
                    f"plan {plan.id} is {plan.status}; only a plan not yet executed, or halted, can be edited"
                )
            lifecycle.require_idle(plan, self._now(), "an edit")
            ledger.story(self.store, plan, "be edited", old)  # checked as the requester the log names, and no other
            # Not only while halted: a correction waiting for approval (or sent back by a drift
            # re-check) is a plan that ran too, and what succeeded there stays as it ran.
            recovery.check_correction(self.store, plan, old, parsed)
            if parsed.hash == plan.hash:
                raise StateError(f"the edit does not change plan {plan.id} (same hash {plan.hash[:12]}…)")
            policy = self._policy_now(old)
            result = check(parsed, self._catalogue(), policy, user=plan.requested_by)  # the role policy gives them
            voided = self.store.void_approvals(plan.id)
            number = plan.version + 1
            self.store.update_plan(
                plan.id,
                version=number,
                hash=parsed.hash,
                task=parsed.task,
                category=parsed.category,
                updated_at=self._now(),
            )
            plan = replace(plan, version=number, hash=parsed.hash, task=parsed.task, category=parsed.category)
            self._record(
                plan,
                "plan.edited",
                editor,
                {
                    "from_version": number - 1,
                    "from_hash": old.hash,
                    "hash": parsed.hash,
                    "task": parsed.task,
                    "category": parsed.category,
                    "approvals_voided": voided,
                },
            )
            plan = self._new_version(plan, parsed, editor, result, policy)
        return self._notified(self.get(plan.id))

    def settle(
        self,
        plan_id: str,
        step_id: int,
        *,
        done: bool,
        actor: str,
        output: Any = None,
        note: str | None = None,
        category: str | None = None,
    ) -> PlanRecord:
        """A person settles a step whose outcome is unknown: it happened (with the output they saw) or it did not.

        A decision like an approval: only someone who may approve the plan, never its
        requester or an author, and only while no run holds it. ``category``: the plan's
        category when the caller checked its own right to decide (see :func:`_as_checked`).
        """
        if note is not None:
            _input.check_text(note, "note", what="settlement")
        _input.check_value(output, "output", what="settlement")
        with self.store.transaction():
            plan, version = self._locked(plan_id)
            _not_react(plan)
            self._check_after_halt(
                plan, version, actor, doing="settle", allowed=("halted", "compensation_incomplete"), category=category
            )
            recovery.settle(
                self.store,
                self._catalogue(),
                plan,
                version,
                step_id,
                done=done,
                actor=actor,
                output=output,
                note=note,
                at=self._now(),
            )
        return self.get(plan.id)

    def compensate(self, plan_id: str, *, actor: str, reason: str, category: str | None = None) -> CompensationResult:
        """Undo a halted plan's completed steps in reverse order (see :mod:`plangate.compensation`).

        A decision like an approval (never the requester or an author); a rollback that died
        is taken over once its lease has run out. ``category``: the plan's category when the
        caller checked its own right to decide (see :func:`_as_checked`).
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
            told = ledger.story(self.store, plan, "be rolled back")
        began = [event for event in told.events if event.kind == "compensation.started"]
        if plan.status != "compensating" or not began:
            raise StateError(f"plan {plan_id} is {plan.status}: it has no rollback to carry on")
        actor, policy = began[-1].actor, self._policy_now(version)
        if not actor.startswith("policy:") or policy is None or policy.compensation.on_halt != "auto":
            raise GovernanceError(
                f"the rollback of plan {plan_id} was begun by {actor}, and the policy in force does not roll back "
                "on its own: a person runs it again (plangate compensate)"
            )
        reason = "the policy's rollback, carried on after its runner stopped"
        return self._roll_back(plan_id, actor=actor, reason=reason, by_person=False, owner=owner, stop=stop)

    def close_plan(self, plan_id: str, *, actor: str, reason: str, category: str | None = None) -> PlanRecord:
        """End a halted plan that will not be resumed: ``closed``, for good, with who and why.

        What ran stays as it is (to undo it, :meth:`compensate` instead). A decision like a
        rollback: never the requester or an author, never during a run, and only once every
        step's outcome is known. A rollback that could not undo everything may be closed too.
        ``category``: the plan's category when the caller checked its own right to decide
        (see :func:`_as_checked`).
        """
        if not _input.check_text(reason, "reason", what="closing").strip():
            raise UsageError("say why the plan is closed")
        with self.store.transaction():
            plan, version = self._locked(plan_id)
            _not_react(plan)
            self._check_after_halt(
                plan, version, actor, doing="close", allowed=("halted", "compensation_incomplete"), category=category
            )
            plan = recovery.close(self.store, plan, actor=actor, reason=reason, at=self._now())
        return self._record_of(plan, version)

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
    ) -> CompensationResult:
        """Begin (or take over) the rollback under the lease ``owner`` and run it. ``stop``: its runner's drain
        ended, which gave that lease back first; a rollback begun after it gives the lease back at once."""
        if not _input.check_text(reason, "reason", what="rollback").strip():
            raise UsageError("say why the plan is rolled back")
        owner = owner or lifecycle.runner(actor)
        with self.store.transaction():
            plan, version = self._locked(plan_id)
            _not_react(plan)
            allowed = ("halted", "compensation_incomplete", "compensating")  # compensating: one that died
            person = actor if by_person else None
            told = self._check_after_halt(plan, version, person, doing="compensate", allowed=allowed, category=category)
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

    def _check_after_halt(
        self,
        plan: PlanRow,
        version: VersionRow,
        person: str | None,
        *,
        doing: str,
        allowed: tuple[str, ...],
        category: str | None,
    ) -> ledger.PlanLedger:
        """Settling, rolling back or closing: a halted plan no run holds, of the category the caller's right was
        checked on, a person who may decide (None: the policy's own rollback), and rows that agree with the audit
        log; the plan's story, with those rows."""
        _as_checked(plan, category, doing)
        recovery.refuse_closed(self.store, plan.id, plan.status, _AFTER_HALT[doing])
        lifecycle.require_idle(plan, self._now(), "closing it" if doing == "close" else f"to {doing} a step")
        if plan.status not in allowed:
            what = " can be closed" if doing == "close" else "'s steps can be settled or undone"
            raise StateError(f"plan {plan.id} is {plan.status}; only a halted plan{what}")
        if person is not None:
            approval.check_may_decide(plan, self._authors(plan), person, self._policy_for(version), doing)
        told = ledger.story(self.store, plan, "be rolled back" if doing == "compensate" else doing)
        if doing == "compensate":  # an effect that may have happened is neither undone nor left unsaid
            recovery.refuse_unknown((told.rows or {}).items(), "roll back")
        return told

    # -- execute ---------------------------------------------------------------------------
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
        _not_react(plan)
        recovery.refuse_closed(self.store, plan.id, plan.status, "be executed")
        if plan.status in ("succeeded", "halted"):
            return self._recorded(plan, version)
        if plan.status == "running" and lifecycle.lease_is_live(plan, self._now()):
            raise StateError(f"plan {plan.id} is already running under {plan.lease_owner}")
        if plan.status not in ("approved", "running"):
            needs = self.get(plan.id).needs
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
        _not_react(plan)
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
            recorded: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())

            def refusing() -> None:  # before the plan leaves ``running``: what the run knew is recorded first
                nonlocal recorded
                rows = told.rows
                if known is not None and known.outcomes and rows is not None and held and plan.status == "running":
                    engine = Engine(store=self.store, catalogue=self._catalogue(), clock=self.clock, policy=policy)
                    recorded = engine.record_known(plan.id, version.version, body, rows, known, actor=actor)

            if proved is not None and proved[0] == (plan, version, self.store.newest_event(plan.id)):
                body, told, policy, recheck = proved[1]  # nothing of the plan changed since: the proof holds
            else:
                body, told, policy, recheck = self._right_to_run(plan, version)
            recheck = self._held_by_register(body.category, recheck) if recheck else self._held_since(body, version)
            if recheck is not None:
                plan, version, refusal = self._apply_recheck(plan, version, recheck, policy, refusing)
            elif not version.check.ok:
                refusing()
                refusal = f"plan {plan.id} may not run: it does not pass ({drift.first_violation(version.check)})"
            if refusal is not None and plan.status == "running":
                self._halt_cut_off(plan, refusal, held)
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
            raise GovernanceError(refusal + _recorded_before(*recorded))
        failed = ledger.unhalted(told.events) if taken_over else ()
        return Claim(plan=plan, body=body, policy=policy, owner=claimant, actor=actor, rows=told.rows, failed=failed)

    def _halt_cut_off(self, plan: PlanRow, refusal: str, claimed_by: str | None) -> None:
        """A run cut off (its runner died, or gave its lease back at a drain) that the tools or the policy
        now in force refuse to go on with halts for a person, who may settle its steps, edit, close or
        resume it. Left ``running``, every worker would claim it again for ever, and no person could
        act on it. A run another runner still holds is not touched: only the lease's holder ends it."""
        now = self._now()
        if lifecycle.lease_is_live(plan, now) and (claimed_by is None or plan.lease_owner != claimed_by):
            return
        lifecycle.move(self.store, plan, "halted", actor="checker", at=now, kind="run.refused", data={"error": refusal})

    def _right_to_run(self, plan: PlanRow, version: VersionRow) -> _Proof:
        """The plan may run as read (:func:`plangate.ledger.right_to_run`); its text, its story, the policy
        in force and, where the tools or the policy changed since the check, the check against them now."""
        _not_react(plan)
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
        whose newest event is a refusal by governance, with those outcomes on record, was refused by an earlier
        try whose answer was lost: that is still the refusal (read as the run's own end, a plan halted so got
        the policy's rollback, which a refused plan never gets: it halts for a person)."""
        rows = self.store.steps(plan_id)
        if cut.known.recorded_in(rows):
            refusal = _refusal(plan_id, list(self.store.events(plan_id)))
            if refusal is not None:
                raise GovernanceError(refusal + _recorded_before(tuple(cut.known.steps), ())) from cut
            if (ended := self.ended(plan_id)) is not None:
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

        def roll_back() -> object:
            return self._roll_back(
                claim.plan.id,
                actor=f"policy:{policy.name}",
                reason="the policy rolls back halted plans",
                by_person=False,
                owner=rollback_owner,
                stop=stop,
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

            self._when_back(roll_back, gave_up, stop)
        return result

    def _policy_now(self, version: VersionRow) -> Policy | None:
        """The policy in force: the runtime's, or else the one the version was checked against."""
        return self.policy if self.policy is not None else self._policy_for(version)

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

    # -- read ------------------------------------------------------------------------------
    def get(self, plan_id: str) -> PlanRecord:
        row = self.store.get_plan(self.resolve_id(plan_id))
        if row is None:
            raise NotFoundError(f"no plan {quoted_id(plan_id)}")
        ledger.confirm_purge(self.store, row)  # a row made to look purged must not hide the plan's text
        if row.kind == "react" and row.version == 0:  # a ReAct run with no pending action
            return PlanRecord.of(row, None)
        version = self.store.get_version(row.id, row.version)
        if version is None:
            raise NotFoundError(f"plan {row.id} has no version {row.version}")
        return self._record_of(row, version)

    def _record_of(self, plan: PlanRow, version: VersionRow) -> PlanRecord:
        """The record of a plan from the rows already read (approvals only while it waits for them)."""
        waiting = plan.status == "pending_approval"
        approvals = self.store.approvals(plan.id, plan.version) if waiting else []
        same = self.policy if self.policy is not None and self.policy.hash == version.policy_hash else None
        return PlanRecord.of(plan, version, approval.missing(version.check.policy, approvals, same) if waiting else ())

    def diff(self, plan_id: str, from_version: int | None = None, to_version: int | None = None) -> PlanDiff:
        """What changed between two versions (default: the one before the latest, and the latest)."""
        plan, _ = self._current(plan_id)
        _not_react(plan)
        return plandiff.between(self.store, plan, from_version, to_version)

    def replay(self, plan_id: str, *, policy: Policy | None = None, against: Sequence[str] = ()) -> ReplayResult:
        """The plan's runs replayed over the recorded outputs with this runtime's tools, calling no tool.

        ``policy``: hold the steps against this one instead of the one each run was under
        (see :mod:`plangate.replay`).
        """
        return replay.replay(self.store, self.resolve_id(plan_id), self._catalogue(), policy, against=against)

    def compare(self, a: str, b: str) -> RunDiff:
        """Plan ``a``'s run against plan ``b``'s, step by step (ids or unique prefixes)."""
        ids = [self.resolve_id(a), self.resolve_id(b)]
        for plan_id in ids:
            _not_react(self._current(plan_id)[0])
        return rundiff.between_runs(self.store, *ids)

    def list_plans(self, query: PlanQuery = EVERY_PLAN, limit: int = 100) -> list[PlanRow]:
        return self.store.list_plans(query, limit)

    def trace(self, plan_id: str) -> list[Event]:
        """Every event recorded under the plan (or ReAct run), in order: the whole story."""
        return list(self.store.events(self.resolve_id(plan_id)))

    def recorded_tools(self, plan_id: str) -> str | None:
        """The tools module the plan was submitted with, as the audit log records it.

        Read from the events, not the plan's row, so that a changed row cannot make plangate
        import another module.
        """
        plan = self.store.get_plan(self.resolve_id(plan_id))
        if plan is None:
            raise NotFoundError(f"no plan {quoted_id(plan_id)}")
        events, broken = self.store.plan_events(plan.id)
        if broken is not None:
            raise GovernanceError(f"plan {plan.id}'s audit events do not verify ({broken}); nothing was imported")
        told = ledger.fold(plan.id, events)
        if told.tools != plan.tools:
            raise GovernanceError(
                f"plan {plan.id}'s tools module on record ({plan.tools!r}) is not the one its audit log names "
                f"({told.tools!r}): the store was changed outside plangate; nothing was run"
            )
        return told.tools

    def resolve_id(self, text: str) -> str:
        """A full plan id from an id or a unique prefix of one (at least 6 characters)."""
        if self.store.get_plan(text) is not None:
            return text
        matches = self.store.find_plans(text) if len(text) >= 6 else []
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise NotFoundError(f"{text!r} matches several plans ({', '.join(m[:13] for m in matches)}); give more")
        raise NotFoundError(f"no plan {quoted_id(text)}")

    def close(self) -> None:
        """Close the store, and the connections the catalogue holds to MCP servers."""
        try:
            if self._given is not None:
                self._given.close()
        finally:
            self.store.close()

    # -- async: the same calls, awaited ---------------------------------------------------
    async def asubmit(self, plan: PlanInput | PlanningResult, requested_by: str, role: str | None = None) -> PlanRecord:
        """:meth:`submit`, awaited."""
        return await self._quick(lambda: self.submit(plan, requested_by, role))

    async def aapprove(
        self, plan_id: str, approver: str, plan_hash: str, comment: str | None = None, role: str | None = None
    ) -> PlanRecord:
        """:meth:`approve`, awaited."""
        return await self._quick(lambda: self.approve(plan_id, approver, plan_hash, comment, role))

    async def areject(self, plan_id: str, approver: str, comment: str, plan_hash: str | None = None) -> PlanRecord:
        """:meth:`reject`, awaited."""
        return await self._quick(lambda: self.reject(plan_id, approver, comment, plan_hash))

    async def aedit(self, plan_id: str, new_plan: PlanInput, editor: str) -> PlanRecord:
        """:meth:`edit`, awaited."""
        return await self._quick(lambda: self.edit(plan_id, new_plan, editor))

    async def asettle(
        self, plan_id: str, step_id: int, *, done: bool, actor: str, output: Any = None, note: str | None = None
    ) -> PlanRecord:
        """:meth:`settle`, awaited."""
        settled = {"done": done, "actor": actor, "output": output, "note": note}
        return await self._quick(lambda: self.settle(plan_id, step_id, **settled))

    async def aclose_plan(self, plan_id: str, *, actor: str, reason: str) -> PlanRecord:
        """:meth:`close_plan`, awaited."""
        return await self._quick(lambda: self.close_plan(plan_id, actor=actor, reason=reason))

    async def aget(self, plan_id: str) -> PlanRecord:
        """:meth:`get`, awaited."""
        return await self._quick(lambda: self.get(plan_id))

    async def atrace(self, plan_id: str) -> list[Event]:
        """:meth:`trace`, awaited."""
        return await self._quick(lambda: self.trace(plan_id))

    async def aexecute(
        self,
        plan_id: str,
        *,
        actor: str = "engine",
        progress: Callable[[Progress], None] | None = None,
        owner: str | None = None,
    ) -> RunResult:
        """:meth:`execute`, awaited, on a store connection of its own: runs on one runtime go on side by side.

        Cancelling the awaiting task does not stop the run: it goes on to its recorded end
        (``progress`` is called from the run's thread).
        """
        return await self._long(lambda rt: rt.execute(plan_id, actor=actor, progress=progress, owner=owner))

    async def aresume(
        self,
        plan_id: str,
        *,
        actor: str = "engine",
        progress: Callable[[Progress], None] | None = None,
        owner: str | None = None,
    ) -> RunResult:
        """:meth:`resume`, awaited, as :meth:`aexecute`."""
        return await self._long(lambda rt: rt.resume(plan_id, actor=actor, progress=progress, owner=owner))

    async def acompensate(self, plan_id: str, *, actor: str, reason: str) -> CompensationResult:
        """:meth:`compensate`, awaited, as :meth:`aexecute`."""
        return await self._long(lambda rt: rt.compensate(plan_id, actor=actor, reason=reason))

    async def _quick(self, call: Callable[[], T]) -> T:
        """A short call on a thread, taking its turn on this runtime's connection."""

        def serially() -> T:
            with self._turns:
                return call()

        return await _aio.off_loop(serially)

    async def _long(self, call: Callable[[Runtime], T]) -> T:
        """A run on a thread, with a store connection of its own (or, for a store in memory, taking its turn)."""

        def alone() -> T:
            store = _aio.reopened(self.store)
            if store is None:
                with self._turns:
                    return call(self)
            runtime = self._on(store)
            try:
                return call(runtime)
            finally:
                runtime.store.close()  # the one it holds now: a run cut off from its store connects again

        return await _aio.off_loop(alone)

    def _on(self, store: Store) -> Runtime:
        """This runtime over another connection to its store."""
        return Runtime(
            self.catalogue,
            self.policy,
            db=store,
            clock=self.clock,
            max_concurrency=self.max_concurrency,
            tools=self.tools,
            notify=self.notify,
            lease_seconds=self.lease_seconds,
            traces=self.traces,
        )

    # -- helpers ---------------------------------------------------------------------------
    def _catalogue(self) -> Catalogue:
        if self.catalogue is None:
            raise UsageError("this needs the tools: give the runtime a catalogue (--tools on the command line)")
        return self.catalogue

    def _current(self, plan_id: str) -> tuple[PlanRow, VersionRow]:
        found = self.store.get_plan_version(plan_id)  # a full id: one read (a prefix is resolved first)
        if found is None:
            found = self.store.get_plan_version(self.resolve_id(plan_id))
        if found is None:
            raise NotFoundError(f"no plan {quoted_id(plan_id)}")
        plan, version = found
        if version is None:
            raise NotFoundError(f"plan {plan.id} has no version {plan.version}")
        return plan, version

    def _locked(self, plan_id: str) -> tuple[PlanRow, VersionRow]:
        """The plan as it stands, read under the log's write lock (inside a transaction)."""
        self.store.lock_log()
        return self._current(plan_id)

    def _authors(self, plan: PlanRow) -> set[str]:
        """Everyone who wrote a version of the plan."""
        rows = self.store.query("SELECT author FROM plan_versions WHERE plan_id = ?", (plan.id,))
        return {str(r[0]) for r in rows}

    def _decision(
        self, plan: PlanRow, version: VersionRow, decision: str, *, actor: str, role: str | None, comment: str | None
    ) -> ApprovalRow:
        return ApprovalRow(
            plan_id=plan.id,
            version=plan.version,
            plan_hash=plan.hash,
            policy_hash=version.policy_hash,
            decision=decision,  # type: ignore[arg-type]
            actor=actor,
            role=role,
            kind="person",
            comment=comment,
            at=self._now(),
        )

    def _new_version(
        self, plan: PlanRow, body: Plan, author: str, result: CheckResult, policy: Policy | None
    ) -> PlanRow:
        """Record a version and its check (against ``policy``), and move the plan to what they say."""
        if policy is not None:
            self.store.save_policy(policy.hash, policy.name, policy.canonical_json())
        checked = self._held_by_register(body.category, drift.record(result, self._catalogue(), body))
        decision = checked.policy
        self.store.insert_version(
            VersionRow(
                plan_id=plan.id,
                version=plan.version,
                hash=body.hash,
                body=body.canonical_json(),
                author=author,
                created_at=self._now(),
                check=checked,
                policy_hash=policy.hash if policy else None,
            )
        )
        self._record(plan, "plan.checked", "checker", checked.to_dict())
        now = self._now()
        if not result.ok:
            metrics.violations(result.violations)
            data = {"by": "check", "violations": len(result.violations)}
            return lifecycle.move(self.store, plan, "rejected", actor="checker", at=now, data=data)
        if decision is not None and decision["approval"] == "auto":
            actor = f"policy:{decision['policy']}"
            self.store.insert_approval(
                ApprovalRow(
                    plan_id=plan.id,
                    version=plan.version,
                    plan_hash=body.hash,
                    policy_hash=decision["policy_hash"],
                    decision="approved",
                    actor=actor,
                    role=None,
                    kind="auto",
                    comment="; ".join(decision["reasons"]),
                    at=now,
                )
            )
            data = {"by": "auto", "hash": body.hash, "reasons": list(decision["reasons"])}
            moved = lifecycle.move(self.store, plan, "approved", actor=actor, at=now, data=data)
            self.traces.automatic(plan.id, plan.version, body.hash, actor, decision["reasons"])
            return moved
        data = {"needs": approval.missing(decision, [])}
        return lifecycle.move(self.store, plan, "pending_approval", actor="checker", at=now, data=data)

    def _held_by_register(self, category: str, checked: CheckRecord) -> CheckRecord:
        """The check, with an automatic approval turned into a person's where the register says so."""
        from plangate.register import Register

        return Register(self.store, self.clock).hold(category, checked)

    def _held_since(self, body: Plan, version: VersionRow) -> CheckRecord | None:
        """The version's check again where the register has held its category since it was approved
        automatically (its automatic approval then no longer lets it run); else None."""
        held = self._held_by_register(body.category, version.check)
        if held is version.check:
            return None
        why = f"the auto-approval register has held category {body.category!r} since v{version.version} was checked"
        return replace(held, recheck=why)

    def _notified(self, record: PlanRecord) -> PlanRecord:
        """Tell reviewers about a plan that waits for them; record whether that worked."""
        if self.notify is not None and record.status == "pending_approval":
            failure = self.notify(record)
            with self.store.transaction():
                self.store.append_event(
                    plan_id=record.id,
                    version=record.version,
                    step_id=None,
                    kind="plan.notify_failed" if failure else "plan.notified",
                    actor="notifier",
                    at=self._now(),
                    data={"error": failure} if failure else {},
                )
        return record

    def _record(self, plan: PlanRow, kind: str, actor: str, data: dict[str, Any]) -> None:
        """The one way the runtime writes an event (inside the caller's transaction)."""
        self.store.append_event(
            plan_id=plan.id, version=plan.version, step_id=None, kind=kind, actor=actor, at=self._now(), data=data
        )

    def _policy_for(self, version: VersionRow) -> Policy | None:
        """The policy the version was checked against (recorded with it), not whatever is loaded now."""
        return Policy.recorded(self.store, version.policy_hash, self.policy)

    def _lease_until(self) -> str:
        return iso(self.clock.now() + timedelta(seconds=self.lease_seconds))

    def _now(self) -> str:
        return iso(self.clock.now())


_AFTER_HALT = {"settle": "have a step settled", "compensate": "be rolled back", "close": "be closed again"}


def _as_checked(plan: PlanRow, category: str | None, doing: str) -> None:
    """Refuse when the caller checked its own right to act on the plan (a dashboard's approvers decide by
    category) on another category than the plan has now, under the log's lock: a correction or an edit
    committed between that check and this lock would be acted on under the old check. The new category
    goes unnamed: it may be one the caller may not see."""
    if category is not None and plan.category != category:
        raise StateError(
            f"plan {plan.id}'s category changed after the right to {doing} it was checked (it was {category!r}): "
            "look at it again"
        )


def _recorded_before(recorded: tuple[int, ...], left: tuple[int, ...]) -> str:
    """What a refused take-back recorded of what its run knew (and left: their tools are gone), for the
    refusal's message."""
    said = ""
    if recorded:
        said += f"; {_outcomes(recorded)}, known from before the store went away, {_be(recorded)} recorded"
    if left:
        said += (
            f"; {_outcomes(left)}, known from before the store went away, {_be(left)} not recorded (the tools are "
            "gone): the next run of the plan decides them by the usual rules"
        )
    return said


def _back_for_approval(plan_id: str, reason: str) -> str:
    return f"plan {plan_id} may not run: {reason}; it is back for approval"


def _refusal(plan_id: str, events: Sequence[Event]) -> str | None:
    """What the checker's refusal of a claim said (it halted a cut-off run, or sent the plan back for approval),
    where that refusal is the plan's newest event; else None."""
    last = events[-1] if events else None
    if last is None or last.actor != "checker":
        return None
    if last.kind == "run.refused":
        return str(last.data.get("error"))
    if last.kind == "plan.pending_approval":
        return _back_for_approval(plan_id, str(last.data.get("reason")))
    return None


def _outcomes(steps: tuple[int, ...]) -> str:
    return f"the outcome of step {steps[0]}" if len(steps) == 1 else f"the outcomes of steps {list(steps)}"


def _be(steps: tuple[int, ...]) -> str:
    return "is" if len(steps) == 1 else "are"


def _not_react(plan: PlanRow) -> None:
    if plan.kind == "react":
        raise StateError(f"{plan.id} is a ReAct run, not a plan: continue it with plangate react --resume {plan.id}")
