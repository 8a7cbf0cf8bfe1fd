"""The audit trail told as a story: one line per event, in plain words."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from plangate import _purged
from plangate._overrides import told_origin
from plangate.store import Event

Teller = Callable[[dict[str, Any], int | None], str]


def tell(events: Iterable[Event]) -> list[str]:
    """Readable lines for a plan's events, oldest first."""
    return [f"#{e.seq:<4} {e.at[11:23]}  {e.actor:<16} {describe(e)}" for e in events]


def describe(event: Event) -> str:
    data, step = _purged.shown(event.data), event.step_id
    teller = _TELLERS.get(event.kind)
    if teller is not None:
        return teller(data, step)
    return f"{event.kind} {_short(data)}"


def _submitted(d: dict[str, Any], _: int | None) -> str:
    via = f" via {d['via']}" if d.get("via") else ""
    return f"submitted {d['task']!r} ({d['category']}, {d['steps']} steps, hash {d['hash'][:12]}){via}"


def _checked(d: dict[str, Any], _: int | None) -> str:
    verdict = (
        "ok"
        if d["ok"]
        else f"{len(d['violations'])} violation(s): "
        + "; ".join(
            f"step {v['step']}: {v['rule']}" if v["step"] is not None else v["rule"] for v in d["violations"][:3]
        )
    )
    policy = d.get("policy")
    if policy:
        verdict += f"; policy {policy['policy']!r} says {policy['approval']}"
        if policy["required_approvals"]:
            verdict += f" + {', '.join(policy['required_approvals'])}"
    return f"checked: {verdict}"


def _approval(d: dict[str, Any], _: int | None) -> str:
    role = f" ({d['role']})" if d.get("role") else ""
    comment = f": {d['comment']!r}" if d.get("comment") else ""
    rest = f"; still needs {', '.join(d['still_needs'])}" if d.get("still_needs") else ""
    return f"{d['decision']}{role} hash {d['hash'][:12]}{comment}{rest}"


def _provenance(d: dict[str, Any]) -> str:
    """Where the step's values came from, when the event says: ``; from step:1: iban (UNTRUSTED)``."""
    fed = d.get("provenance") or {}
    untrusted = set(d.get("untrusted") or ())
    parts = [
        f"{name} from {', '.join(sources)}" + (" (UNTRUSTED)" if name in untrusted else "")
        for name, sources in fed.items()
    ]
    if d.get("control"):
        parts.append(f"its condition reads {', '.join(d['control'])}")
    return f"; {'; '.join(parts)}" if parts else ""


def _step(verb: str) -> Teller:
    def tell_step(d: dict[str, Any], step: int | None) -> str:
        if verb == "started":
            origin = told_origin(d)
            via = f" ({origin})" if origin else ""
            told = f"step {step} {d['tool']}{via} started (attempt {d['attempt']}) with {_short(d['params'])}"
            return told + _provenance(d)
        if verb == "succeeded":
            return f"step {step} succeeded in {d['ms']:.1f} ms: {_short(d['output'])}"
        if verb == "failed":
            return f"step {step} FAILED: {d['error']}"
        if verb == "failed_optional":
            return f"step {step} failed, and is optional (on_failure: continue): its output is null: {d['error']}"
        return f"step {step} {verb}: {d.get('reason') or d.get('error')}"

    return tell_step


_TELLERS: dict[str, Teller] = {
    "plan.submitted": _submitted,
    "plan.checked": _checked,
    "plan.planned": lambda d, _: (
        f"planned from template {d['template']!r} with {d['slots']}"
        if d["source"] == "library"
        else f"planned by {d['model']}: {d['input_tokens']} in / {d['output_tokens']} out "
        f"({d['thinking_tokens']} thinking) tokens, budget {d['budget']}, "
        + (f"{d['cost_usd']:.4f} USD" if d["cost_usd"] is not None else "cost unknown")
        + f", {d['calls']} call(s), {d['seconds']:.1f} s"
    ),
    "plan.approval": _approval,
    "plan.pending_approval": lambda d, _: (  # a ReAct run's pause names its needs in react.approval_needed
        "waiting for approval" + (f" by {' and by '.join(d['needs'])}" if d.get("needs") else "")
    ),
    "plan.approved": lambda d, _: (
        "APPROVED" + (" automatically: " + "; ".join(d["reasons"]) if d["by"] == "auto" else "")
    ),
    "plan.rejected": lambda d, _: (
        "REJECTED"
        + (f" by the checker ({d['violations']} violations)" if d["by"] == "check" else f": {d.get('comment')!r}")
    ),
    "plan.edited": lambda d, _: (
        f"edited: new version (hash {d['hash'][:12]}), {d['approvals_voided']} approval(s) void"
    ),
    "plan.closed": lambda d, _: f"CLOSED: {d['reason']!r}; it will not be resumed",
    "run.started": lambda d, _: f"run started ({d['steps']} steps)",
    "run.resumed": lambda d, _: "run resumed: finished steps are kept, not run again",
    "run.succeeded": lambda d, _: (
        f"run SUCCEEDED ({d['steps']} steps" + (f", skipped {d['skipped']})" if d["skipped"] else ")")
    ),
    "run.halted": lambda d, step: f"run HALTED at step {d.get('step', step)} ({d['tool']}): {d['error']}",
    "run.refused": lambda d, _: f"run HALTED where it was cut off, not resumed: {d['error']}",
    "step.started": _step("started"),
    "step.succeeded": _step("succeeded"),
    "step.failed": _step("failed"),
    "step.failed_optional": _step("failed_optional"),
    "step.skipped": _step("skipped"),
    "step.retrying": _step("retrying"),
    "step.outcome_unknown": _step("outcome unknown"),
    "account.changed": lambda d, _: _account(d),
    "compensation.started": lambda d, _: f"ROLLBACK started: {d['reason']!r}",
    "compensation.step_started": lambda d, step: f"undo of step {step} started: {d['tool']} with {_short(d['params'])}",
    "compensation.step_succeeded": lambda d, step: f"step {step} UNDONE: {_short(d['output'])}",
    "compensation.step_failed": lambda d, step: f"the undo of step {step} FAILED: {d['error']}",
    "compensation.finished": lambda d, _: (
        f"rollback finished: {d['status']}; undone steps {d['undone'] or 'none'}"
        + "".join(f"; step {s} cannot be undone: {why}" for s, why in d["not_undoable"])
        + "".join(f"; step {s}'s undo failed: {error}" for s, error in d["failed"])
    ),
    "compensation.step_settled": lambda d, step: (
        f"the undo of step {step} ({d.get('tool')}) SETTLED by a person as "
        + (f"done, with the output they saw: {_short(d.get('output'))}" if d["done"] else "not done")
        + (f" ({d['note']})" if d.get("note") else "")
    ),
    "step.settled": lambda d, step: (
        f"step {step} ({d.get('tool')}) SETTLED by a person as "
        + (f"done, with the output they saw: {_short(d.get('output'))}" if d["done"] else "not done")
        + (f" ({d['note']})" if d.get("note") else "")
    ),
}


def _account(d: dict[str, Any]) -> str:
    change = d["change"]
    if change == "saved":
        categories = f" for {', '.join(d['categories'])}" if d["categories"] else ""
        return f"account {d['name']} saved: {d['role']}{categories}" + (", password set" if d["password"] else "")
    if change == "token.issued":
        return f"token {d['token']} ({d['label']!r}) issued to {d['name']}, expires {d['expires_at']}"
    if change == "token.revoked":
        return f"token(s) {', '.join(d['tokens'])} of {d['name']} revoked"
    return f"account {d['name']} {change}"


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."
