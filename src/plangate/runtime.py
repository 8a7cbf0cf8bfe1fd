"""The runtime: the public face of the governed path.

``submit`` → check and policy → approval (a person, or automatic where governance has
cleared the category) → ``execute`` by the deterministic engine → ``trace``. Every
transition is recorded, in the same transaction as the state it changes, as an event in
the hash-chained audit log under the plan's UUID.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from plangate import approval
from plangate._clock import Clock, SystemClock, iso
from plangate.check import CheckResult, check
from plangate.compensation import Compensation, CompensationResult
from plangate.engine import DEFAULT_CONCURRENCY, Engine, Progress, RunResult, recorded_result
from plangate.errors import GovernanceError, NotFoundError, StateError, UsageError
from plangate.plan import Plan
from plangate.planner import PlanningResult
from plangate.policy import Policy
from plangate.store import DONE, ApprovalRow, Event, PlanRow, PlanStatus, Store, VersionRow, open_store
from plangate.tools import Catalogue
from plangate.violations import Violation

PlanInput = Plan | Mapping[str, Any] | str | bytes


@dataclass(frozen=True, kw_only=True)
class PlanRecord:
    """A submitted plan as the store knows it: identity, status, and what it still needs."""

    id: str
    version: int
    hash: str
    status: PlanStatus
    task: str
    category: str
    requested_by: str
    role: str | None
    plan: Plan | None
    violations: tuple[Violation, ...] = ()
    decision: dict[str, Any] | None = None
    needs: tuple[str, ...] = ()
    kind: str = "plan"
    action: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "version": self.version,
            "hash": self.hash,
            "status": self.status,
            "task": self.task,
            "category": self.category,
            "requested_by": self.requested_by,
            "needs": list(self.needs),
            "violations": [v.to_dict() for v in self.violations],
            "policy": self.decision,
            "plan": json.loads(self.plan.canonical_json()) if self.plan else None,
        }

    def __str__(self) -> str:
        what = "ReAct run" if self.kind == "react" else "plan"
        text = f"{what} {self.id} v{self.version} {self.hash[:12]}: {self.status}"
        if self.status == "pending_approval" and self.needs:
            text += f" (needs approval by {' and by '.join(self.needs)})"
        if self.violations:
            text += f" ({len(self.violations)} violation{'s' if len(self.violations) != 1 else ''})"
        return text


class Runtime:
    """Submit, approve, execute and trace plans over one catalogue, policy and store.

    ``db`` is a store URL (``sqlite:///PATH``; default ``$PLANGATE_DB`` or
    ``./.plangate/plangate.db``) or an open :class:`~plangate.store.Store`. Time and ids
    come from ``clock``, so tests and replays can fix them.
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
    ) -> None:
        self.catalogue = catalogue
        self.policy = policy
        self.store = db if isinstance(db, Store) else open_store(db)
        self.clock = clock or SystemClock()
        self.max_concurrency = max_concurrency
        self.tools = tools
        self.notify = notify

    # -- submit, decide, edit --------------------------------------------------------------
    def submit(self, plan: PlanInput | PlanningResult, requested_by: str, role: str | None = None) -> PlanRecord:
        """Check and hold a plan against the policy, record it, and say what it needs.

        Given a :class:`~plangate.planner.PlanningResult`, how the plan was made (the
        template and its slots, or the model, its budget, tokens, cost and thinking) is
        recorded in the audit log with it. The thinking stays there: it is never passed on
        to a tool.
        """
        planning: PlanningResult | None = None
        if isinstance(plan, PlanningResult):
            planning, parsed = plan, plan.plan
        else:
            parsed = plan if isinstance(plan, Plan) else Plan.parse(plan)
        result = check(parsed, self._catalogue(), self.policy, user=requested_by, role=role)
        plan_id, now = self.clock.new_id(), self._now()
        with self.store.transaction():
            self.store.insert_plan(
                PlanRow(
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
            )
            self._event(
                plan_id,
                1,
                "plan.submitted",
                requested_by,
                {
                    "hash": parsed.hash,
                    "task": parsed.task,
                    "category": parsed.category,
                    "role": role,
                    "steps": len(parsed.steps),
                    "tools": self.tools,
                },
            )
            if planning is not None:
                self._event(plan_id, 1, "plan.planned", planning.model or "library", planning.record())
                self.store.link_calls([call.id for call in planning.calls], plan_id)
            self._new_version(plan_id, 1, parsed, requested_by, result)
        return self._notified(self.get(plan_id))

    def approve(
        self, plan_id: str, approver: str, plan_hash: str, comment: str | None = None, role: str | None = None
    ) -> PlanRecord:
        """Approve the current version, named by its hash. Nobody approves their own plan."""
        with self.store.transaction():
            plan, version = self._current(plan_id)
            approval.check_can_decide(plan, version, approver, plan_hash)
            approvals = self.store.approvals(plan.id, plan.version)
            approval.check_can_approve(plan, version, approver, approvals)
            held = self._approver_role(version, approver, role)
            row = ApprovalRow(
                plan_id=plan.id,
                version=plan.version,
                plan_hash=plan.hash,
                policy_hash=version.policy_hash,
                decision="approved",
                actor=approver,
                role=held,
                kind="person",
                comment=comment,
                at=self._now(),
            )
            self.store.insert_approval(row)
            needs = approval.missing(version.check.get("policy"), [*approvals, row])
            self._event(
                plan.id,
                plan.version,
                "plan.approval",
                approver,
                {"decision": "approved", "hash": plan.hash, "role": held, "comment": comment, "still_needs": needs},
            )
            if not needs:
                self._set_status(plan, "approved", approver, {"by": "person"})
        return self.get(plan.id)

    def reject(self, plan_id: str, approver: str, comment: str, plan_hash: str | None = None) -> PlanRecord:
        """Reject the current version, with the reason why."""
        if not comment or not comment.strip():
            raise UsageError("a rejection needs a comment saying why")
        with self.store.transaction():
            plan, version = self._current(plan_id)
            approval.check_can_decide(plan, version, approver, plan_hash)
            self.store.insert_approval(
                ApprovalRow(
                    plan_id=plan.id,
                    version=plan.version,
                    plan_hash=plan.hash,
                    policy_hash=version.policy_hash,
                    decision="rejected",
                    actor=approver,
                    role=self._role_of(version, approver),
                    kind="person",
                    comment=comment,
                    at=self._now(),
                )
            )
            self._event(
                plan.id,
                plan.version,
                "plan.approval",
                approver,
                {"decision": "rejected", "hash": plan.hash, "comment": comment},
            )
            self._set_status(plan, "rejected", approver, {"by": "person", "comment": comment})
        return self.get(plan.id)

    def edit(self, plan_id: str, new_plan: PlanInput, editor: str) -> PlanRecord:
        """Make a new version: re-checked, and every earlier approval void."""
        parsed = new_plan if isinstance(new_plan, Plan) else Plan.parse(new_plan)
        with self.store.transaction():
            plan, _ = self._current(plan_id)
            _not_react(plan)
            if plan.status not in ("pending_approval", "approved", "rejected", "halted"):
                raise StateError(
                    f"plan {plan.id} is {plan.status}; only a plan not yet executed, or halted, can be edited"
                )
            if plan.status == "halted":
                self._check_correction(plan, parsed)
            if parsed.hash == plan.hash:
                raise StateError(f"the edit does not change plan {plan.id} (same hash {plan.hash[:12]}…)")
            result = check(parsed, self._catalogue(), self.policy, user=plan.requested_by, role=plan.role)
            voided = self.store.void_approvals(plan.id)
            number = plan.version + 1
            self.store.update_plan(plan.id, version=number, hash=parsed.hash, task=parsed.task, updated_at=self._now())
            self._event(
                plan.id,
                number,
                "plan.edited",
                editor,
                {"from_version": plan.version, "from_hash": plan.hash, "hash": parsed.hash, "approvals_voided": voided},
            )
            self._new_version(plan.id, number, parsed, editor, result)
        return self._notified(self.get(plan.id))

    def _check_correction(self, plan: PlanRow, corrected: Plan) -> None:
        """A correction of a halted plan may change only what has not run: what ran is kept."""
        old = self.store.get_version(plan.id, plan.version)
        assert old is not None
        before = {s.id: s for s in Plan.parse(old.body).steps}
        after = {s.id: s for s in corrected.steps}
        rows = sorted(self.store.steps(plan.id).items())
        unknown = [step_id for step_id, row in rows if row.status in ("started", "outcome_unknown")]
        if unknown:
            raise StateError(f"step {unknown[0]}'s outcome is unknown: settle it first (plangate settle)")
        for step_id, row in rows:
            if row.status in DONE and step_id > 0 and after.get(step_id) != before.get(step_id):
                raise StateError(
                    f"step {step_id} already ran ({row.status}); a correction may change only steps "
                    "that have not succeeded, and keeps the others as they are"
                )

    def settle(
        self, plan_id: str, step_id: int, *, done: bool, actor: str, output: Any = None, note: str | None = None
    ) -> PlanRecord:
        """A person settles a step whose outcome is unknown: it happened (with the output they saw) or it did not."""
        with self.store.transaction():
            plan, version = self._current(plan_id)
            row = self.store.steps(plan.id).get(step_id)
            if row is None or row.status not in ("outcome_unknown", "started"):
                raise StateError(f"step {step_id} of plan {plan.id} has no unknown outcome to settle")
            step = Plan.parse(version.body).step(step_id)
            now = self._now()
            if done:
                tool = self._catalogue()[step.tool]
                try:
                    output = tool.dump_output(output)
                except ValueError as exc:
                    raise UsageError(f"the output given does not match {tool.name}'s declared type: {exc}") from None
                self.store.put_step(replace(row, status="succeeded", output=output, error=None, finished_at=now))
            else:
                error = f"settled as not done by {actor}" + (f": {note}" if note else "")
                self.store.put_step(replace(row, status="failed", error=error, finished_at=now))
            self._event(
                plan.id,
                plan.version,
                "step.settled",
                actor,
                {"step": step_id, "done": done, "output": output, "note": note},
            )
        return self.get(plan.id)

    def compensate(self, plan_id: str, *, actor: str, reason: str) -> CompensationResult:
        """Undo a halted plan's completed steps in reverse order (see :mod:`plangate.compensation`)."""
        plan, version = self._current(plan_id)
        _not_react(plan)
        if plan.status not in ("halted", "compensation_incomplete"):
            raise StateError(f"plan {plan.id} is {plan.status}; only a halted plan can be compensated")
        if not reason.strip():
            raise UsageError("say why the plan is rolled back")
        return Compensation(
            store=self.store,
            catalogue=self._catalogue(),
            clock=self.clock,
            plan_id=plan.id,
            version=plan.version,
            plan=Plan.parse(version.body),
            actor=actor,
        ).run(reason)

    # -- execute ---------------------------------------------------------------------------
    def execute(
        self, plan_id: str, *, actor: str = "engine", progress: Callable[[Progress], None] | None = None
    ) -> RunResult:
        """Run an approved plan. A finished plan is not run again: its recorded result comes back."""
        plan, version = self._current(plan_id)
        _not_react(plan)
        if plan.status in ("succeeded", "halted"):
            return self._recorded(plan, version)
        if plan.status == "running":
            raise StateError(f"plan {plan.id} is already running; if its worker died, use resume")
        if plan.status != "approved":
            needs = self.get(plan.id).needs
            why = f": it needs approval by {' and by '.join(needs)}" if needs and plan.status != "rejected" else ""
            raise StateError(f"plan {plan.id} is {plan.status}, not approved{why}")
        return self._run(plan, version, actor, progress)

    def resume(
        self, plan_id: str, *, actor: str = "engine", progress: Callable[[Progress], None] | None = None
    ) -> RunResult:
        """Continue a halted or interrupted run: completed steps are loaded, never run again."""
        plan, version = self._current(plan_id)
        _not_react(plan)
        if plan.status == "succeeded":
            return self._recorded(plan, version)
        if plan.status not in ("running", "halted", "approved"):
            raise StateError(f"plan {plan.id} is {plan.status}; only an approved plan can run")
        return self._run(plan, version, actor, progress)

    def _run(
        self, plan: PlanRow, version: VersionRow, actor: str, progress: Callable[[Progress], None] | None
    ) -> RunResult:
        body = Plan.parse(version.body)
        if version.check.get("catalogue") != self._fingerprint(body):  # the tools changed since the check
            recheck = check(body, self._catalogue())
            if not recheck.ok:
                raise StateError(f"plan {plan.id} no longer fits the catalogue: {recheck.violations[0]}")
        engine = Engine(
            store=self.store,
            catalogue=self._catalogue(),
            clock=self.clock,
            policy=self._policy_for(version),
            max_concurrency=self.max_concurrency,
            progress=progress,
        )
        result = engine.run(plan.id, plan.version, body, actor=actor)
        policy = self._policy_for(version)
        unknown = (result.error or "").startswith("outcome unknown")
        if not result.ok and not unknown and policy is not None and policy.compensation.on_halt == "auto":
            self.compensate(plan.id, actor=f"policy:{policy.name}", reason="the policy rolls back halted plans")
        return result

    def _recorded(self, plan: PlanRow, version: VersionRow) -> RunResult:
        return recorded_result(plan.id, plan.version, Plan.parse(version.body), self.store.steps(plan.id), plan.status)

    # -- read ------------------------------------------------------------------------------
    def get(self, plan_id: str) -> PlanRecord:
        row = self.store.get_plan(self.resolve_id(plan_id))
        if row is not None and row.kind == "react" and row.version == 0:  # a ReAct run with no pending action
            return PlanRecord(
                id=row.id,
                version=0,
                hash=row.hash,
                status=row.status,
                task=row.task,
                category=row.category,
                requested_by=row.requested_by,
                role=row.role,
                plan=None,
                kind="react",
            )
        plan, version = self._current(plan_id)
        check_data = version.check
        violations = tuple(Violation(**v) for v in check_data.get("violations", []))
        decision = check_data.get("policy")
        needs = (
            ()
            if plan.status != "pending_approval"
            else tuple(approval.missing(decision, self.store.approvals(plan.id, plan.version)))
        )
        return PlanRecord(
            id=plan.id,
            version=plan.version,
            hash=plan.hash,
            status=plan.status,
            task=plan.task,
            category=plan.category,
            requested_by=plan.requested_by,
            role=plan.role,
            plan=None if plan.kind == "react" else Plan.parse(version.body),
            violations=violations,
            decision=decision,
            needs=needs,
            kind=plan.kind,
            action=check_data.get("action"),
        )

    def list_plans(self, status: str | None = None, limit: int = 100) -> list[PlanRow]:
        return self.store.list_plans(status, limit)

    def trace(self, plan_id: str) -> list[Event]:
        """Every event recorded under the plan (or ReAct run), in order: the whole story."""
        return list(self.store.events(self.resolve_id(plan_id)))

    def resolve_id(self, text: str) -> str:
        """A full plan id from an id or a unique prefix of one (at least 6 characters)."""
        if self.store.get_plan(text) is not None:
            return text
        matches = self.store.find_plans(text) if len(text) >= 6 else []
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise NotFoundError(f"{text!r} matches several plans ({', '.join(m[:13] for m in matches)}); give more")
        raise NotFoundError(f"no plan {text!r}")

    def close(self) -> None:
        self.store.close()

    # -- helpers ---------------------------------------------------------------------------
    def _catalogue(self) -> Catalogue:
        if self.catalogue is None:
            raise UsageError("this needs the tools: give the runtime a catalogue (--tools on the command line)")
        return self.catalogue

    def _current(self, plan_id: str) -> tuple[PlanRow, VersionRow]:
        plan = self.store.get_plan(self.resolve_id(plan_id))
        if plan is None:
            raise NotFoundError(f"no plan {plan_id!r}")
        version = self.store.get_version(plan.id, plan.version)
        if version is None:
            raise NotFoundError(f"plan {plan.id} has no version {plan.version}")
        return plan, version

    def _new_version(self, plan_id: str, number: int, plan: Plan, author: str, result: CheckResult) -> None:
        if self.policy is not None:
            self.store.save_policy(self.policy.hash, self.policy.name, self.policy.canonical_json())
        checked = {**result.to_dict(), "catalogue": self._fingerprint(plan)}
        decision = checked["policy"]
        if decision is not None and decision["approval"] == "auto":
            held = self._held(plan.category)
            if held is not None:  # the register holds this category for people, whatever the policy allows
                decision = checked["policy"] = {
                    **decision,
                    "approval": "human",
                    "reasons": [*decision["reasons"], held],
                }
        self.store.insert_version(
            VersionRow(
                plan_id=plan_id,
                version=number,
                hash=plan.hash,
                body=plan.canonical_json(),
                author=author,
                created_at=self._now(),
                check=checked,
                policy_hash=self.policy.hash if self.policy else None,
            )
        )
        self._event(plan_id, number, "plan.checked", "checker", checked)
        row = self.store.get_plan(plan_id)
        assert row is not None
        if not result.ok:
            self._set_status(row, "rejected", "checker", {"by": "check", "violations": len(result.violations)})
        elif decision is not None and decision["approval"] == "auto":
            actor = f"policy:{decision['policy']}"
            self.store.insert_approval(
                ApprovalRow(
                    plan_id=plan_id,
                    version=number,
                    plan_hash=plan.hash,
                    policy_hash=decision["policy_hash"],
                    decision="approved",
                    actor=actor,
                    role=None,
                    kind="auto",
                    comment="; ".join(decision["reasons"]),
                    at=self._now(),
                )
            )
            self._set_status(row, "approved", actor, {"by": "auto", "reasons": list(decision["reasons"])})
        else:
            self._set_status(row, "pending_approval", "checker", {"needs": approval.missing(decision, [])})

    def _notified(self, record: PlanRecord) -> PlanRecord:
        """Tell reviewers about a plan that waits for them; record whether that worked."""
        if self.notify is not None and record.status == "pending_approval":
            failure = self.notify(record)
            with self.store.transaction():
                self._event(
                    record.id,
                    record.version,
                    "plan.notify_failed" if failure else "plan.notified",
                    "notifier",
                    {"error": failure} if failure else {},
                )
        return record

    def _held(self, category: str) -> str | None:
        """Why the auto-approval register keeps ``category`` for people, or None when it does not."""
        from plangate.register import Register

        entry = Register(self.store, self.clock).get(category)
        if entry is None or entry.auto:
            return None
        return f"the auto-approval register holds category {category!r} for people ({entry.reason})"

    def _fingerprint(self, plan: Plan) -> str:
        """The contracts of the tools the plan uses: if they change, the plan is checked again."""
        return self._catalogue().fingerprint(step.tool for step in plan.steps)

    def _set_status(self, plan: PlanRow, status: PlanStatus, actor: str, data: dict[str, Any]) -> None:
        self.store.update_plan(plan.id, status=status, updated_at=self._now())
        self._event(plan.id, None, f"plan.{status}", actor, data)

    def _event(self, plan_id: str, version: int | None, kind: str, actor: str, data: dict[str, Any]) -> None:
        if version is None:
            row = self.store.get_plan(plan_id)
            version = row.version if row else None
        self.store.append_event(
            plan_id=plan_id, version=version, step_id=None, kind=kind, actor=actor, at=self._now(), data=data
        )

    def _approver_role(self, version: VersionRow, approver: str, claimed: str | None) -> str | None:
        """The approver's role: the policy's ``users`` mapping decides; a claim may not contradict it."""
        known = self._role_of(version, approver)
        if claimed is not None and known is not None and claimed != known:
            raise GovernanceError(f"{approver} holds role {known!r} under the policy, not {claimed!r}")
        return known or claimed

    def _role_of(self, version: VersionRow, user: str) -> str | None:
        policy = self._policy_for(version)
        if policy is None:
            return None
        return policy.users.get(user) or None

    def _policy_for(self, version: VersionRow) -> Policy | None:
        """The policy the version was checked against (recorded with it), not whatever is loaded now."""
        if version.policy_hash is None:
            return None
        if self.policy is not None and self.policy.hash == version.policy_hash:
            return self.policy
        text = self.store.policy_text(version.policy_hash)
        return Policy.from_data(json.loads(text), source=f"policy {version.policy_hash[:12]}") if text else None

    def _now(self) -> str:
        return iso(self.clock.now())


def _not_react(plan: PlanRow) -> None:
    if plan.kind == "react":
        raise StateError(f"{plan.id} is a ReAct run, not a plan: continue it with plangate react --resume {plan.id}")
