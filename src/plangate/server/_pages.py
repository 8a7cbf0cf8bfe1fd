"""The dashboard: pages rendered on the server, and the forms that decide, edit, run and recover plans.

Every link and redirect carries the prefix the app is mounted under; the only script
and style are static files (:data:`STATIC`), so the CSP needs nothing inline.
"""

from __future__ import annotations

import difflib
from importlib import resources
from typing import Annotated, Any, Literal
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from plangate import recovery, review
from plangate.check import check
from plangate.errors import PlanError
from plangate.names import same_person
from plangate.plan import Plan
from plangate.runtime import Runtime
from plangate.server import _actions, views
from plangate.server._bodies import Version, read_json
from plangate.server._deps import Caller, Config, FormWriter, Reader, Rt, form_of
from plangate.server._errors import root
from plangate.store import PlanQuery

router = APIRouter(include_in_schema=False)
STATIC = {"plangate.css": "text/css", "run.js": "text/javascript"}
Days = Annotated[int, Query(ge=1, le=36_500)]


def render(request: Request, name: str, caller: Caller | None, **context: Any) -> HTMLResponse:
    templates = request.app.state.plangate.templates
    user, csrf = (caller.user, caller.csrf) if caller else (None, "")
    response: HTMLResponse = templates.TemplateResponse(
        request, name, {"user": user, "csrf": csrf, "root": root(request.scope), **context}
    )
    return response


def back(request: Request, path: str, **query: str) -> RedirectResponse:
    """A redirect to ``path`` inside this app (after a form), with an optional message (signed)."""
    if "flash" in query:
        query = {**query, **request.app.state.plangate.flash(query["flash"], path)}
    suffix = f"?{urlencode(query)}" if query else ""
    return RedirectResponse(f"{root(request.scope)}{path}{suffix}", status_code=303)


@router.get("/static/{name}")
def static(name: str) -> Response:
    if name not in STATIC:
        raise HTTPException(404, f"no static file {name[:80]!r}")
    text = resources.files("plangate").joinpath("server", "static", name).read_bytes()
    return Response(text, media_type=STATIC[name])


# -- pages -----------------------------------------------------------------------------------
Cursor = Annotated[str, Query(max_length=80)]


def _listing(request: Request, rt: Runtime, caller: Caller, status: str | None, **context: str) -> HTMLResponse:
    """A page of plans, newest first, and a link to the next one (older), its filters kept."""
    category, risk, before = context["category"], context["risk"], context["before"]
    query = PlanQuery(status=status, category=category or None, order="newest", before=before or None)
    rows, more = views.queue(rt, request.app.state.plangate.catalogue, query, risk, reader=caller.user)
    filters = {name: value for name, value in {"category": category, "risk": risk}.items() if value}
    older = urlencode({**filters, "before": more}) if more else ""
    links = {"newest": urlencode(filters), "older": older, "scan": str(views.SCAN)}
    return render(request, "queue.html", caller, plans=rows, **links, **context)


@router.get("/", response_class=HTMLResponse)
def queue(
    request: Request, rt: Rt, caller: Reader, *, category: str = "", risk: str = "", before: Cursor = ""
) -> HTMLResponse:
    return _listing(
        request,
        rt,
        caller,
        "pending_approval",
        path="/",
        category=category,
        risk=risk,
        before=before,
        heading="Waiting for approval",
        subtitle="Open a plan to review it.",
    )


@router.get("/plans", response_class=HTMLResponse)
def all_plans(
    request: Request, rt: Rt, caller: Reader, *, category: str = "", risk: str = "", before: Cursor = ""
) -> HTMLResponse:
    return _listing(
        request,
        rt,
        caller,
        None,
        path="/plans",
        category=category,
        risk=risk,
        before=before,
        heading="All plans",
        subtitle="Every plan you may see.",
    )


@router.get("/plans/{plan_id}", response_class=HTMLResponse)
def plan_page(
    request: Request, plan_id: str, *, rt: Rt, caller: Reader, config: Config, flash: str = "", sig: str = ""
) -> HTMLResponse:
    record, user = _actions.visible(rt, caller.user, plan_id), caller.user
    return render(
        request,
        "plan.html",
        caller,
        record=record,
        flash=config.flashed(flash, sig, f"/plans/{plan_id}"),
        reasons=review.reasons(record),
        closed=recovery.closed_note(rt.store, record.id) if record.status == "closed" else "",
        changes=rt.diff(record.id).lines()[1:] if _has_changes(record) else [],
        steps=views.steps(record, config.catalogue),
        answer=views.answer(rt.store, record, config.catalogue),
        touch=views.touch(record, config.catalogue),
        graph=views.graph_svg(record, config.catalogue),
        can_decide=user.may_approve(record.category) and not same_person(user.name, record.requested_by),
        can_edit=not user.read_only,
        can_execute=not user.read_only,
    )


@router.get("/plans/{plan_id}/compare", response_class=HTMLResponse)
def compare_page(
    request: Request, plan_id: str, rt: Rt, caller: Reader, other: Annotated[str, Query(alias="with", max_length=80)]
) -> HTMLResponse:
    """Two plans' runs side by side; both must be plans the reader may see."""
    a, b = (_actions.visible(rt, caller.user, x) for x in (plan_id, other.strip()))
    diff = rt.compare(a.id, b.id)
    return render(request, "compare.html", caller, diff=diff, table=diff.rows(), cards=views.compare(diff))


@router.get("/plans/{plan_id}/edit", response_class=HTMLResponse)
def edit_page(request: Request, plan_id: str, rt: Rt, caller: Reader) -> HTMLResponse:
    record = _actions.visible(rt, caller.user, plan_id)
    return render(request, "edit.html", caller, record=record, text=views.pretty(record), diff=None)


@router.get("/plans/{plan_id}/run", response_class=HTMLResponse)
def run_page(request: Request, plan_id: str, *, rt: Rt, caller: Reader, config: Config) -> HTMLResponse:
    record = _actions.visible(rt, caller.user, plan_id)
    progress = views.progress(rt, record)
    steps = (
        [{"id": s.id, "tool": s.tool, **progress["steps"][str(s.id)]} for s in record.plan.steps] if record.plan else []
    )
    answer = views.answer(rt.store, record, config.catalogue)  # once the run succeeded: what it said, marked
    undos = views.unsettled_undos(rt, record, config.catalogue)
    return render(request, "run.html", caller, record=record, steps=steps, answer=answer, undos=undos)


@router.get("/plans/{plan_id}/trace", response_class=HTMLResponse)
def trace_page(request: Request, plan_id: str, rt: Rt, caller: Reader, config: Config) -> HTMLResponse:
    """The plan's life on one time axis, its steps' graph with where each stands, and every event as recorded."""
    record = _actions.visible(rt, caller.user, plan_id)
    return render(request, "trace.html", caller, record=record, **views.trace(rt, record, config.catalogue))


@router.get("/audit", response_class=HTMLResponse)
def audit_page(request: Request, rt: Rt, caller: Reader) -> HTMLResponse:
    from plangate import ledger
    from plangate.story import tell

    _actions.may_audit(caller.user)
    report = ledger.verify(rt.store)
    events = list(rt.store.events())[-200:]
    lines = [f"{e.plan_id[:8] if e.plan_id else '-':8}  {line}" for e, line in zip(events, tell(events), strict=True)]
    return render(request, "lines.html", caller, heading="Audit log", subtitle=str(report), lines=lines)


@router.get("/register", response_class=HTMLResponse)
def register_page(request: Request, rt: Rt, caller: Reader, days: Days = 90) -> HTMLResponse:
    from plangate.register import Register, report

    entries, evidence = Register(rt.store).all(), report(rt.store, days=days)
    left_out, unseen = _actions.left_out_seen(rt, caller.user, evidence)
    context = {"entries": entries, "days": days, "evidence": evidence, "left_out": left_out, "unseen": unseen}
    return render(request, "register.html", caller, **context)


# -- forms -----------------------------------------------------------------------------------
class _Form(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class DecisionForm(_Form):
    plan_hash: str = ""
    plan_version: Version | None = None  # the version the page showed: a later one with its text is not it
    comment: str = ""


class EditForm(_Form):
    plan: str = ""
    action: Literal["preview", "save"] = "preview"


class SettleForm(_Form):
    step: Annotated[int, Field(ge=-999_999, le=999_999)]
    done: Literal["yes", "no"]  # never assumed: "no" lets the step run again
    output: str = ""
    note: str = ""


class CompensateForm(_Form):
    reason: str = ""


class CloseForm(_Form):
    reason: str = ""


class RegisterForm(_Form):
    category: str = ""
    state: Literal["on", "off"] = "off"
    reason: str = ""


@router.post("/plans/{plan_id}/approve")
def approve_form(
    request: Request, plan_id: str, rt: Rt, caller: FormWriter, form: Annotated[DecisionForm, form_of(DecisionForm)]
) -> Response:
    user = caller.user
    record = _actions.decide(
        rt, user, plan_id, form.plan_hash, form.comment or None, approve=True, version=form.plan_version
    )
    return back(request, f"/plans/{record.id}", flash=f"Approved by {user.name}")


@router.post("/plans/{plan_id}/reject")
def reject_form(
    request: Request, plan_id: str, rt: Rt, caller: FormWriter, form: Annotated[DecisionForm, form_of(DecisionForm)]
) -> Response:
    user = caller.user
    record = _actions.decide(rt, user, plan_id, form.plan_hash, form.comment, approve=False, version=form.plan_version)
    return back(request, f"/plans/{record.id}", flash=f"Rejected by {user.name}")


@router.post("/plans/{plan_id}/edit", response_class=HTMLResponse)
def edit_form(
    request: Request,
    plan_id: str,
    *,
    rt: Rt,
    caller: FormWriter,
    config: Config,
    form: Annotated[EditForm, form_of(EditForm)],
) -> Response:
    record = _actions.visible(rt, caller.user, plan_id)
    try:
        new = Plan.parse(read_json(form.plan.encode(), what="the plan"))
    except (HTTPException, PlanError) as exc:
        error = exc.detail if isinstance(exc, HTTPException) else str(exc)
        return render(request, "edit.html", caller, record=record, text=form.plan, diff=[], error=error, check=None)
    if form.action == "save":
        saved = rt.edit(record.id, new, editor=caller.user.name)
        return back(request, f"/plans/{saved.id}", flash=f"Saved version {saved.version}")
    old, edited = views.pretty(record).splitlines(), views.pretty_plan(new).splitlines()
    diff = list(difflib.unified_diff(old, edited, f"version {record.version}", "edited", lineterm="", n=2))
    result = check(new, config.catalogue, config.policy, user=record.requested_by, role=record.role)
    return render(request, "edit.html", caller, record=record, text="\n".join(edited), diff=diff, check=result)


@router.post("/plans/{plan_id}/execute")
def execute_form(request: Request, plan_id: str, rt: Rt, caller: FormWriter) -> Response:
    record = _actions.start(rt, _actions.visible(rt, caller.user, plan_id), caller.user)
    return back(request, f"/plans/{record.id}/run")


@router.post("/plans/{plan_id}/settle")
def settle_form(
    request: Request, plan_id: str, rt: Rt, caller: FormWriter, form: Annotated[SettleForm, form_of(SettleForm)]
) -> Response:
    observed = read_json(form.output.encode(), what="the output") if form.output.strip() else None
    _actions.settle(rt, caller.user, plan_id, form.step, done=form.done == "yes", output=observed, note=form.note)
    return back(request, f"/plans/{plan_id}/run")


@router.post("/plans/{plan_id}/compensate")
def compensate_form(
    request: Request, plan_id: str, rt: Rt, caller: FormWriter, form: Annotated[CompensateForm, form_of(CompensateForm)]
) -> Response:
    result = _actions.compensate(rt, caller.user, plan_id, form.reason)
    return back(request, f"/plans/{plan_id}", flash=str(result).splitlines()[0])


@router.post("/plans/{plan_id}/close")
def close_form(
    request: Request, plan_id: str, rt: Rt, caller: FormWriter, form: Annotated[CloseForm, form_of(CloseForm)]
) -> Response:
    record = _actions.close(rt, caller.user, plan_id, form.reason)
    return back(request, f"/plans/{record.id}", flash=f"Closed by {caller.user.name}")


@router.post("/plans/{plan_id}/resume")
def resume_form(request: Request, plan_id: str, rt: Rt, caller: FormWriter) -> Response:
    record = _actions.start(rt, _actions.halted(rt, caller.user, plan_id), caller.user)
    return back(request, f"/plans/{record.id}/run")


@router.post("/register")
def register_form(
    request: Request, rt: Rt, caller: FormWriter, form: Annotated[RegisterForm, form_of(RegisterForm)]
) -> Response:

    _actions.change_register(rt, caller.user, form.category, on=form.state == "on", reason=form.reason)
    return back(request, "/register")


def _has_changes(record: Any) -> bool:
    """Whether the page shows the changes from the version before (not once a purge removed the texts)."""
    return record.version > 1 and record.kind == "plan" and not record.purged
