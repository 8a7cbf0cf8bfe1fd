"""What a reviewer reads about a plan beside its text: each step's effect and rollback, the policy's
reasons, and, once it has run, where each step stands.

One answer for ``plangate show`` (on a local store and through the JSON API, so both print the
same) and for the dashboard's plan and run pages.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from plangate import answer, provenance
from plangate.record import PlanRecord
from plangate.store import Event, StepRow, Store
from plangate.tools import Catalogue

DETAIL = 300
"""How much of a step's output or error the run page and the API show."""


def reasons(record: PlanRecord) -> list[str]:
    """Why the policy wants what it wants of this version (approval by a person, automatic, named roles)."""
    return [str(reason) for reason in (record.decision or {}).get("reasons", ())]


def steps(record: PlanRecord, catalogue: Catalogue | None) -> list[dict[str, Any]]:
    """Each step as a reviewer reads it: its effect (``unknown`` without the tools), rollback and named approvals."""
    named: dict[int, list[str]] = {}
    for step_id, role in (record.decision or {}).get("step_approvals", ()):
        named.setdefault(int(step_id), []).append(str(role))
    out = []
    flows = provenance.analyse(record.plan, catalogue) if record.plan else provenance.EMPTY
    for step in record.plan.steps if record.plan else ():
        tool = catalogue.get(step.tool) if catalogue is not None else None
        out.append(
            {
                "id": step.id,
                "tool": step.tool,
                "effect": tool.effect if tool else "unknown",
                "external": bool(tool and tool.external),
                "params": json.dumps(step.params, indent=1, ensure_ascii=False),
                "rationale": step.rationale,
                "rollback": step.rollback,
                "condition": step.condition,
                "after": step.after,
                "optional": step.on_failure == "continue",
                "approvals": named.get(step.id, []),
                "sources": sources(flows.of(step.id)),
            }
        )
    return out


def sources(flow: provenance.StepFlow | None) -> list[dict[str, Any]]:
    """Each parameter fed by another step: the steps, whether they are untrusted, and the reference that reads them.

    A condition over other steps is listed as ``(condition)``: whether the step runs depends on them.
    """
    if flow is None:
        return []
    out = [
        {
            "param": name,
            "refs": list(param.refs),
            "from": [{"step": o.step, "tool": o.tool, "untrusted": o.untrusted} for o in param.origins],
            "untrusted": bool(param.untrusted),
        }
        for name, param in flow.params.items()
    ]
    if flow.control:
        from_ = [{"step": o.step, "tool": o.tool, "untrusted": o.untrusted} for o in flow.control]
        out.append({"param": "(condition)", "refs": [], "from": from_, "untrusted": bool(flow.untrusted_control)})
    return out


def badge(source: Mapping[str, Any]) -> str:
    """One origin of a value as the plan page and ``plangate show`` write it: ``from step 1 (untrusted: read_bill)``."""
    return f"from step {source['step']} ({'untrusted' if source['untrusted'] else 'trusted'}: {source['tool']})"


def progress(record: PlanRecord, rows: Mapping[int, StepRow], events: Iterable[Event]) -> dict[str, dict[str, str]]:
    """Where each step stands (``waiting`` before it starts), with its output or error, cut to :data:`DETAIL`."""
    settled = {e.step_id: e.actor for e in events if e.kind == "step.settled"}
    out: dict[str, dict[str, str]] = {}
    for step in record.plan.steps if record.plan else ():
        row = rows.get(step.id)
        detail = ""
        if row is not None:
            detail = row.error or ("" if row.output is None else json.dumps(row.output, ensure_ascii=False)[:DETAIL])
            if step.id in settled and row.status == "succeeded":  # an output a person gave, not a tool
                detail = f"settled as done by {settled[step.id]}: {detail}"
        out[str(step.id)] = {"status": row.status if row else "waiting", "detail": detail}
    return out


def review(store: Store, record: PlanRecord, catalogue: Catalogue | None) -> dict[str, Any]:
    """Everything ``plangate show`` prints beside the record: the policy's reasons, and each step with
    where it stands once the plan has run (``status`` None before any step started)."""
    rows = store.steps(record.id)
    events = list(store.events(record.id)) if rows else []
    states = progress(record, rows, events) if rows else {}
    before = {"status": None, "detail": ""}
    described = [{**step, **states.get(str(step["id"]), before)} for step in steps(record, catalogue)]
    out: dict[str, Any] = {"reasons": reasons(record), "steps": described}
    if record.plan is not None and record.plan.answer is not None:
        out["answer"] = answer_of(record, catalogue, events)
    return out


def answer_of(record: PlanRecord, catalogue: Catalogue | None, events: Iterable[Event]) -> dict[str, Any]:
    """The plan's answer as written, the steps it reads (untrusted ones flagged) and, once the run succeeded,
    the answer it gave with its untrusted parts marked (``[untrusted: ...>>]text[<<]``)."""
    assert record.plan is not None and record.plan.answer is not None
    flows = provenance.analyse(record.plan, catalogue)
    origins = answer.origins(record.plan, flows)
    ended = [e for e in events if e.kind == "run.succeeded" and e.version == record.version and "answer" in e.data]
    said = ended[-1].data if ended else None
    return {
        "text": record.plan.answer,
        "from": [{"step": o.step, "tool": o.tool, "untrusted": o.untrusted} for o in origins],
        "untrusted": any(o.untrusted for o in origins),
        "rendered": said["answer"] if said else None,
        "provenance": said.get("answer_provenance") if said else None,
        "marked": answer.marked_text(said["answer"], said.get("answer_provenance")) if said else None,
        "segments": answer.shown_segments(said["answer"], said.get("answer_provenance")) if said else [],
    }


def short(text: str, width: int = 80) -> str:
    """``text`` on one line, cut to ``width`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 3] + "..."
