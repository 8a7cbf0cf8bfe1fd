"""A plan's state as the audit log tells it, and the rows held against it.

The rows in ``plans``, ``plan_versions``, ``approvals`` and ``policies`` are what the
runtime reads to decide quickly; the audit log is what proves. :func:`fold` rebuilds a
plan's authoritative state (its versions and their hashes and authors, the check and
policy decision of each, the decisions of people, its status) from its events alone, and
:func:`problems` names every row that does not agree with it. ``plangate audit verify``
runs it over every plan, and the engine, before the first step of a run, over the plan
it is about to run: the right to run comes from the events, for the exact hash that runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from plangate import _purged, approval, recovery
from plangate.audit import AuditReport
from plangate.errors import GovernanceError
from plangate.plan import Plan, same_json
from plangate.store import ApprovalRow, CheckRecord, Event, PlanRow, StepRow, Store, VersionRow
from plangate.tools import idempotency_key


@dataclass
class Version:
    number: int
    hash: str
    author: str
    check: CheckRecord | None = None


@dataclass(frozen=True)
class Attempt:
    """What a step's latest attempt wrote in its row, as its events record it (named as the columns of ``steps``)."""

    attempt: int
    """Which attempt: a resumed call is the next one, and its tool is told the number."""
    idempotency_key: str
    """The key a call made again runs under."""
    version: int | None
    """The plan version it ran under: a run reuses what a version up to its own completed."""


@dataclass
class PlanLedger:
    """What the events say about one plan."""

    plan_id: str
    kind: str | None = None
    """``plan`` or ``react``, from the first event, never from the plans row."""
    requested_by: str | None = None
    task: str | None = None
    """The task the current version was submitted or edited with (a ReAct run: its question); None after an
    edit recorded before edits recorded their task."""
    role: str | None = None
    category: str | None = None
    tools: str | None = None
    status: str | None = None
    current: int = 0
    versions: dict[int, Version] = field(default_factory=dict)
    decisions: list[ApprovalRow] = field(default_factory=list)
    steps: dict[int, tuple[str, Any]] = field(default_factory=dict)
    """Each step's last recorded status and, once it succeeded, its output (undo steps: negative ids)."""
    params: dict[int, Any] = field(default_factory=dict)
    """The parameters each step (undo steps: negative ids) was last called with; a rollback undoes with them."""
    errors: dict[int, str | None] = field(default_factory=dict)
    """The error each step's (undo steps: negative ids) row keeps, as its last outcome's event tells it: a failure's,
    a skip's reason, a settlement as not done; a halt records it, and a person reads it before settling."""
    attempts: dict[int, Attempt] = field(default_factory=dict)
    """Each step's (undo steps: negative ids) latest attempt: its number, key and plan version."""
    times: dict[int, tuple[str | None, str | None]] = field(default_factory=dict)
    """When each step (undo steps: negative ids) started and finished, as its row records them (see :func:`_times`)."""
    pending: dict[str, Any] | None = None
    """A ReAct run's action waiting for approval: its hash and what it needs."""
    resumed: set[str] = field(default_factory=set)
    """The hashes of the ReAct actions that were carried out after their approval."""
    events: list[Event] = field(default_factory=list)
    """The events it was folded from, when they were read to act on the plan."""
    rows: dict[int, StepRow] | None = None
    """The plan's step rows, as read to hold them against the events (when they were)."""
    purged: str | None = None
    """When a retention purge removed the plan's payloads (from its sealed events)."""
    broken: list[str] = field(default_factory=list)
    """Events that do not follow from the ones before them (a transition from a state the plan was not in)."""

    @property
    def version(self) -> Version | None:
        return self.versions.get(self.current)

    @property
    def authors(self) -> set[str]:
        return {v.author for v in self.versions.values()}

    def standing(self) -> list[ApprovalRow]:
        """The decisions on the current version, for its hash, by people allowed to make them."""
        version = self.version
        if version is None:
            return []
        barred = {self.requested_by, *self.authors}
        return [
            d
            for d in self.decisions
            if d.version == version.number
            and d.plan_hash == version.hash
            and not d.void
            and (d.kind == "auto" or d.actor not in barred)
        ]

    def needs(self) -> list[str]:
        """What the current version still needs before it may run (empty: it is approved)."""
        version = self.version
        if version is None or version.check is None:
            return ["a check"]
        return approval.missing(version.check.policy, self.standing())


def unhalted(events: Iterable[Event]) -> tuple[int, ...]:
    """The steps whose failure the plan's current run recorded with no halt after it, in order.

    A run that dies between a step's failure and its halt (other calls still in flight) leaves
    the plan running; whoever takes it over must halt on that failure, not call the step again.
    A run a person began (from approved or halted) starts afresh: what failed before it is theirs
    to run again.
    """
    failed: dict[int, None] = {}
    for event in events:
        transition = event.data.get("transition") if isinstance(event.data, dict) else None
        taken_over = isinstance(transition, dict) and transition.get("from") == "running"
        begun = event.kind in ("run.started", "run.resumed") and not taken_over  # a run a person (or worker) began
        if begun or event.kind in ("run.halted", "run.refused"):
            failed.clear()
        elif event.kind == "step.failed" and event.step_id is not None:
            failed[event.step_id] = None
        elif event.kind in ("step.started", "step.settled") and event.step_id is not None:
            failed.pop(event.step_id, None)
    return tuple(failed)


def fold(plan_id: str, events: Iterable[Event]) -> PlanLedger:
    """Replay a plan's events into its state (events of other plans are ignored)."""
    ledger = PlanLedger(plan_id=plan_id)
    for event in events:
        if event.plan_id == plan_id:
            _apply(ledger, event)
    return ledger


def _apply(ledger: PlanLedger, event: Event) -> None:
    data, kind = event.data, event.kind
    ledger.purged = _purged.purged_at(data) or ledger.purged
    if kind == "plan.submitted":
        ledger.kind = "plan"
        ledger.requested_by, ledger.role, ledger.task = event.actor, data.get("role"), data.get("task")
        ledger.category, ledger.tools = data.get("category"), data.get("tools")
        ledger.current = 1
        ledger.versions[1] = Version(number=1, hash=data["hash"], author=event.actor)
    elif kind == "plan.edited" and event.version is not None:
        ledger.decisions = [replace(d, void=True) for d in ledger.decisions]
        ledger.current = event.version
        ledger.category, ledger.task = data.get("category", ledger.category), data.get("task")
        ledger.versions[event.version] = Version(number=event.version, hash=data["hash"], author=event.actor)
    elif kind == "plan.checked" and event.version in ledger.versions:
        ledger.versions[event.version].check = CheckRecord.from_dict(data)
    elif kind == "plan.approval" or (kind == "plan.approved" and data.get("by") == "auto"):
        ledger.decisions.append(_decision(event, _policy_hash(ledger, event.version)))
    elif kind.startswith("react."):
        _apply_react(ledger, event)
    elif event.step_id is not None:
        _apply_step(ledger, event)
    transition = data.get("transition")
    if isinstance(transition, dict):
        if transition.get("from") != ledger.status:
            ledger.broken.append(
                f"event {event.seq} ({kind}) moves the plan from {transition.get('from')!r}, "
                f"but the events before it leave it {ledger.status!r}"
            )
        ledger.status = transition.get("to")
        if ledger.kind == "react" and ledger.status == "pending_approval" and ledger.pending and event.version:
            _react_version(ledger, event.version)


def _apply_react(ledger: PlanLedger, event: Event) -> None:
    """A ReAct run: who asked, which action waits for approval, which approved actions were carried out."""
    if event.kind == "react.started":  # its category: recorded since resumes are held to it (older runs: none)
        ledger.kind, ledger.requested_by, ledger.category = "react", event.actor, event.data.get("category")
        ledger.task = event.data.get("question")
    elif event.kind == "react.approval_needed":  # its author: who carried the run on to it (older runs: "react")
        data = event.data
        ledger.pending = {"hash": data["hash"], "needs": list(data.get("needs", [])), "author": data.get("author")}
        if "policy_hash" in data:  # the policy a resume keeps (older runs recorded none)
            ledger.pending["policy_hash"] = data["policy_hash"]
    elif event.kind == "react.resumed":
        ledger.resumed.add(str(event.data.get("action_hash")))


def _react_version(ledger: PlanLedger, number: int) -> None:
    assert ledger.pending is not None
    named = [need for need in ledger.pending["needs"] if need != approval.A_PERSON]
    check = CheckRecord(ok=True, policy={"approval": "human", "required_approvals": named})
    ledger.current = number
    author = ledger.pending["author"] or "react"
    ledger.versions[number] = Version(number=number, hash=ledger.pending["hash"], author=author, check=check)


_STEP_STATUS = {
    "step.started": "started",
    "step.succeeded": "succeeded",
    "step.failed": "failed",
    "step.failed_optional": "failed_optional",
    "step.skipped": "skipped",
    "step.outcome_unknown": "outcome_unknown",
    "compensation.step_started": "started",
    "compensation.step_succeeded": "succeeded",
    "compensation.step_failed": "failed",
}


_STEP_WHILE = {
    "step.settled": ("halted", "compensation_incomplete"),
    "compensation.step_settled": ("halted", "compensation_incomplete"),
}
"""Where a step event may happen other than during a run (undo steps: during a rollback)."""


def _apply_step(ledger: PlanLedger, event: Event) -> None:
    assert event.step_id is not None
    status = _STEP_STATUS.get(event.kind)
    if event.kind in ("step.settled", "compensation.step_settled"):
        status = "succeeded" if event.data.get("done") else "failed"
    if status is None:
        return
    undo = event.kind.startswith("compensation.")
    during = _STEP_WHILE.get(event.kind, ("compensating",) if undo else ("running",))
    if ledger.status not in during:
        ledger.broken.append(f"event {event.seq} ({event.kind}) happened while the plan was {ledger.status}")
    step = -event.step_id if undo else event.step_id
    ledger.times[step] = _times(ledger, step, event, status)
    ledger.steps[step] = (status, event.data.get("output") if status == "succeeded" else None)
    ledger.errors[step] = _error(event, status)
    if status == "started":  # the values the call was made with, as resolved
        ledger.params[step] = event.data.get("params")
    elif event.kind == "step.skipped" or event.data.get("before_call"):  # no call made: its row keeps none
        ledger.params.pop(step, None)
    else:
        return  # an outcome: the row keeps its attempt
    ledger.attempts[step] = _attempt(ledger, step, event)


def _times(ledger: PlanLedger, step: int, event: Event, status: str) -> tuple[str | None, str | None]:
    """When the step's row says it started and finished once this event is recorded: a start's time (a call made
    again after a start with no outcome keeps the first one's, and its tool is told it), an outcome's; no call made
    (a skip, a failure before the call), no start; an unknown outcome changes neither."""
    started, finished = ledger.times.get(step, (None, None))
    if status == "started":
        again = ledger.steps.get(step, ("",))[0] == "started"
        return (started if again else event.at), None
    if event.kind == "step.skipped" or event.data.get("before_call"):
        return None, event.at
    return (started, finished) if status == "outcome_unknown" else (started, event.at)


def _error(event: Event, status: str) -> str | None:
    """The error a step's row keeps for this event, written as plangate writes it there."""
    if status in ("started", "succeeded"):
        return None
    if event.kind == "step.skipped":
        return event.data.get("reason")
    if event.kind in ("step.settled", "compensation.step_settled"):
        return recovery.not_done(event.actor, event.data.get("note"))
    return event.data.get("error")


def _attempt(ledger: PlanLedger, step: int, event: Event) -> Attempt:
    """The attempt a step's row records afresh: a start (or a failure before the call) is the next one, a skip none.

    The key and the number are the ones the start recorded; a rollback's starts named no number (the next one),
    and a skip or a failure before the call no key (a step's own).
    """
    before = ledger.attempts.get(step)
    number = 0 if event.kind == "step.skipped" else event.data.get("attempt", (before.attempt if before else 0) + 1)
    key = event.data.get("idempotency_key", idempotency_key(ledger.plan_id, step))
    return Attempt(attempt=number, idempotency_key=key, version=event.version)


def _decision(event: Event, policy_hash: str | None) -> ApprovalRow:
    """A decision as its event records it; an automatic approval's comment is the policy's reasons."""
    auto = event.kind == "plan.approved"
    return ApprovalRow(
        plan_id=event.plan_id or "",
        version=event.version or 0,
        plan_hash=event.data.get("hash", ""),
        policy_hash=policy_hash,
        decision="approved" if auto else event.data.get("decision", "rejected"),
        actor=event.actor,
        role=None if auto else event.data.get("role"),
        kind="auto" if auto else "person",
        comment="; ".join(event.data.get("reasons", ())) if auto else event.data.get("comment"),
        at=event.at,
    )


def _policy_hash(ledger: PlanLedger, number: int | None) -> str | None:
    """The policy a version is held to as it is decided on: its check's (a ReAct action's: its pause's)."""
    if ledger.kind == "react":
        return ledger.pending.get("policy_hash") if ledger.pending else None
    version = ledger.versions.get(number or 0)
    return ((version.check.policy if version and version.check else None) or {}).get("policy_hash")


def problems(
    store: Store, ledger: PlanLedger, row: PlanRow | None = None, version: VersionRow | None = None
) -> list[str]:
    """Every way the stored rows of this plan differ from what its events say (``row``: its plan row,
    and ``version`` a version's row, if read in the same transaction or snapshot)."""
    plan_id = ledger.plan_id
    row = row or store.get_plan(plan_id)
    if row is None:
        return [f"plan {plan_id}: its events exist but its row in plans does not"]
    found: list[str] = [f"plan {plan_id}: {why}" for why in ledger.broken]
    if row.kind != ledger.kind:
        found.append(_differs(plan_id, "kind", row.kind, ledger.kind))
    if ledger.kind == "react":
        return found + _react_problems(store, row, ledger)
    expected = {
        "status": ledger.status,
        "version": ledger.current,
        "requested_by": ledger.requested_by,
        "role": ledger.role,
        "category": ledger.category,
        "tools": ledger.tools,
        "hash": ledger.version.hash if ledger.version else None,
        "purged_at": ledger.purged,
    }
    if ledger.task is not None:  # the line a reviewer reads above the plan
        expected["task"] = ledger.task
    for name, value in expected.items():
        if getattr(row, name) != value:
            found.append(_differs(plan_id, name, getattr(row, name), value))
    for number, told in sorted(ledger.versions.items()):
        stored = version if version is not None and version.version == number else store.get_version(plan_id, number)
        found += _version_problems(store, plan_id, told, stored, ledger.purged)
    found += _approval_problems(store, ledger)
    found += _step_problems(store, ledger)
    return found


def _react_problems(store: Store, row: PlanRow, ledger: PlanLedger) -> list[str]:
    told = [("status", ledger.status), ("version", ledger.current), ("purged_at", ledger.purged)]
    told += [("task", ledger.task)]  # the question the model is set again when the run resumes
    told += [("category", ledger.category)] if ledger.category is not None else []
    found = [
        _differs(ledger.plan_id, name, getattr(row, name), value) for name, value in told if getattr(row, name) != value
    ]
    version = ledger.version
    if version is not None:
        stored = store.get_version(ledger.plan_id, version.number)
        purged = stored is not None and ledger.purged and _purged.body_purged_at(stored.body) == ledger.purged
        if (
            stored is None
            or (hashlib.sha256(stored.body.encode()).hexdigest() != version.hash and not purged)
            or row.hash != version.hash
        ):
            found.append(f"plan {ledger.plan_id} v{version.number}: the pending action's text or hash was changed")
        elif ledger.pending is not None and "policy_hash" in ledger.pending:
            where, named = f"plan {ledger.plan_id} v{version.number}", ledger.pending["policy_hash"]
            found += _policy_problems(store, where, stored.policy_hash, named, "its approval_needed event")
    return found + _approval_problems(store, ledger)


def right_to_resume(store: Store, run: PlanRow) -> PlanLedger:
    """A ReAct run's story (its events, and the approvals that stand), if its pending action may be carried out
    now; else a refusal saying why."""
    told = story(store, run, "go on")
    version = told.version
    if told.status != "approved" or version is None:
        raise GovernanceError(f"ReAct run {run.id} has no approved action waiting (the audit log says {told.status})")
    if version.hash in told.resumed:
        raise GovernanceError(f"ReAct run {run.id}: its approved action was already carried out")
    needs = told.needs()
    if needs:
        raise GovernanceError(
            f"ReAct run {run.id}: its pending action still needs approval by {' and by '.join(needs)}"
        )
    return told


def _step_problems(store: Store, ledger: PlanLedger) -> list[str]:
    rows = ledger.rows = store.steps(ledger.plan_id)
    found: list[str] = []
    for step_id in sorted(rows.keys() | ledger.steps.keys()):
        row, told = rows.get(step_id), ledger.steps.get(step_id)
        where = f"plan {ledger.plan_id} step {step_id}"
        if row is None:
            found.append(
                f"{where}: the audit log records it {told[0] if told else ''}, but its row in steps is missing"
            )
        elif told is None:
            found.append(f"{where}: a row in steps ({row.status}) that no audit event records")
        elif row.status != told[0]:
            found.append(f"{where}: steps.status is {row.status!r}, but the audit log says {told[0]!r}")
        elif not same_json(row.output, told[1]):  # only a success has one: a failure, optional or not, gives none
            found.append(f"{where}: steps.output differs from the output the audit log recorded")
        elif not same_json(row.params, ledger.params.get(step_id)):  # what a rollback undoes with
            found.append(f"{where}: steps.params differs from the parameters the audit log recorded")
        elif row.error != (None if ledger.purged else ledger.errors.get(step_id)):  # a purge removed both
            found.append(f"{where}: steps.error differs from the error the audit log recorded")
        elif differs := _attempt_differs(row, ledger.attempts.get(step_id), _held_times(ledger, step_id)):
            found.append(f"{where}: {differs}")
    return found


def _held_times(ledger: PlanLedger, step_id: int) -> dict[str, str | None]:
    """When the log says the step started and finished, for its row to be held to. Not an undo's (negative
    ids): releases before this one wrote an undo's row and its events at moments read apart, so a rollback
    they recorded would read as edited."""
    started, finished = ledger.times.get(step_id, (None, None))
    return {"started_at": started, "finished_at": finished} if step_id > 0 else {}


def _attempt_differs(row: StepRow, told: Attempt | None, times: dict[str, str | None]) -> str | None:
    """Which column of a step's attempt (its number, key, plan version) or of when it started and finished
    (``times``, where held) differs from the audit log, if one does."""
    logged = {column: getattr(told, column, None) for column in ("attempt", "idempotency_key", "version")}
    for column, value in {**logged, **times}.items():
        stored = getattr(row, column)
        if not same_json(stored, value):
            return f"steps.{column} is {stored!r}, but the audit log says {value!r}"
    return None


def _version_problems(
    store: Store, plan_id: str, version: Version, row: VersionRow | None, purged: str | None
) -> list[str]:
    where = f"plan {plan_id} v{version.number}"
    if row is None:
        return [f"{where}: the version's row in plan_versions is missing"]
    found: list[str] = []
    if row.hash != version.hash:
        stored, logged = approval.apart(row.hash, version.hash)
        found.append(f"{where}: plan_versions.hash is {stored}, the audit log says {logged}")
    body_hash = hashlib.sha256(row.body.encode()).hexdigest()  # the canonical text is what was hashed
    if purged is not None and _purged.body_purged_at(row.body) == purged:
        pass  # the text was purged, as the plan's sealed events say: its hash stays on record
    elif body_hash != version.hash:
        hashed, approved = approval.apart(body_hash, version.hash)
        found.append(
            f"{where}: the stored plan text hashes to {hashed}, not to its approved hash {approved}: "
            "the plan text was changed"
        )
    if row.author != version.author:
        found.append(f"{where}: plan_versions.author is {row.author!r}, the audit log says {version.author!r}")
    recorded = (version.check.policy if version.check else None) or {}
    found += _policy_problems(store, where, row.policy_hash, recorded.get("policy_hash"), "its check event")
    if version.check is not None and row.check != version.check:
        found.append(f"{where}: plan_versions.check_result differs from its check event")
    return found


def _policy_problems(store: Store, where: str, stored: str | None, named: str | None, by: str) -> list[str]:
    """The policy a version names (``stored``) must be the one its event names (``by`` says which), and its
    stored text must hash to that name: a run, or a resumed ReAct run, is held to that policy."""
    found: list[str] = []
    if stored != named:
        found.append(f"{where}: plan_versions.policy_hash does not match the policy named by {by}")
    if stored is not None:
        text = store.policy_text(stored)
        if text is None or hashlib.sha256(text.encode()).hexdigest() != stored:
            found.append(f"{where}: the stored text of policy {stored[:12]}… is missing or was changed")
    return found


def _approval_problems(store: Store, ledger: PlanLedger) -> list[str]:
    def key(a: ApprovalRow) -> tuple[Any, ...]:
        return (a.version, a.plan_hash, a.decision, a.actor, a.role if a.kind == "person" else None, a.kind, a.void)

    rows = sorted(key(a) for a in store.approvals(ledger.plan_id))
    events = sorted(key(a) for a in ledger.decisions)
    if rows == events:
        return []
    extra = [r for r in rows if r not in events]
    missing = [e for e in events if e not in rows]
    what = "; ".join(
        [f"a row with no event: {r[3]} {r[2]} v{r[0]}" for r in extra]
        + [f"an event with no row: {e[3]} {e[2]} v{e[0]}" for e in missing]
    )
    return [f"plan {ledger.plan_id}: the approvals table does not match the audit log ({what})"]


def _differs(plan_id: str, column: str, row: Any, events: Any) -> str:
    return f"plan {plan_id}: plans.{column} is {row!r}, but the audit log says {events!r}"


def story(store: Store, plan: PlanRow, doing: str = "run", version: VersionRow | None = None) -> PlanLedger:
    """The plan's story from its verified events, once every stored row of it agrees; else a refusal.

    Whatever acts on a plan (a run, a settlement, a rollback) starts from this, so nothing
    changed in the store outside plangate decides what happens. Read as one snapshot, so a
    run going on meanwhile is never mistaken for a change made outside plangate.
    """
    with store.snapshot():
        return _story(store, plan, doing, version)


def _story(store: Store, plan: PlanRow, doing: str, version: VersionRow | None) -> PlanLedger:
    events, broken = store.plan_events(plan.id)
    if broken is not None:
        raise GovernanceError(f"plan {plan.id} may not {doing}: its audit events do not verify: {broken}")
    told = fold(plan.id, events)
    told.events = events
    found = problems(store, told, plan, version)
    if found:
        raise GovernanceError(f"plan {plan.id} may not {doing}: {first_problem(plan.id, found)}; nothing was done")
    return told


def first_problem(plan_id: str, found: list[str]) -> str:
    """The first of a plan's problems without the plan's name, and how many more there are."""
    more = f" (and {len(found) - 1} more; see plangate audit verify)" if len(found) > 1 else ""
    return found[0].removeprefix(f"plan {plan_id}: ").removeprefix(f"plan {plan_id} ") + more


def right_to_run(store: Store, plan: PlanRow, version: VersionRow) -> tuple[Plan, PlanLedger]:
    """The exact plan that may run now and its story, or a refusal that names what does not match.

    The plan's events must be intact, the stored rows must agree with them, the stored
    text must hash to the version's hash, and the approvals in the log must cover that hash.
    """
    told = story(store, plan, version=version)
    body = Plan.parse(version.body)
    needs = told.needs()
    if needs:
        raise GovernanceError(
            f"plan {plan.id} may not run: the audit log holds no approval of v{version.version} "
            f"({version.hash[:12]}…) that lets it run; it needs {' and '.join(needs)}"
        )
    return body, told


def verify(store: Store, anchor: tuple[int, str] | None = None) -> AuditReport:
    """The whole story: the chain (see :meth:`Store.verify_audit`), then every plan's rows held against it.

    Read as one snapshot, so a store in use is not mistaken for a changed one.
    """
    with store.snapshot():
        return _verify(store, anchor)


def _verify(store: Store, anchor: tuple[int, str] | None) -> AuditReport:
    report = store.verify_audit(anchor)
    if not report.ok:
        return report
    told = [r[0] for r in store.query("SELECT DISTINCT plan_id FROM events WHERE plan_id IS NOT NULL ORDER BY 1")]
    known = set(told)
    found = [
        f"plan {row.id}: a row in plans that no audit event records"
        for row in store.list_plans(limit=10**9)
        if row.id not in known
    ]
    for plan_id, events, broken in store.plans_events(told):  # each plan's own chain and seal, then its rows
        found += [f"plan {plan_id}: {broken}"] if broken else problems(store, fold(plan_id, events))
    return replace(report, ok=not found, tables=tuple(found))


def confirm_purge(store: Store, plan: PlanRow) -> None:
    """Refuse a plan whose row says it was purged unless its verified events record that purge.

    ``plans.purged_at`` and a purged plan text can be written by anyone who can write the
    database; only the sealed markers in the plan's events prove a purge. Without this, a
    plan made to look purged would have its text hidden from ``show`` and be skipped by replay.
    """
    if plan.purged_at is None:
        return
    events, broken = store.plan_events(plan.id)
    if broken is not None:
        raise GovernanceError(f"plan {plan.id}'s audit events do not verify ({broken}); see plangate audit verify")
    recorded = fold(plan.id, events).purged
    if recorded != plan.purged_at:
        said = f"a purge on {recorded}" if recorded else "no purge"
        raise GovernanceError(
            f"plan {plan.id}: plans.purged_at says its payloads were purged on {plan.purged_at}, but its audit log "
            f"records {said}: the store was changed outside plangate; see plangate audit verify"
        )
