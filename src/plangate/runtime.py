"""The runtime: the public face of the governed path.

``submit`` → check and policy → approval (a person, or automatic where governance has
cleared the category) → ``execute`` by the deterministic engine → ``trace``. Every
transition is recorded, in the same transaction as the state it changes, as an event in
the hash-chained audit log under the plan's UUID.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from plangate import (
    _aio,
    _input,
    approval,
    drift,
    ledger,
    lifecycle,
    metrics,
    plandiff,
    recovery,
    replay,
    rundiff,
)
from plangate._core import as_checked, not_react
from plangate._running import Running
from plangate.check import CheckResult, check
from plangate.compensation import CompensationResult
from plangate.errors import (
    GovernanceError,
    NotFoundError,
    StateError,
    UsageError,
    quoted_id,
)
from plangate.plan import Plan
from plangate.plandiff import PlanDiff
from plangate.planner import PlanningResult
from plangate.policy import Policy
from plangate.record import PlanRecord
from plangate.replay import ReplayResult
from plangate.results import Progress, RunResult
from plangate.rundiff import RunDiff
from plangate.store import (
    EVERY_PLAN,
    ApprovalRow,
    Event,
    PlanQuery,
    PlanRow,
    Store,
    VersionRow,
)
from plangate.tracing import traced_decision

PlanInput = Plan | Mapping[str, Any] | str | bytes
T = TypeVar("T")


class Runtime(Running):
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

        ``category``: the plan's category when the caller checked its own right to decide (see :func:`as_checked`).
        """
        if comment is None or not _input.check_text(comment, "comment", what="rejection").strip():
            raise UsageError("a rejection needs a comment saying why")
        with self.store.transaction():
            plan, version = self._locked(plan_id)
            as_checked(plan, category, "reject")
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
        ``category``: the plan's category when the caller checked its own right to edit (see :func:`as_checked`).
        """
        parsed = new_plan if isinstance(new_plan, Plan) else Plan.parse(new_plan)
        with self.store.transaction():
            plan, old = self._locked(plan_id)
            as_checked(plan, category, "edit")
            not_react(plan)
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
        category when the caller checked its own right to decide (see :func:`as_checked`).
        """
        if note is not None:
            _input.check_text(note, "note", what="settlement")
        _input.check_value(output, "output", what="settlement")
        with self.store.transaction():
            plan, version = self._locked(plan_id)
            not_react(plan)
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

    def close_plan(self, plan_id: str, *, actor: str, reason: str, category: str | None = None) -> PlanRecord:
        """End a halted plan that will not be resumed: ``closed``, for good, with who and why.

        What ran stays as it is (to undo it, :meth:`compensate` instead). A decision like a
        rollback: never the requester or an author, never during a run, and only once every
        step's outcome is known. A rollback that could not undo everything may be closed too.
        ``category``: the plan's category when the caller checked its own right to decide
        (see :func:`as_checked`).
        """
        if not _input.check_text(reason, "reason", what="closing").strip():
            raise UsageError("say why the plan is closed")
        with self.store.transaction():
            plan, version = self._locked(plan_id)
            not_react(plan)
            self._check_after_halt(
                plan, version, actor, doing="close", allowed=("halted", "compensation_incomplete"), category=category
            )
            plan = recovery.close(self.store, plan, actor=actor, reason=reason, at=self._now())
        return self._record_of(plan, version)

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

    def diff(self, plan_id: str, from_version: int | None = None, to_version: int | None = None) -> PlanDiff:
        """What changed between two versions (default: the one before the latest, and the latest)."""
        plan, _ = self._current(plan_id)
        not_react(plan)
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
            not_react(self._current(plan_id)[0])
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
