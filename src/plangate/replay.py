"""Replay: the engine's decisions made again over a plan's recorded outputs, and held against its audit log.

No tool is called. For every run of the plan (the first, each resume) and its rollback,
in the order the audit log records them, each step's decision is made again by the very
function the engine makes it with (:func:`plangate._decide.decide`: skipped input, the
condition, references resolved against the recorded outputs, an optional step that failed
read as null, validation against the tool's schema, the policy's deny and require rules),
and each is compared with what was recorded: the parameters a step started with, why it
was skipped or refused, that it started only after what it waits for was done
(:func:`plangate.graph.run_deps`), why the run halted, an undo's parameters. The stored
rows are held against the log too (:func:`plangate.ledger.problems`).

Given other tools or another policy, the same replay answers the incident question: what
would have gone differently (a step refused by a new deny rule, a recorded parameter the
changed schema no longer accepts, a changed effect that changes the approval needed).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from plangate import answer, drift, ledger, provenance, results
from plangate._decide import SKIPPED, Decision, decide
from plangate._overrides import governed
from plangate.compensation import undo_params
from plangate.errors import GovernanceError, NotFoundError, UsageError, quoted_id
from plangate.graph import run_deps
from plangate.plan import Plan
from plangate.policy import Policy
from plangate.store import Event, PlanRow, Store
from plangate.tools import Catalogue

_RUN_START = ("run.started", "run.resumed")
_RUN_END = ("run.succeeded", "run.halted", "run.refused")


@dataclass(frozen=True, kw_only=True)
class Divergence:
    """One thing the replay worked out differently from the record: where, what, and both values."""

    run: int
    """Which run (1: the first, 2: the first resume...); 0 for what is not one run's (rows, the check)."""
    step: int | None
    what: str
    recorded: Any
    derived: Any
    detail: str = ""

    def __str__(self) -> str:
        where = f"step {self.step}" if self.step is not None else "plan"
        run = f" (run {self.run})" if self.run else ""
        text = f"{where}{run}: {self.what}: recorded {_show(self.recorded)}, re-derived {_show(self.derived)}"
        return f"{text} ({self.detail})" if self.detail else text

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "step": self.step,
            "what": self.what,
            "recorded": self.recorded,
            "derived": self.derived,
            "detail": self.detail,
            "text": str(self),
        }


@dataclass(frozen=True, kw_only=True)
class ReplayResult:
    """What a replay found: how many decisions it made again, and every divergence, first first."""

    plan_id: str
    version: int
    runs: int
    decisions: int
    divergences: tuple[Divergence, ...] = ()
    against: tuple[str, ...] = ()
    """What the replay used instead of the record (other tools, another policy); empty: the record."""

    @property
    def ok(self) -> bool:
        return not self.divergences

    def __str__(self) -> str:
        basis = f" against {' and '.join(self.against)}" if self.against else ""
        head = f"plan {self.plan_id} v{self.version}: {self.runs} run(s), {self.decisions} decision(s) replayed{basis}"
        if self.ok:
            return f"{head}: every one matches the record"
        lines = [f"{head}: {len(self.divergences)} divergence(s)"]
        return "\n".join([*lines, *(f"  {d}" for d in self.divergences)])

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan_id": self.plan_id,
            "version": self.version,
            "ok": self.ok,
            "runs": self.runs,
            "decisions": self.decisions,
            "against": list(self.against),
            "divergences": [d.to_dict() for d in self.divergences],
        }


def replay(
    store: Store,
    plan_id: str,
    catalogue: Catalogue,
    policy: Policy | None = None,
    *,
    against: Sequence[str] = (),
) -> ReplayResult:
    """Replay plan ``plan_id``'s runs over ``catalogue``, calling no tool.

    ``policy``: the policy to hold each step against; None, the policy each run was under,
    as the audit log records it. ``against`` names what differs from the record, for the report.
    """
    row = store.get_plan(plan_id)
    if row is None:
        raise NotFoundError(f"no plan {quoted_id(plan_id)}")
    if row.kind == "react":
        raise UsageError(f"{plan_id} is a ReAct run, not a plan: replay runs over plans")
    ledger.confirm_purge(store, row)  # only a purge the audit log records excuses a plan from replay
    if row.purged_at is not None:
        raise UsageError(
            f"plan {plan_id}'s payloads were purged on {row.purged_at} (retention): its parameters and outputs "
            "are gone, so there is nothing to replay; its decisions and hashes remain in `plangate trace`"
        )
    with store.snapshot():
        events, broken = store.plan_events(plan_id)
        if broken is not None:
            raise GovernanceError(f"plan {plan_id}'s audit events do not verify ({broken}): nothing to replay")
        if not any(e.kind in _RUN_START for e in events):
            raise UsageError(f"plan {plan_id} never ran: there is nothing to replay")
        state = _Replay(store, row, events, catalogue, policy)
        state.go()
        told = ledger.fold(plan_id, events)
        rows = [
            Divergence(run=0, step=None, what="stored rows", recorded="the audit log", derived=p, detail="")
            for p in ledger.problems(store, told, row)
        ]
        found = [*state.found, *state.recheck(told), *rows]
    return ReplayResult(
        plan_id=plan_id,
        version=state.version,
        runs=state.runs,
        decisions=state.decisions,
        divergences=tuple(found),
        against=tuple(against),
    )


_PROVENANCE = ("provenance", "untrusted", "control")
"""What a ``step.started`` event says of where the step's values come from."""


@dataclass
class _Replay:
    """The state a replay carries through the log: outputs, optional failures, the run it is in."""

    store: Store
    row: PlanRow
    events: list[Event]
    catalogue: Catalogue
    policy: Policy | None
    outputs: dict[int, Any] = field(default_factory=dict)
    nulls: set[int] = field(default_factory=set)
    called: dict[int, Any] = field(default_factory=dict)
    """Each started step's parameters, as the engine's decision resolves them again."""
    found: list[Divergence] = field(default_factory=list)
    runs: int = 0
    decisions: int = 0
    version: int = 0
    plan: Plan | None = None
    run_policy: Policy | None = None
    deps: dict[int, frozenset[int]] = field(default_factory=dict)
    halt: tuple[int, str] | None = None
    flows: provenance.Provenance = provenance.EMPTY

    def go(self) -> None:
        for index, event in enumerate(self.events):
            if event.kind in _RUN_START:
                self._start(index, event)
            elif event.kind in _RUN_END:
                self._end(event)
            elif event.kind == "step.settled" and event.step_id is not None:
                self._settled(event)
            elif event.kind == "compensation.step_started" and event.step_id is not None:
                self._undo(event)
            elif event.step_id is not None and event.kind.startswith("step.") and self.plan is not None:
                self._step(event)

    # -- a run begins and ends ---------------------------------------------------------------
    def _start(self, index: int, event: Event) -> None:
        self.runs += 1
        self.version = event.version or self.row.version
        told = ledger.fold(self.row.id, self.events[:index])
        version = self.store.get_version(self.row.id, self.version)
        if version is None:
            raise NotFoundError(f"plan {self.row.id} has no version {self.version}")
        self.plan = Plan.parse(version.body)
        recorded = told.versions.get(self.version)
        if recorded is not None and recorded.hash != self.plan.hash:
            self._diverge(None, "plan text", recorded.hash, self.plan.hash, "the stored text of the version changed")
        check = recorded.check if recorded else None
        policy_hash = (check.policy or {}).get("policy_hash") if check else None
        self.run_policy = self.policy or Policy.recorded(self.store, policy_hash)
        self.flows = provenance.analyse(self.plan, governed(self.catalogue, self.run_policy))  # trust as it ran
        self.deps = run_deps(self.plan, lambda name: self.catalogue[name].effect if name in self.catalogue else None)
        transition = event.data.get("transition") or {}
        if transition.get("from") != "running":  # a run taken over halts on what its predecessor failed
            self.halt = None

    def _end(self, event: Event) -> None:
        if self.plan is None:
            return
        if event.kind == "run.halted":
            recorded = (event.data.get("step"), event.data.get("error"))
            derived = self.halt or (None, "no step failed")
            if recorded != derived:
                self._diverge(event.data.get("step"), "halt", list(recorded), list(derived), "why the run halted")
        elif event.kind == "run.refused":
            pass  # a cut-off run the checker refused to go on with: what its steps recorded stands as it is
        else:
            missing = [s.id for s in self.plan.steps if s.id not in self.outputs]
            if self.halt is not None or missing:
                why = f"step {self.halt[0]} failed" if self.halt else f"steps {missing} never finished"
                self._diverge(None, "run end", "succeeded", "halted", why)
            skipped = [s.id for s in self.plan.steps if self.outputs.get(s.id) is SKIPPED]
            if event.data.get("skipped", skipped) != skipped:
                self._diverge(None, "skipped steps", event.data.get("skipped"), skipped, "")
            self._answer(event, skipped)
        self.plan = None

    def _answer(self, event: Event, skipped: list[int]) -> None:
        """The answer rendered again over the recorded outputs, with its provenance, against the record."""
        assert self.plan is not None
        done = {s: v for s, v in self.outputs.items() if v is not SKIPPED}
        derived = answer.event_data(answer.render(self.plan, done, self.nulls, skipped, self.flows))
        for key in ("answer", "answer_provenance"):
            if event.data.get(key) != derived.get(key):
                self._diverge(None, key, event.data.get(key), derived.get(key), "the plan's answer")

    # -- one step's events -------------------------------------------------------------------
    def _step(self, event: Event) -> None:
        sid, data, kind = event.step_id, event.data, event.kind
        assert sid is not None and self.plan is not None
        if kind == "step.started":
            self._decided(event, "start", data.get("params"))
        elif kind == "step.skipped":
            self._decided(event, "skip", data.get("reason"))
            self.outputs[sid] = SKIPPED
        elif kind == "step.failed" and data.get("before_call"):
            self._decided(event, "fail", data.get("error"))
            self.halt = self.halt or (sid, str(data.get("error")))
        elif kind in ("step.failed", "step.outcome_unknown"):
            self.halt = self.halt or (sid, str(data.get("error")))
        elif kind == "step.succeeded":
            self.outputs[sid] = data.get("output")
        elif kind == "step.failed_optional":
            self._optional(sid)
            self.outputs[sid] = None
            self.nulls.add(sid)

    def _decided(self, event: Event, action: str, recorded: Any) -> None:
        """The decision made again before the step's call, against what the log says was decided."""
        assert event.step_id is not None and self.plan is not None
        self.decisions += 1
        step = self.plan.step(event.step_id)
        if step.tool not in self.catalogue:
            self._diverge(step.id, "tool", step.tool, None, f"{step.tool!r} is not in the catalogue")
            return
        waits = sorted(d for d in self.deps.get(step.id, ()) if d not in self.outputs)
        if waits:
            self._diverge(step.id, "order", f"{action} before steps {waits} finished", f"wait for steps {waits}", "")
        flow = self.flows.of(step.id)
        made = decide(step, self.catalogue[step.tool], self.run_policy, self.outputs, self.nulls, flow=flow)
        derived = made.params if made.action == "start" else made.reason
        if made.action == "start":
            self.called[step.id] = made.params
        if made.action != action:
            what, detail = _what_differs(made, step.id)
            self._diverge(step.id, what, _as(action, recorded), _as(made.action, derived), detail)
        elif derived != recorded:
            what = "params" if action == "start" else f"{action} reason"
            self._diverge(step.id, what, recorded, derived, _first_difference(recorded, derived))
        elif action == "start" and "provenance" in event.data:  # logs written before provenance have none
            told = {k: event.data[k] for k in _PROVENANCE if k in event.data}
            if told != (made.provenance or {}):
                self._diverge(step.id, "provenance", told, made.provenance, "where its values come from")

    def _optional(self, step_id: int) -> None:
        """Only a read may fail quietly (the engine's rule): an optional failure of anything else diverges."""
        assert self.plan is not None
        step = self.plan.step(step_id)
        tool = self.catalogue.get(step.tool)
        if step.on_failure != "continue" or tool is None or tool.effect != "read":
            effect = tool.effect if tool else None
            self._diverge(
                step_id,
                "optional failure",
                "failed_optional",
                "failed",
                f"on_failure {step.on_failure}, effect {effect}: the run would have halted",
            )

    def _settled(self, event: Event) -> None:
        assert event.step_id is not None
        if event.data.get("done"):
            self.outputs[event.step_id] = event.data.get("output")

    def _undo(self, event: Event) -> None:
        """An undo's parameters, found again from the step's recorded output and its own parameters."""
        assert event.step_id is not None
        version = self.store.get_version(self.row.id, event.version or self.row.version)
        if version is None:
            return
        self.decisions += 1
        step = Plan.parse(version.body).step(event.step_id)
        tool = self.catalogue.get(step.tool)
        undo = self.catalogue.get(tool.compensate) if tool and tool.compensate else None
        if undo is None:
            self._diverge(step.id, "undo tool", event.data.get("tool"), None, f"{step.tool} declares no compensation")
            return
        if undo.name != event.data.get("tool"):
            self._diverge(step.id, "undo tool", event.data.get("tool"), undo.name, "")
        derived = undo_params(self.called.get(step.id), self.outputs.get(step.id), undo)
        if derived != event.data.get("params"):
            recorded = event.data.get("params")
            self._diverge(step.id, "undo params", recorded, derived, _first_difference(recorded, derived))

    # -- the check of the version that ran -----------------------------------------------------
    def recheck(self, told: ledger.PlanLedger) -> list[Divergence]:
        """With other tools or another policy: would the plan still pass, and need the same approval?"""
        version = self.store.get_version(self.row.id, self.version)
        if version is None:
            return []
        body = Plan.parse(version.body)
        policy = self.policy or Policy.recorded(self.store, version.policy_hash)
        checked = drift.recheck(self.row, version, body, self.catalogue, policy)
        if checked is None:
            return []
        found: list[Divergence] = []
        if checked.ok != version.check.ok:
            why = drift.first_violation(checked) if not checked.ok else ""
            found.append(
                Divergence(
                    run=0,
                    step=None,
                    what="check",
                    recorded=_passes(version.check.ok),
                    derived=_passes(checked.ok),
                    detail=why,
                )
            )
        before, after = _approval(version.check.policy), _approval(checked.policy)
        if before != after:
            found.append(
                Divergence(
                    run=0,
                    step=None,
                    what="approval",
                    recorded=before,
                    derived=after,
                    detail="the approval the plan would have needed",
                )
            )
        return found

    def _diverge(self, step: int | None, what: str, recorded: Any, derived: Any, detail: str) -> None:
        self.found.append(
            Divergence(run=self.runs, step=step, what=what, recorded=recorded, derived=derived, detail=detail)
        )


def _what_differs(made: Decision, step_id: int) -> tuple[str, str]:
    """What kind of divergence a different decision is, and the sentence an incident report wants."""
    if made.action == "fail" and made.reason.startswith(results.POLICY_REFUSAL):
        rule = made.reason.removeprefix(results.POLICY_REFUSAL).removeprefix(f"step {step_id}: ").split(":")
        return "policy", f"would have been refused by {rule[0]}:{rule[1]} at step {step_id}"
    if made.action == "skip":
        return "skip", f"would have been skipped: {made.reason}"
    if made.action == "fail":
        return "refusal", f"would have failed before its call: {made.reason}"
    return "decision", "would have started"


def _as(action: str, value: Any) -> Any:
    return {"start": "started", "skip": "skipped", "fail": "failed"}[action] + f": {_show(value)}"


def _first_difference(recorded: Any, derived: Any) -> str:
    """The first parameter whose value differs, by name, when both are objects."""
    if isinstance(recorded, dict) and isinstance(derived, dict):
        for name in sorted({*recorded, *derived}):
            if recorded.get(name) != derived.get(name):
                return f"{name}: {_show(recorded.get(name))} -> {_show(derived.get(name))}"
    return ""


def _passes(ok: bool) -> str:
    return "passes" if ok else "does not pass"


def _approval(decision: dict[str, Any] | None) -> str:
    if decision is None:
        return "a person (no policy)"
    needs = decision.get("required_approvals") or []
    return str(decision.get("approval")) + (f" ({', '.join(needs)})" if needs else "")


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
