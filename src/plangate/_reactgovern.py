"""A ReAct action held to the policy: role, scopes, deny, sequence and sink rules, the register's holds, and the
approval an action that writes needs (the run pauses, a person approves the exact action). Part of
:class:`plangate.react.ReActAgent`."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

from plangate import (
    approval,
    lifecycle,
    metrics,
    names,
    provenance,
    references,
)
from plangate._clock import iso
from plangate._reactrecord import ReActBase, hashed
from plangate._reactstate import Act, ReActStep, RunState
from plangate.plan import Plan, canonical
from plangate.policy import SinkHit
from plangate.register import Register
from plangate.store import CheckRecord, VersionRow
from plangate.tools import Tool
from plangate.violations import Violation


class Governing(ReActBase):
    """Each action through the policy (part of :class:`plangate.react.ReActAgent`)."""

    def _govern(self, state: RunState, act: Act, tool: Tool, *, approved: bool = False) -> ReActStep | None:
        """The policy's word on this action: refused (a step to observe), paused, or None (go).

        ``approved``: a person approved this exact action; it is still refused by what the
        policy forbids, and by a named approval the policy asks for now that the approvals on
        record do not give, but not paused again.
        """
        if self.policy is None:
            return self._pause(state, act, tool, ["a person"], {}) if tool.effect != "read" and not approved else None
        current = {"number": act.number, "tool": act.tool, "arguments": act.arguments, "thought": act.thought}
        plan = Plan.model_construct(
            task=state.question,
            category=state.category,
            steps=[as_step(s) for s in [*state.actions, current]],
            schema_version=1,
        )
        evaluate = self.policy.evaluate
        decision, *others = [evaluate(plan, self.catalogue, user=u, role=r) for u, r in self._rights(state)]
        violations = dict.fromkeys(v for d in (decision, *others) for v in d.violations)  # the stricter holds
        hits = self._sink_hits(state, plan.steps[-1], tool)
        mine = [v for v in violations if v.step in (act.number, None)] + [
            Violation(rule=f"sink:{hit.rule.name}", message=hit.text(), step=act.number, source="policy")
            for hit in hits
            if hit.rule.outcome == "deny"
        ]
        if mine:
            metrics.violations(mine)
            state.violations += len(mine)
            self._event(state, "react.refused", act.number, {"violations": [v.to_dict() for v in mine]})
            return ReActStep(
                number=act.number,
                kind="refused",
                observation="Error: refused by the policy: " + "; ".join(str(v) for v in mine),
            )
        held = [hit.rule for hit in hits if hit.rule.outcome == "approve"]
        named = [role for step, role in decision.step_approvals if step == act.number]
        required = list(dict.fromkeys([*named, *(rule.approve for rule in held if rule.approve is not None)]))
        if approved:
            return self._lacking(state, act, required)
        cleared = not held and (decision.approval == "auto" or self.policy.auto_approves(state.category, tool))
        on_hold = self._kept(state, functools.partial(self._hold, state), lambda: False) if cleared else None
        cleared = cleared and on_hold is None  # governance holds the category for people
        person = not cleared and (tool.effect != "read" or any(rule.approve is None for rule in held))
        needs = (["a person"] if person else []) + required
        if needs:
            why = {"reasons": [on_hold]} if on_hold is not None else {}
            return self._pause(state, act, tool, needs, {"approval": "human", "required_approvals": required, **why})
        return None

    def _hold(self, state: RunState) -> str | None:
        """Why the auto-approval register holds the run's category for people (None: it does not)."""
        return Register(self.store, self.clock).holding(state.category)

    def _rights(self, state: RunState) -> list[tuple[str, str | None]]:
        """Whose rights an action is held to: those of who asked (in the role the policy gives them) and, when
        someone else carries the run on, that person's too. The stricter holds: resuming never widens what
        the run may do, nor lets the resumer act beyond their own rights."""
        if names.canonical(state.requested_by) == names.canonical(self.user):
            return [(self.user, self.role)]
        return [(state.requested_by, None), (self.user, self.role)]

    def _sink_hits(self, state: RunState, step: Any, tool: Tool) -> list[SinkHit]:
        """The sink rules this action's parameters meet. The model chose every one of them, and the action
        itself, after reading what the actions taken so far returned: once one of them gave untrusted
        text, each parameter (and whether the action runs at all) takes data from it."""
        assert self.policy is not None
        read = provenance.union(
            (provenance.Origin(a["number"], a["tool"], True),)
            for a in state.actions
            if (taken := self.catalogue.get(a["tool"])) is not None and taken.untrusted_output
        )
        if not read:
            return []
        through = ("the model's turns, which read it",)
        flow = provenance.StepFlow(
            params={name: provenance.ParamFlow(name, read, literal=True, refs=through) for name in step.params},
            control=read,
        )
        return self.policy.sink_hits(step, tool, flow)

    def _lacking(self, state: RunState, act: Act, required: list[str]) -> ReActStep | None:
        """An approved action, held to the named approvals the policy in force asks for: the approvals on
        record must give each, by someone that policy still gives the role (as a plan held against a changed
        policy). Else it does not run, and the model reads why."""
        decision = {"approval": "human", "required_approvals": required}
        missing = approval.missing(decision, state.approved_by, self.policy)
        if not missing:
            return None
        self._event(state, "react.refused", act.number, {"violations": [], "needs": missing})
        return ReActStep(
            number=act.number,
            kind="refused",
            observation=(
                f"Error: refused by the policy: it now needs approval by {' and by '.join(missing)}, which the "
                "approval of this action does not give"
            ),
        )

    def _pause(self, state: RunState, act: Act, tool: Tool, needs: list[str], decision: dict[str, Any]) -> ReActStep:
        action = {
            "run": state.run_id,
            "number": act.number,
            "thought": act.thought,
            "tool": tool.name,
            "arguments": act.arguments,
        }
        body = canonical(action)
        digest = hashed(body)
        now = iso(self.clock.now())

        def record() -> None:
            with self.store.transaction():
                self.store.lock_log()
                row = self._held(state)
                if self.policy is not None:
                    self.store.save_policy(self.policy.hash, self.policy.name, self.policy.canonical_json())
                version = row.version + 1
                self.store.insert_version(
                    VersionRow(
                        plan_id=state.run_id,
                        version=version,
                        hash=digest,
                        body=body,
                        author=self.user,  # who carried the run on to it: it may not approve it
                        created_at=now,
                        check=CheckRecord(ok=True, policy=decision or {"approval": "human"}, action=action),
                        policy_hash=self.policy.hash if self.policy else None,
                    )
                )
                self.store.update_plan(state.run_id, version=version, hash=digest, updated_at=now)
                self._append(
                    state,
                    "react.approval_needed",
                    act.number,
                    {
                        "tool": tool.name,
                        "effect": tool.effect,
                        "arguments": act.arguments,
                        "hash": digest,
                        "needs": needs,
                        "author": self.user,
                        "policy_hash": self.policy.hash if self.policy else None,  # the one a resume keeps
                    },
                    fenced=False,  # the move below holds the run
                )
                lifecycle.move(
                    self.store,
                    replace(row, version=version, hash=digest),
                    "pending_approval",
                    actor=self.user,
                    at=now,
                    held_by=state.owner,
                )

        self._kept(state, record, lambda: self._newest_is(state, "plan.pending_approval", None, {}))
        state.status, state.pending_hash = "paused", digest
        why = "".join(f"; {reason}" for reason in decision.get("reasons", ()))
        state.reason = f"paused: {tool.name} ({tool.effect}) needs approval by {' and by '.join(needs)}{why}"
        return ReActStep(
            number=act.number,
            kind="paused",
            thought=act.thought,
            tool=tool.name,
            arguments=act.arguments,
            observation=state.reason,
            call_id=act.call_id,
        )


def as_step(action: dict[str, Any]) -> Any:
    """An action as a plan's step, for the policy: its arguments are given to the tool as they are, so
    they are written as plan text that means them literally (a ``${`` in them is no reference)."""
    from plangate.plan import Step

    return Step.model_construct(
        id=action["number"],
        tool=action["tool"],
        params=references.literal(action["arguments"]),
        rationale=action.get("thought") or "ReAct action",
        expected_output="any",
        condition=None,
        rollback=None,
    )
