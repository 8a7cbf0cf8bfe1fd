"""The policy as the store recorded it: every revision seen, when and by which plans, and each one's rules.

A policy is recorded by its hash with every decision (``plan.checked`` events, approval
rows) and its text in the store's ``policies`` table, so the rule document needs no
policy file: it is written from what the plans were actually held against. Each rule is
printed with its ``justification`` and ``compliance`` when the policy gives them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from plangate.policy import Policy
from plangate.store import Event, Store

_SECTIONS = ("limits", "roles", "users", "default_role", "deny", "require", "sequences", "resources")
_MORE = ("categories", "approval", "budgets", "compensation")
_GOVERNANCE = ("justification", "compliance")


@dataclass(kw_only=True)
class Revision:
    """One policy, by hash: what it is called, and which plans were checked against it, first and last when."""

    hash: str
    name: str | None = None
    revision: str | None = None
    first_used: str | None = None
    last_used: str | None = None
    plans: list[str] = field(default_factory=list)
    policy: Policy | None = None

    def use(self, event: Event) -> None:
        self.first_used = self.first_used or event.at
        self.last_used = event.at
        if event.plan_id is not None and event.plan_id not in self.plans:
            self.plans.append(event.plan_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "hash": self.hash,
            "name": self.name,
            "revision": self.revision,
            "first_used": self.first_used,
            "last_used": self.last_used,
            "checks": len(self.plans),
            "plans": self.plans,
            "text_recorded": self.policy is not None,
        }


def history(store: Store, checks: Iterable[Event]) -> list[Revision]:
    """Every policy the store holds or a check used, the one used most recently first (never-used ones last)."""
    found: dict[str, Revision] = {}
    for event in checks:
        decision = event.data.get("policy") if event.kind == "plan.checked" else None
        if isinstance(decision, dict) and decision.get("policy_hash"):
            digest = str(decision["policy_hash"])
            found.setdefault(digest, Revision(hash=digest)).use(event)
    for (digest,) in store.query("SELECT hash FROM policies ORDER BY hash"):
        found.setdefault(digest, Revision(hash=digest))
    for revision in found.values():
        revision.policy = Policy.recorded(store, revision.hash)
        if revision.policy is not None:
            revision.name, revision.revision = revision.policy.name, revision.policy.revision
    return sorted(found.values(), key=lambda r: (r.last_used or "", r.hash), reverse=True)


def document(revisions: list[Revision]) -> str:
    """The policy rule document: the revision history, then every rule of each recorded revision."""
    lines = ["# Policy rules and revision history", ""]
    if not revisions:
        return "\n".join([*lines, "No policy is recorded in the store: every plan was checked without one.", ""])
    lines += [
        "## Revision history",
        "",
        "| policy | revision | hash | first used | last used | plans checked |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in revisions:
        cells = [r.name or "(text not recorded)", r.revision or "", f"`{r.hash[:16]}`"]
        lines.append(
            "| " + " | ".join([*cells, r.first_used or "never", r.last_used or "never", str(len(r.plans))]) + " |"
        )
    for r in revisions:
        lines += ["", *_rules(r)]
    return "\n".join(lines) + "\n"


def _rules(revision: Revision) -> list[str]:
    policy = revision.policy
    head = f"## {revision.name or 'Policy'} {revision.revision or ''}".rstrip() + f" (hash `{revision.hash[:16]}`)"
    if policy is None:
        return [head, "", "The store holds no text for this policy hash."]
    data = policy.model_dump(mode="json")
    lines = [head, ""]
    if policy.description:
        lines += [policy.description, ""]
    for name in (*_SECTIONS, *_MORE):
        value = data.get(name)
        if value in (None, {}, []):
            continue
        lines += [f"### {name}", ""]
        described = Policy.model_fields[name].description
        lines += [described, ""] if described else []
        lines += _section(value)
        lines.append("")
    return lines[:-1]


def _section(value: Any) -> list[str]:
    if isinstance(value, list):
        return [line for rule in value for line in _rule(str(rule.get("name", "rule")), rule)]
    if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
        return [line for key, rule in value.items() for line in _rule(key, rule)]
    if isinstance(value, dict):
        return _fields(value)
    return [f"- {_json(value)}"]


def _rule(name: str, rule: dict[str, Any]) -> list[str]:
    """One rule: its name, then each of its settings, its justification and compliance last."""
    return [f"- **{name}**", *(f"  {line}" for line in _fields({k: v for k, v in rule.items() if k != "name"}))]


def _fields(values: dict[str, Any]) -> list[str]:
    settings = [f"- {key}: {_json(v)}" for key, v in values.items() if key not in _GOVERNANCE and v is not None]
    governance = [f"- {key}: {values[key]}" for key in _GOVERNANCE if values.get(key)]
    return settings + governance


def _json(value: Any) -> str:
    if isinstance(value, str):
        return value if "\n" not in value else json.dumps(value)
    return json.dumps(value, ensure_ascii=False)
