"""What every part of :class:`plangate.runtime.Runtime` stands on: its store, clock, tools and policy, how it reads
a plan and its version (under the log's lock, or not), records an event, tells the time and a lease's end; and what
it refuses of any plan it acts on."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

from plangate import approval, tracing
from plangate._clock import Clock, SystemClock, iso
from plangate._overrides import governed
from plangate.engine import DEFAULT_CONCURRENCY
from plangate.errors import NotFoundError, StateError, UsageError, quoted_id
from plangate.plan import Plan
from plangate.policy import Policy
from plangate.record import PlanRecord
from plangate.store import CheckRecord, PlanRow, Store, VersionRow, open_store
from plangate.tools import Catalogue
from plangate.tracing import Traces

AFTER_HALT = {"settle": "have a step settled", "compensate": "be rolled back", "close": "be closed again"}


class RuntimeCore:
    """The runtime's state and the reads and records its parts share (see :class:`plangate.runtime.Runtime`)."""

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

    def _authors(self, plan: PlanRow) -> set[str]:
        """Everyone who wrote a version of the plan."""
        rows = self.store.query("SELECT author FROM plan_versions WHERE plan_id = ?", (plan.id,))
        return {str(r[0]) for r in rows}

    def _record_of(self, plan: PlanRow, version: VersionRow) -> PlanRecord:
        """The record of a plan from the rows already read (approvals only while it waits for them)."""
        waiting = plan.status == "pending_approval"
        approvals = self.store.approvals(plan.id, plan.version) if waiting else []
        same = self.policy if self.policy is not None and self.policy.hash == version.policy_hash else None
        return PlanRecord.of(plan, version, approval.missing(version.check.policy, approvals, same) if waiting else ())

    def _policy_now(self, version: VersionRow) -> Policy | None:
        """The policy in force: the runtime's, or else the one the version was checked against."""
        return self.policy if self.policy is not None else self._policy_for(version)


def as_checked(plan: PlanRow, category: str | None, doing: str) -> None:
    """Refuse when the caller checked its own right to act on the plan (a dashboard's approvers decide by
    category) on another category than the plan has now, under the log's lock: a correction or an edit
    committed between that check and this lock would be acted on under the old check. The new category
    goes unnamed: it may be one the caller may not see."""
    if category is not None and plan.category != category:
        raise StateError(
            f"plan {plan.id}'s category changed after the right to {doing} it was checked (it was {category!r}): "
            "look at it again"
        )


def not_react(plan: PlanRow) -> None:
    """A ReAct run is continued as one, never acted on as a plan."""
    if plan.kind == "react":
        raise StateError(f"{plan.id} is a ReAct run, not a plan: continue it with plangate react --resume {plan.id}")
