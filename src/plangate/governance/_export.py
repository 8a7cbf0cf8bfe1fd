"""Writing a governance export: the artefacts an auditor asks for, from the store alone, under a manifest."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from plangate import __version__, ledger
from plangate._clock import Clock, SystemClock, iso, parse_iso
from plangate.errors import GovernanceError, PlangateError, UsageError
from plangate.governance import _approvals, _incidents, _manifest, _policydoc, _schemadoc
from plangate.register import Register, report
from plangate.store import Event, PlanRow, Store
from plangate.story import tell
from plangate.tools import Catalogue

ARTEFACTS = {
    "README.md": "this index",
    "plan-schema.json": "the plan's JSON Schema, with its version (the one the planning model is given)",
    "plan-schema.md": "the plan schema as a document: every field, its type and meaning",
    "policy.md": "every rule of each policy revision, with its justification and compliance, and the revision history",
    "policy-history.json": "each policy hash seen, when first and last used, by which plans",
    "policies/": "each policy's text as the store recorded it (HASH.json)",
    "approvals.csv": "the approval log: every decision, who, role, when, comment, and the edits before it",
    "approvals.jsonl": "the approval log as JSON lines",
    "traces/": "one file per plan: PLAN_ID.jsonl (its audit events) and PLAN_ID.txt (its story)",
    "register.md": "the auto-approval register, its changes, and the evidence report",
    "register.json": "the same as data",
    "incidents.md": "every plan that halted after an effect: what ran, what was done, what is open",
    "incident-runbook.md": "the incident-response procedure",
    "manifest.json": "the SHA-256 of every file, the export time, the filter and the audit head",
}


@dataclass(frozen=True, kw_only=True)
class ExportReport:
    folder: Path
    plans: int
    incidents: int
    files: int
    manifest_sha256: str
    audit_head: str

    left_out: int = 0
    """Plans left out of the approval log and the incidents (README.md names them, and why)."""

    def __str__(self) -> str:
        left_out = f", {self.left_out} left out (see README.md)" if self.left_out else ""
        return (
            f"exported {self.plans} plans ({self.incidents} incidents{left_out}) to {self.folder}: {self.files} "
            f"files; audit head {self.audit_head}; manifest sha256 {self.manifest_sha256} (keep it elsewhere)"
        )


def parse_since(text: str | None) -> str | None:
    """``--since``: a date (YYYY-MM-DD) or an ISO time, as a stored timestamp (UTC)."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--since {text!r} is not a date (YYYY-MM-DD) or an ISO time") from None
    return iso(moment if moment.tzinfo else moment.replace(tzinfo=UTC))


def export(
    store: Store,
    out: Path,
    *,
    since: str | None = None,
    catalogue: Catalogue | None = None,
    clock: Clock | None = None,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
) -> ExportReport:
    """Write the export to ``out`` (empty, or an earlier export with ``force``); ``since``: a stored timestamp."""
    clock = clock or SystemClock()
    _prepare(out, force)
    with store.snapshot():
        writer = _Writer(store, out, since, _Effects(catalogue), progress or (lambda _: None))
        head = store.audit_head()
        audit = store.verify_audit()
        writer.write_all(clock)
    meta = {
        "exported_at": iso(clock.now()),
        "since": since,
        "plangate_version": __version__,
        "audit_head": {"seq": head[0], "hash": head[1]},
        "audit_log": str(audit),
        "plans": len(writer.plans),
        "left_out": [plan_id for plan_id, _ in writer.left_out],
    }
    digest = _manifest.write(out, meta)
    return ExportReport(
        folder=out,
        plans=len(writer.plans),
        incidents=writer.incidents,
        files=len(_manifest.files_in(out)),
        manifest_sha256=digest,
        audit_head=f"{head[0]}:{head[1]}",
        left_out=len(writer.left_out),
    )


def _prepare(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is not a folder")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise UsageError(f"--out {out} is not empty: give an empty folder, or --force to replace an earlier export")
        _remove_export(out)
    out.mkdir(parents=True, exist_ok=True)


def _remove_export(out: Path) -> None:
    """Remove an earlier export (what its manifest lists); refuse a folder that holds anything else."""
    try:
        listed = json.loads((out / _manifest.MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        raise UsageError(f"--out {out} is not empty and holds no governance export to replace") from None
    outside = next((str(name) for name in listed if not _manifest.plain(str(name))), None)
    if outside is not None:
        raise UsageError(
            f"--out {out}: its manifest lists {outside!r}, which is not a file inside the folder: not replaced"
        )
    others = [name for name in _manifest.files_in(out) if name not in listed]
    if others:
        raise UsageError(f"--out {out} holds files that are not part of its export (such as {others[0]}): not replaced")
    for name in listed:
        (out / name).unlink(missing_ok=True)
    (out / _manifest.MANIFEST).unlink()
    for folder in sorted((p for p in out.rglob("*") if p.is_dir()), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()


class _Effects:
    """Which tools have effects: from the catalogue given, else each plan's tools module on record."""

    def __init__(self, catalogue: Catalogue | None) -> None:
        self.catalogue = catalogue
        self.loaded: dict[str, Catalogue | None] = {}

    def __call__(self, plan: PlanRow, tool: str) -> str | None:
        catalogue = self.catalogue or self._recorded(plan.tools)
        found = catalogue.get(tool) if catalogue is not None else None
        return found.effect if found is not None else None

    def _recorded(self, module: str | None) -> Catalogue | None:
        if module is None:
            return None
        if module not in self.loaded:
            try:
                self.loaded[module] = Catalogue.from_spec(module)
            except PlangateError:
                self.loaded[module] = None
        return self.loaded[module]


class _Writer:
    def __init__(
        self, store: Store, out: Path, since: str | None, effects: _Effects, progress: Callable[[str], None]
    ) -> None:
        self.store, self.out, self.since, self.effects, self.progress = store, out, since, effects, progress
        ids = store.query("SELECT id FROM plans WHERE created_at >= ? ORDER BY created_at, id", (since or "",))
        self.plans = [row for (plan_id,) in ids if (row := store.get_plan(plan_id)) is not None]
        self.incidents = 0
        self.left_out: list[tuple[str, str]] = []
        """The plans left out of the approval log and the incidents, each with why (its trace is written)."""

    def put(self, name: str, text: str) -> None:
        if not _manifest.plain(name):  # a plan id or hash from the store names the file: never a path out
            raise GovernanceError(
                f"the export would write {name!r}, which is not a file inside --out: a plan id or policy hash in the "
                "store was changed outside plangate (see plangate audit verify); the export stops here"
            )
        path = self.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")

    def write_all(self, clock: Clock) -> None:
        self.put("plan-schema.json", json.dumps(_schemadoc.schema_file(), indent=2) + "\n")
        self.put("plan-schema.md", _schemadoc.schema_document())
        checks, decisions, incidents = self._plans()
        self.put("README.md", _index(self.since, self.left_out))
        self._policy(checks)
        self.put("approvals.csv", _approvals.to_csv(decisions))
        self.put("approvals.jsonl", _approvals.to_jsonl(decisions))
        self._register(clock)
        self.incidents = len(incidents)
        self.put("incidents.md", _incidents_document(incidents, self.since))
        self.put("incident-runbook.md", runbook())

    def _plans(self) -> tuple[list[Event], list[_approvals.Decision], list[_incidents.Incident]]:
        checks, decisions, incidents = [], [], []
        stories = self.store.plans_events([plan.id for plan in self.plans])
        for number, (plan, (_, verified, broken)) in enumerate(zip(self.plans, stories, strict=True), 1):
            events = verified if broken is None else list(self.store.events(plan.id))  # as stored, with hashes
            self.put(f"traces/{plan.id}.jsonl", "".join(_jsonl(e.to_dict()) for e in events))
            story = [f"plan {plan.id} ({plan.kind}): {plan.task} [{plan.category}], now {plan.status}", *tell(events)]
            self.put(f"traces/{plan.id}.txt", "\n".join(story) + "\n")
            self.progress(f"  [{number}/{len(self.plans)}] plan {plan.id}: {len(events)} events, {plan.status}")
            told = self._held(plan, verified, broken)
            if told is None:
                continue
            checks += [e for e in events if e.kind == "plan.checked"]
            decisions += _approvals.decisions(self.store, plan, told)
            found = _incidents.incident(plan, events, told.rows or {}, self.effects)
            incidents += [found] if found is not None else []
        return checks, sorted(decisions, key=lambda d: (d.at, d.plan_id, d.version)), incidents

    def _held(self, plan: PlanRow, events: list[Event], broken: str | None) -> ledger.PlanLedger | None:
        """The plan's story where its events verify and its rows agree with them; else None, and it is named."""
        told = ledger.fold(plan.id, events)
        found = (
            ledger.problems(self.store, told, plan)
            if broken is None
            else [f"its audit events do not verify ({broken})"]
        )
        if not found:
            return told
        why = ledger.first_problem(plan.id, found)
        self.left_out.append((plan.id, why))
        self.progress(f"    left out of the approval log and the incidents: {why}")
        return None

    def _policy(self, checks: list[Event]) -> None:
        revisions = _policydoc.history(self.store, checks)
        self.put("policy.md", _policydoc.document(revisions))
        self.put("policy-history.json", json.dumps([r.to_dict() for r in revisions], indent=2) + "\n")
        for revision in revisions:
            text = self.store.policy_text(revision.hash)
            if text is not None:
                self.put(f"policies/{revision.hash}.json", text if text.endswith("\n") else text + "\n")

    def _register(self, clock: Clock) -> None:
        entries = Register(self.store, clock).all()
        changes = [e for e in self.store.verified_events("register.changed") if e.at >= (self.since or "")]
        now = clock.now()
        days = math.ceil((now - parse_iso(self.since)).total_seconds() / 86400) if self.since else 90
        evidence = report(self.store, days=max(days, 1), clock=clock)
        data = {
            "entries": [e.__dict__ for e in entries],
            "changes": [{"at": e.at, "by": e.actor, **e.data} for e in changes],
            "evidence": {
                "days": max(days, 1),
                "categories": [{**s.__dict__} for s in evidence.categories],
                "left_out": evidence.named,
            },
        }
        self.put("register.json", json.dumps(data, indent=2, sort_keys=True) + "\n")
        self.put("register.md", _register_document(data))


def _jsonl(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True) + "\n"


def _index(since: str | None, left_out: list[tuple[str, str]]) -> str:
    window = f"plans created at or after {since}" if since else "every plan in the store"
    lines = ["# Governance export", "", f"What the store holds, for {window}. Check it with", ""]
    lines += ["    plangate governance verify THIS_FOLDER [--db STORE_URL]", "", "| file | what it holds |"]
    lines += ["| --- | --- |", *(f"| `{name}` | {what} |" for name, what in ARTEFACTS.items())]
    if left_out:
        lines += ["", "## Left out", "", _LEFT_OUT, ""]
        lines += [f"- plan {plan_id}: {why}" for plan_id, why in left_out]
    return "\n".join(lines) + "\n"


_LEFT_OUT = (
    "The approval log and the incidents are read from each plan's audit events. These plans' events do not "
    "verify, or their stored rows disagree with them (changed outside plangate), so they are left out of both; "
    "their traces are written as stored. See `plangate audit verify`."
)


def _register_document(data: dict[str, Any]) -> str:
    lines = ["# Auto-approval register", "", "| category | automatic approval | changed by | at | reason |"]
    lines += ["| --- | --- | --- | --- | --- |"]
    lines += [
        f"| {e['category']} | {'on' if e['auto'] else 'off'} | {e['changed_by']} | {e['changed_at']} | {e['reason']} |"
        for e in data["entries"]
    ]
    if not data["entries"]:
        lines.append("| (empty: every category follows the policy) | | | | |")
    lines += ["", "## Changes", ""]
    lines += [
        f"- {c['at']} {c['by']}: {c['category']} {'on' if c['auto'] else 'off'}: {c['reason']}" for c in data["changes"]
    ]
    lines += [] if data["changes"] else ["- none in this window"]
    evidence = data["evidence"]
    lines += ["", f"## Evidence: the last {evidence['days']} days", ""]
    lines += ["| category | plans | approved | rejected | edited | median minutes | candidate |"]
    lines += ["| --- | --- | --- | --- | --- | --- | --- |"]
    for s in evidence["categories"]:
        median = "-" if s["median_minutes"] is None else f"{s['median_minutes']:.1f}"
        cells = [s["category"], s["plans"], s["approved"], s["rejected"], s["edited"], median]
        lines.append("| " + " | ".join(str(c) for c in cells) + f" | {'yes' if s['candidate'] else 'no'} |")
    lines += ["", "A candidate has at least 5 decisions, every one an approval, and no edits."]
    if evidence["left_out"]:
        lines += ["", "Left out, because their audit events do not verify, so no category is a candidate:", ""]
        lines += [f"- {line}" for line in evidence["left_out"]]
    return "\n".join(lines) + "\n"


def _incidents_document(incidents: list[_incidents.Incident], since: str | None) -> str:
    window = f" (plans created at or after {since})" if since else ""
    lines = [f"# Incidents{window}", ""]
    lines += [
        "Every plan that halted after at least one effect: a step that writes or cannot be undone succeeded, "
        "or its outcome is unknown, before the halt. The procedure is in `incident-runbook.md`.",
        "",
        f"{len(incidents)} incident(s), {sum(1 for i in incidents if _is_open(i))} still open.",
    ]
    if incidents:
        lines += ["", "| plan | task | halted | now | open |", "| --- | --- | --- | --- | --- |"]
        for i in incidents:
            when = i.halts[0][:19]
            lines.append(
                f"| {i.plan.id} | {i.plan.task} | {when} | {i.plan.status} | {'yes' if _is_open(i) else 'no'} |"
            )
    for i in incidents:
        lines += ["", *i.lines()]
    return "\n".join(lines) + "\n"


def _is_open(incident: _incidents.Incident) -> bool:
    return not incident.open[0].startswith("nothing")


def runbook() -> str:
    """The incident-response procedure (docs/incidents.md, shipped in the package as ``plangate/_docs``)."""
    packaged = resources.files("plangate").joinpath("_docs", "incidents.md")
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    checkout = Path(__file__).resolve().parents[3] / "docs" / "incidents.md"
    if checkout.is_file():
        return checkout.read_text(encoding="utf-8")
    raise UsageError("the incident runbook is missing from this installation: reinstall plangate")
