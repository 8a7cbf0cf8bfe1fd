"""The human approval log: every decision on every plan version, with who, in which role, when, why, and the
edits that led to the version decided on; as the audit log records them, never the approvals table.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass
from typing import Any

from plangate import plandiff
from plangate.ledger import PlanLedger
from plangate.store import PlanRow, Store

COLUMNS = (
    "plan_id",
    "category",
    "version",
    "plan_hash",
    "policy_hash",
    "decision",
    "kind",
    "actor",
    "role",
    "at",
    "comment",
    "void",
    "edited_by",
    "edits",
)
"""The approval log's CSV columns, in order."""


@dataclass(frozen=True, kw_only=True)
class Decision:
    """One approval or rejection; ``edits``: what changed from the version before (none for a first version)."""

    plan_id: str
    category: str
    version: int
    plan_hash: str
    policy_hash: str | None
    decision: str
    kind: str
    actor: str
    role: str | None
    at: str
    comment: str | None
    void: bool
    edited_by: str | None
    edits: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "edits": list(self.edits)}


def decisions(store: Store, plan: PlanRow, told: PlanLedger) -> list[Decision]:
    """The plan's decisions as its audit events record them (``told``: its story, its rows held against it),
    oldest first, each with the edits that made the version it decided on."""
    out = []
    edits: dict[int, tuple[str | None, tuple[str, ...]]] = {}
    for row in told.decisions:
        if row.version not in edits:
            edits[row.version] = _edits(store, plan, told, row.version)
        editor, changes = edits[row.version]
        out.append(
            Decision(
                plan_id=plan.id,
                category=plan.category,
                version=row.version,
                plan_hash=row.plan_hash,
                policy_hash=row.policy_hash,
                decision=row.decision,
                kind=row.kind,
                actor=row.actor,
                role=row.role,
                at=row.at,
                comment=row.comment,
                void=row.void,
                edited_by=editor,
                edits=changes,
            )
        )
    return sorted(out, key=lambda d: (d.at, d.version))


def _edits(store: Store, plan: PlanRow, told: PlanLedger, version: int) -> tuple[str | None, tuple[str, ...]]:
    if version <= 1 or plan.kind != "plan":
        return None, ()
    diff = plandiff.between(store, plan, version - 1, version)
    return told.versions[version].author, tuple(line.strip() for line in diff.lines()[1:])


def to_csv(rows: list[Decision]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for d in rows:
        data = d.to_dict()
        data["edits"] = "; ".join(d.edits)
        data["void"] = "yes" if d.void else "no"
        writer.writerow(["" if data[c] is None else data[c] for c in COLUMNS])
    return out.getvalue()


def to_jsonl(rows: list[Decision]) -> str:
    return "".join(json.dumps(d.to_dict(), ensure_ascii=False, sort_keys=True) + "\n" for d in rows)
