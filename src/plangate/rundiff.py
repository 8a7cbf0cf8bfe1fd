"""Two plans' runs side by side, step by step: one answer for the command line, the API and the dashboard.

Steps are matched by id. For each: its tool, status, parameters (as resolved when it ran),
output and duration in each run, the fields that differ (as JSON values: ``1``, ``1.0`` and
``true`` differ, as they do to a tool), and the change in duration.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from plangate.errors import NotFoundError, quoted_id
from plangate.plan import Plan, same_json
from plangate.store import Store

_OUTCOMES = ("step.succeeded", "step.failed", "step.failed_optional")
_COMPARED = ("tool", "status", "params", "output")


@dataclass(frozen=True, kw_only=True)
class StepRun:
    """One step as one run left it (status ``not run``: it has no record)."""

    tool: str
    status: str
    params: Any = None
    output: Any = None
    ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"tool": self.tool, "status": self.status, "params": self.params, "output": self.output, "ms": self.ms}


@dataclass(frozen=True, kw_only=True)
class StepPair:
    """A step matched by id in both runs (None where a plan has no such step), and what differs."""

    id: int
    a: StepRun | None
    b: StepRun | None
    differs: tuple[str, ...] = ()

    @property
    def ms_change(self) -> float | None:
        if self.a is None or self.b is None or self.a.ms is None or self.b.ms is None:
            return None
        return round(self.b.ms - self.a.ms, 3)

    def to_dict(self) -> dict[str, Any]:
        side = {"a": self.a.to_dict() if self.a else None, "b": self.b.to_dict() if self.b else None}
        return {"id": self.id, **side, "differs": list(self.differs), "ms_change": self.ms_change}


@dataclass(frozen=True, kw_only=True)
class RunDiff:
    """Plan ``a``'s run against plan ``b``'s."""

    a: str
    b: str
    a_status: str
    b_status: str
    steps: tuple[StepPair, ...] = ()

    @property
    def same(self) -> bool:
        return self.a_status == self.b_status and not any(p.differs for p in self.steps)

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "a_status": self.a_status,
            "b_status": self.b_status,
            "same": self.same,
            "steps": [p.to_dict() for p in self.steps],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunDiff:
        """A comparison as :meth:`to_dict` wrote it (the JSON API's answer)."""

        def side(value: dict[str, Any] | None) -> StepRun | None:
            return StepRun(**value) if value else None

        pairs = (
            StepPair(id=p["id"], a=side(p["a"]), b=side(p["b"]), differs=tuple(p["differs"])) for p in data["steps"]
        )
        return cls(a=data["a"], b=data["b"], a_status=data["a_status"], b_status=data["b_status"], steps=tuple(pairs))

    def rows(self) -> list[list[str]]:
        """The table: step, tool, status, duration in each run and its change, and what differs."""
        table = [["step", "tool", "status a", "status b", "ms a", "ms b", "change", "differs"]]
        for p in self.steps:
            side = p.a or p.b
            tool = side.tool if side else ""
            change = "" if p.ms_change is None else f"{p.ms_change:+.1f}"
            cells = [_status(p.a), _status(p.b), _ms(p.a), _ms(p.b), change, ", ".join(p.differs) or "-"]
            table.append([str(p.id), tool, *cells])
        return table

    def lines(self) -> list[str]:
        head = f"plan {self.a} ({self.a_status}) vs plan {self.b} ({self.b_status})"
        table = self.rows()
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        out = [head, *("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in table)]
        for p in self.steps:
            for name in p.differs:
                if name in ("params", "output") and p.a and p.b:
                    out.append(f"  step {p.id} {name}: {_show(getattr(p.a, name))} -> {_show(getattr(p.b, name))}")
        return out


def between_runs(store: Store, a: str, b: str) -> RunDiff:
    """Compare the runs of plans ``a`` and ``b`` (full ids), as their stored steps and events record them."""
    runs = [_run(store, plan_id) for plan_id in (a, b)]
    (a_status, a_steps), (b_status, b_steps) = runs
    pairs = []
    for sid in sorted({*a_steps, *b_steps}):
        one, two = a_steps.get(sid), b_steps.get(sid)
        differs = (
            tuple(name for name in _COMPARED if not same_json(getattr(one, name), getattr(two, name)))
            if one and two
            else ("step",)
        )
        pairs.append(StepPair(id=sid, a=one, b=two, differs=differs))
    return RunDiff(a=a, b=b, a_status=a_status, b_status=b_status, steps=tuple(pairs))


def _run(store: Store, plan_id: str) -> tuple[str, dict[int, StepRun]]:
    plan = store.get_plan(plan_id)
    version = store.get_version(plan_id, plan.version) if plan else None
    if plan is None or version is None:
        raise NotFoundError(f"no plan {quoted_id(plan_id)}")
    ms: dict[int, float] = {}
    for event in store.events(plan_id):
        if event.kind in _OUTCOMES and event.step_id is not None and "ms" in event.data:
            ms[event.step_id] = event.data["ms"]
    rows = store.steps(plan_id)
    steps = {}
    for step in Plan.parse(version.body).steps:
        row = rows.get(step.id)
        status = row.status if row else "not run"
        steps[step.id] = StepRun(
            tool=step.tool,
            status=status,
            params=row.params if row else None,
            output=row.output if row else None,
            ms=ms.get(step.id),
        )
    return plan.status, steps


def _status(side: StepRun | None) -> str:
    return side.status if side else "(no step)"


def _ms(side: StepRun | None) -> str:
    return "" if side is None or side.ms is None else f"{side.ms:.1f}"


def _show(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
