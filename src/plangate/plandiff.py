"""What changed between two versions of a plan, step by step: one answer for the command line, the API
and the dashboard.

Steps are matched by id: each is added, removed or changed, and a changed step names every
field that changed, old -> new (its parameters one by one, as ``params.amount``). The plan's
own fields (task, category...) and the order its steps are listed in (which decides when
effects run) are compared too. Fields are compared by name over the plan's canonical JSON,
so a field plans gain later is compared without a change here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from plangate.errors import NotFoundError
from plangate.plan import Plan, same_json
from plangate.store import PlanRow, Store

StepChangeKind = Literal["added", "removed", "changed"]


@dataclass(frozen=True, kw_only=True)
class Change:
    """One field that changed: its name, and its value before and after (None: absent)."""

    field: str
    old: Any
    new: Any

    def to_dict(self) -> dict[str, Any]:
        return {"field": self.field, "old": self.old, "new": self.new}


@dataclass(frozen=True, kw_only=True)
class StepChange:
    """A step added, removed or changed; ``fields`` are its changes (all of its fields when added or removed)."""

    id: int
    kind: StepChangeKind
    tool: str
    fields: tuple[Change, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "tool": self.tool, "fields": [c.to_dict() for c in self.fields]}


@dataclass(frozen=True, kw_only=True)
class PlanDiff:
    """The difference between two versions of one plan."""

    plan_id: str
    from_version: int
    to_version: int
    from_hash: str
    to_hash: str
    fields: tuple[Change, ...] = ()
    """The plan's own fields that changed (task, category...), steps aside."""
    order: Change | None = None
    """The listed order of the steps both versions have, when it changed (the full lists of ids)."""
    steps: tuple[StepChange, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.fields or self.order or self.steps)

    def to_dict(self) -> dict[str, Any]:
        return {
            "plan_id": self.plan_id,
            "from_version": self.from_version,
            "to_version": self.to_version,
            "from_hash": self.from_hash,
            "to_hash": self.to_hash,
            "fields": [c.to_dict() for c in self.fields],
            "order": self.order.to_dict() if self.order else None,
            "steps": [s.to_dict() for s in self.steps],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlanDiff:
        """The difference as :meth:`to_dict` gave it (the JSON API's reply)."""
        return cls(
            plan_id=data["plan_id"],
            from_version=data["from_version"],
            to_version=data["to_version"],
            from_hash=data["from_hash"],
            to_hash=data["to_hash"],
            fields=tuple(Change(**c) for c in data["fields"]),
            order=Change(**data["order"]) if data.get("order") else None,
            steps=tuple(
                StepChange(id=s["id"], kind=s["kind"], tool=s["tool"], fields=tuple(Change(**c) for c in s["fields"]))
                for s in data["steps"]
            ),
        )

    def lines(self) -> list[str]:
        """The difference in plain words, one change a line."""
        head = (
            f"plan {self.plan_id} v{self.from_version} -> v{self.to_version} "
            f"(hash {self.from_hash[:12]} -> {self.to_hash[:12]})"
        )
        out = [head, *(f"  {_said(c)}" for c in (*self.fields, *((self.order,) if self.order else ())))]
        for step in self.steps:
            out.append(f"  step {step.id} {step.tool}: {step.kind}")
            out += [f"    {_said(c) if step.kind == 'changed' else _value(c)}" for c in step.fields]
        if not self.changed:
            out.append("  no change")
        return out


def compare(old: Plan, new: Plan, *, plan_id: str, from_version: int, to_version: int) -> PlanDiff:
    """What changed from ``old`` to ``new``."""
    before, after = _body(old), _body(new)
    old_steps = {s["id"]: s for s in before.pop("steps")}
    new_steps = {s["id"]: s for s in after.pop("steps")}
    both = old_steps.keys() & new_steps.keys()
    listed = ([i for i in old_steps if i in both], [i for i in new_steps if i in both])
    order = Change(field="order", old=list(old_steps), new=list(new_steps)) if listed[0] != listed[1] else None
    steps = [_step(i, old_steps.get(i), new_steps.get(i)) for i in sorted(old_steps.keys() | new_steps.keys())]
    return PlanDiff(
        plan_id=plan_id,
        from_version=from_version,
        to_version=to_version,
        from_hash=old.hash,
        to_hash=new.hash,
        fields=_changes(before, after),
        order=order,
        steps=tuple(s for s in steps if s is not None),
    )


def between(store: Store, plan: PlanRow, from_version: int | None, to_version: int | None) -> PlanDiff:
    """The difference between two stored versions of ``plan``: by default the one before the latest, and the latest."""
    to_number = plan.version if to_version is None else to_version
    from_number = to_number - 1 if from_version is None else from_version
    if from_version is None and from_number < 1 and to_number >= 1:
        raise NotFoundError(f"plan {plan.id} has no version before v{to_number} to compare it with")
    new, old = (_version(store, plan, number) for number in (to_number, from_number))  # the newer named first
    return compare(old, new, plan_id=plan.id, from_version=from_number, to_version=to_number)


def _version(store: Store, plan: PlanRow, number: int) -> Plan:
    row = store.get_version(plan.id, number)
    if row is None:
        raise NotFoundError(f"plan {plan.id} has no version {number} (its versions are 1 to {plan.version})")
    return Plan.parse(row.body)


def _body(plan: Plan) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(plan.canonical_json())
    return body


def _step(step_id: int, old: dict[str, Any] | None, new: dict[str, Any] | None) -> StepChange | None:
    if old is None or new is None:
        kind: StepChangeKind = "added" if old is None else "removed"
        present = new if old is None else old
        assert present is not None
        fields = tuple(
            Change(field=k, old=None if old is None else v, new=v if old is None else None)
            for k, v in sorted(present.items())
            if k != "id" and v is not None
        )
        return StepChange(id=step_id, kind=kind, tool=str(present["tool"]), fields=fields)
    changes = _changes(old, new)
    return StepChange(id=step_id, kind="changed", tool=str(new["tool"]), fields=changes) if changes else None


def _changes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> tuple[Change, ...]:
    """Each key whose value differs; a step's parameters key by key."""
    found: list[Change] = []
    for key in sorted(old.keys() | new.keys()):
        before, after = old.get(key), new.get(key)
        if same_json(before, after):  # 1 and true are two values: == takes them for one
            continue
        if not prefix and key == "params" and isinstance(before, dict) and isinstance(after, dict):
            found += _changes(before, after, prefix="params.")
        else:
            found.append(Change(field=prefix + key, old=before, new=after))
    return tuple(found)


def _said(change: Change) -> str:
    return f"{change.field}: {_json(change.old)} -> {_json(change.new)}"


def _value(change: Change) -> str:
    return f"{change.field}: {_json(change.new if change.old is None else change.old)}"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)
