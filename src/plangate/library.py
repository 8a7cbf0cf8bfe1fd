"""The plan library: approved plans saved as templates with typed slots.

A template is made from a plan a person approved. Each literal parameter value that
looks like an identifier or a quantity (it has a digit, or one of ``@ - _ . / :``) and
appears, as a whole word, in the task's text becomes a slot (plain words such as
"Refund" are taken as part of the wording, not as values): in "Refund invoice 42
and tell the customer", ``"42"`` (the ``invoice_id`` of two steps) becomes the slot
``invoice_id``, typed from the value (string, integer or number). The task becomes a
pattern, "Refund invoice {invoice_id} and tell the customer", that a new task must
match exactly (case and spacing aside); the slot's text is checked against its type,
and the plan is rebuilt with the new values, wherever the old value stood whole and
wherever it stood inside a longer string. No model is involved, so this tier works
offline; the filled plan still goes through check, policy and approval like any other.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from plangate.errors import PlanError, UsageError
from plangate.plan import Plan, canonical
from plangate.store import TemplateRow

_SLOT_TYPES = {"integer": r"-?\d+", "number": r"-?\d+(?:\.\d+)?", "string": r"[^\s,;:!?]+"}
_MARK = "{{%s}}"
_IDENTIFIER = re.compile(r"[\d@_./:-]")


@dataclass(frozen=True, kw_only=True)
class Match:
    """A template that fits a task, and the values its slots take."""

    template: TemplateRow
    slots: dict[str, Any]
    plan: Plan


def template_from(plan: Plan, name: str, *, source_plan: str, created_by: str, created_at: str) -> TemplateRow:
    """Turn an approved plan into a template; refuse one whose task names none of its values."""
    slots: dict[str, Any] = {}
    for step in plan.steps:
        for key, value in step.params.items():
            if _slot_like(value) and _in_text(value, plan.task):
                slots.setdefault(str(value), {"name": _unique(key, slots), "type": _kind(value), "example": value})
    if not slots:
        raise UsageError(
            f"plan {source_plan}: no parameter value appears in its task {plan.task!r}, so a new task "
            "could not fill it; the library keeps plans whose task names what varies"
        )
    pattern = plan.task
    body: Any = plan.data()
    for text, slot in sorted(slots.items(), key=lambda item: -len(item[0])):
        pattern = _word(text).sub(_MARK % slot["name"], pattern)
        body = _replace(body, slot["example"], slot["name"])
    body["task"] = pattern
    return TemplateRow(
        name=name,
        pattern=pattern,
        slots=list(slots.values()),
        body=canonical(body),
        source_plan=source_plan,
        created_by=created_by,
        created_at=created_at,
    )


def match(templates: list[TemplateRow], task: str) -> Match | None:
    """The most specific template whose pattern the task fits, with its slots filled."""
    found: list[tuple[int, TemplateRow, dict[str, Any]]] = []
    normal = " ".join(task.split())
    for template in templates:
        values = _fit(template, normal)
        if values is not None:
            found.append(
                (len(template.pattern) - sum(len(_MARK % s["name"]) for s in template.slots), template, values)
            )
    if not found:
        return None
    _, template, values = max(found, key=lambda item: item[0])
    body = _fill(json.loads(template.body), values)
    body["task"] = task
    try:
        plan = Plan.parse(body)
    except PlanError as exc:
        raise UsageError(f"template {template.name!r} filled for {task!r} is not a valid plan: {exc}") from None
    return Match(template=template, slots=values, plan=plan)


def _fit(template: TemplateRow, task: str) -> dict[str, Any] | None:
    types = {s["name"]: s["type"] for s in template.slots}
    regex = ""
    for piece in re.split(r"(\{\{\w+\}\})", " ".join(template.pattern.split())):
        name = piece[2:-2] if piece.startswith("{{") else None
        regex += f"(?P<{name}>{_SLOT_TYPES[types[name]]})" if name in types else re.escape(piece)
    found = re.fullmatch(regex, task, flags=re.IGNORECASE)
    if found is None:
        return None
    return {name: _typed(text, types[name]) for name, text in found.groupdict().items()}


def _typed(text: str, kind: str) -> Any:
    return int(text) if kind == "integer" else float(text) if kind == "number" else text


def _replace(value: Any, old: Any, name: str) -> Any:
    if isinstance(value, dict):
        return {k: _replace(v, old, name) for k, v in value.items()}
    if isinstance(value, list):
        return [_replace(v, old, name) for v in value]
    if value == old and type(value) is type(old):
        return {"$slot": name}
    if isinstance(value, str) and _in_text(old, value):
        return _word(str(old)).sub(_MARK % name, value)
    return value


def _fill(value: Any, values: dict[str, Any]) -> Any:
    if isinstance(value, dict):
        if set(value) == {"$slot"}:
            return values[value["$slot"]]
        return {k: _fill(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, values) for v in value]
    if isinstance(value, str):
        for name, filled in values.items():
            value = value.replace(_MARK % name, str(filled))
    return value


def _slot_like(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return False
    return isinstance(value, int | float) or _IDENTIFIER.search(value) is not None


def _in_text(value: Any, text: str) -> bool:
    return bool(str(value)) and _word(str(value)).search(text) is not None


def _word(text: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w.-]){re.escape(text)}(?![\w-]|\.\d)")


def _kind(value: Any) -> str:
    return "integer" if isinstance(value, int) else "number" if isinstance(value, float) else "string"


def _unique(name: str, slots: dict[str, Any]) -> str:
    taken = {s["name"] for s in slots.values()}
    candidate, n = name, 2
    while candidate in taken:
        candidate, n = f"{name}_{n}", n + 1
    return candidate
