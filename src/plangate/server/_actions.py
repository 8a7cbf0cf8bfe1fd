"""What the dashboard's forms, the JSON API and the chat buttons all do, written once."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from starlette.exceptions import HTTPException

from plangate import recovery
from plangate.accounts import User
from plangate.compensation import CompensationResult
from plangate.errors import GovernanceError, NotFoundError, NotPermittedError, quoted_id
from plangate.identity import permit
from plangate.policy import Policy
from plangate.record import PlanRecord
from plangate.results import RunResult
from plangate.runtime import Runtime
from plangate.server._errors import log
from plangate.store import PlanQuery, PlanRow
from plangate.tools import Catalogue

if TYPE_CHECKING:
    from plangate.register import Evidence


def may_decide(user: User, record: PlanRecord) -> None:
    """Approving, rejecting, settling, rolling back and closing are decisions: only for approvers of the category.

    Checked before the runtime locks the plan, so each action passes ``record.category`` on: the runtime
    refuses it if the plan's category has changed by then (an approval is bound to its hash, which covers it).
    """
    permit(user, "decide", record.category)


def visible(rt: Runtime, user: User, plan_id: str) -> PlanRecord:
    """The plan, if ``user`` may see it: requesters their own, approvers the categories they decide,
    auditors and governance all. Its steps' outputs and its trace are shown only to them.

    A short id is looked for only among the plans ``user`` may see: guessing prefixes tells
    nobody another plan's id, or its category (a refusal names them only to whoever gave the whole id).
    """
    if rt.store.get_plan(plan_id) is None:
        plan_id = _seen_prefix(rt, user, plan_id)
    record = rt.get(plan_id)
    if not user.may_read(category=record.category, requested_by=record.requested_by):
        raise NotPermittedError(
            f"{user.name} ({user.role}) may not see plan {record.id} of category {record.category!r}"
        )
    return record


def listing(rt: Runtime, user: User, query: PlanQuery, limit: int) -> list[PlanRow]:
    """The first ``limit`` plans ``query`` selects among those ``user`` may see. The plans it lists
    before or after must be ones they may see too: nobody learns when a plan hidden from them was made."""
    before, after = (None if end is None else visible(rt, user, end).id for end in (query.before, query.after))
    return rt.list_plans(replace(query, scope=user.scope, before=before, after=after), limit)


def left_out_seen(rt: Runtime, user: User, evidence: Evidence) -> tuple[list[str], int]:
    """The plans left out of the register's evidence that ``user`` may see, each ``plan ID: why``, and how many
    others there are. Anyone signed in reads the register: nobody learns from it the id of a plan hidden from them."""
    seen = tuple((plan_id, why) for plan_id, why in evidence.left_out if _may_see(rt, user, plan_id))
    return replace(evidence, left_out=seen).named, len(evidence.left_out) - len(seen)


def _may_see(rt: Runtime, user: User, plan_id: str) -> bool:
    if user.scope is None:  # auditors and governance: every plan
        return True
    row = rt.store.get_plan(plan_id)  # None: a plan only its events tell of, named to those who see every plan
    return row is not None and user.may_read(category=row.category, requested_by=row.requested_by)


def _seen_prefix(rt: Runtime, user: User, prefix: str) -> str:
    """The one plan ``user`` may see whose id starts with ``prefix`` (at least 6 characters)."""
    rows = [rt.store.get_plan(found) for found in (rt.store.find_plans(prefix) if len(prefix) >= 6 else [])]
    seen = [r.id for r in rows if r is not None and user.may_read(category=r.category, requested_by=r.requested_by)]
    if len(seen) > 1:
        raise NotFoundError(f"{prefix!r} matches several plans ({', '.join(i[:13] for i in seen)}); give more")
    if not seen:
        raise NotFoundError(f"no plan {quoted_id(prefix)}")
    return seen[0]


def change_register(rt: Runtime, user: User, category: str, *, on: bool, reason: str, force: bool = False) -> Any:
    """Clear (or stop clearing) a category for automatic approval: governance only (403 for anyone else).

    Held against the server's policy: turning on a category it never approves automatically is refused (409).
    """
    from plangate.register import Register

    permit(user, "register")
    return Register(rt.store).set(category, on, by=user.name, reason=reason, policy=rt.policy, force=force)


def may_audit(user: User) -> None:
    if user.role not in ("auditor", "governance"):
        raise HTTPException(403, "the audit log is for auditors and governance")


def decide(
    rt: Runtime,
    user: User,
    plan_id: str,
    plan_hash: str | None,
    comment: str | None,
    *,
    approve: bool,
    version: int | None = None,
) -> PlanRecord:
    """Approve or reject the version named by ``plan_hash`` (and ``version``, when given: a chat button's)."""
    record = visible(rt, user, plan_id)
    may_decide(user, record)
    if approve:
        return rt.approve(record.id, user.name, plan_hash or "", comment=comment, plan_version=version)
    return rt.reject(
        record.id, user.name, comment or "", plan_hash=plan_hash or None, plan_version=version, category=record.category
    )


def settle(
    rt: Runtime, user: User, plan_id: str, step: int, *, done: bool, output: Any, note: str | None
) -> PlanRecord:
    record = visible(rt, user, plan_id)
    may_decide(user, record)
    return rt.settle(
        record.id, step, done=done, actor=user.name, output=output, note=note or None, category=record.category
    )


def compensate(rt: Runtime, user: User, plan_id: str, reason: str) -> CompensationResult:
    record = visible(rt, user, plan_id)
    may_decide(user, record)
    return rt.compensate(record.id, actor=user.name, reason=reason, category=record.category)


def close(rt: Runtime, user: User, plan_id: str, reason: str) -> PlanRecord:
    record = visible(rt, user, plan_id)
    may_decide(user, record)
    return rt.close_plan(record.id, actor=user.name, reason=reason, category=record.category)


def edit(rt: Runtime, user: User, plan_id: str, plan: Any) -> PlanRecord:
    """A new version, by anyone who may see the plan and change things."""
    record = visible(rt, user, plan_id)
    permit(user, "edit", record.category, requested_by=record.requested_by)
    return rt.edit(record.id, plan, editor=user.name, category=record.category)


def halted(rt: Runtime, user: User, plan_id: str) -> PlanRecord:
    """The plan, if it is halted: only a halted plan is resumed by a person here."""
    record = visible(rt, user, plan_id)
    recovery.refuse_closed(rt.store, record.id, record.status, "be resumed")
    if record.status != "halted":
        raise GovernanceError(f"plan {record.id} is {record.status}; only a halted plan resumes here")
    return record


def start(rt: Runtime, record: PlanRecord, user: User) -> PlanRecord:
    """Claim the run now (so a second click is refused, not run twice), then run it in a thread of its own.

    The thread has its own store connection; the run page follows it.
    """
    recovery.refuse_closed(rt.store, record.id, record.status, "run")
    if record.status not in ("approved", "halted"):
        raise GovernanceError(f"plan {record.id} is {record.status}, not approved")
    claim = rt.start(record.id, actor=user.name)
    _background(lambda worker: worker.drive(claim), rt.catalogue, rt.policy, rt.store.url)
    return record


def _background(
    job: Callable[[Runtime], Any], catalogue: Catalogue | None, policy: Policy | None, db: str | None
) -> None:
    """Run ``job`` in a thread with a runtime (and store connection) of its own."""

    def run() -> None:
        worker = Runtime(catalogue, policy, db=db)
        try:
            job(worker)
        except Exception:  # noqa: BLE001 - nobody waits on this thread: the log is where its failure goes
            log.exception("a run started from the dashboard failed outside the engine")
        finally:
            worker.close()

    threading.Thread(target=run, name="plangate-run", daemon=True).start()


def run_result(result: RunResult) -> dict[str, Any]:
    return {
        "status": result.status,
        "outputs": {str(k): v for k, v in result.outputs.items()},
        "failed_step": result.failed_step,
        "error": result.error,
        "ok": result.ok,
        "summary": str(result),
    }


def compensation_result(result: CompensationResult) -> dict[str, Any]:
    return {**asdict(result), "summary": str(result)}
