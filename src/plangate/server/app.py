"""The dashboard and the JSON API, over the same runtime as the command line.

Sessions are signed cookies (HttpOnly, SameSite=Lax, Secure unless served on loopback
over plain HTTP), expiring after ``session_hours``. Every form carries a CSRF token
bound to the session; JSON calls authenticate with an API token (``Authorization:
Bearer ...``) or with the session plus an ``X-CSRF-Token`` header. Every request opens
its own store connection, and a run started from the dashboard runs in a thread of its
own, so pages never read half of a transaction.
"""

from __future__ import annotations

import difflib
import hashlib
import hmac
import json
import secrets
import threading
from collections.abc import Callable
from importlib import resources
from typing import Any
from urllib.parse import urlencode

from fastapi import FastAPI, Form, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from itsdangerous import BadSignature, SignatureExpired, URLSafeTimedSerializer
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint

from plangate.accounts import Accounts, User
from plangate.check import check
from plangate.errors import GovernanceError, InputError, NotFoundError, PlanError, UsageError
from plangate.plan import Plan
from plangate.policy import Policy
from plangate.record import PlanRecord
from plangate.runtime import Runtime
from plangate.server import views
from plangate.store import open_store
from plangate.tools import Catalogue

MAX_BODY = 1_048_576
SESSION = "plangate_session"
LOGIN_CSRF = "plangate_login_csrf"


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def create_app(
    catalogue: Catalogue,
    policy: Policy | None = None,
    db: str | None = None,
    *,
    session_hours: float = 8.0,
    secure_cookies: bool = True,
    notify: Callable[[PlanRecord], str | None] | None = None,
    slack_signing_secret: str | None = None,
) -> FastAPI:
    """The server's ASGI app. ``db`` is a store URL; each request opens its own connection."""
    app = FastAPI(title="plangate", description="Plans: submit, review, approve, execute, trace.", version="0.1.0")
    templates = Jinja2Templates(directory=str(resources.files("plangate").joinpath("server", "templates")))
    first = open_store(db)
    secret = Accounts(first).secret()
    first.close()
    sessions = URLSafeTimedSerializer(secret, salt="session")
    max_age = int(session_hours * 3600)

    def runtime() -> Runtime:
        return Runtime(catalogue, policy, db=db, notify=notify)

    def csrf_for(session_id: str) -> str:
        return hmac.new(secret, f"csrf:{session_id}".encode(), hashlib.sha256).hexdigest()

    def who(request: Request, rt: Runtime) -> tuple[User | None, str]:
        """The user, and the session's CSRF token ('' for API tokens)."""
        header = request.headers.get("authorization", "")
        if header.lower().startswith("bearer "):
            return Accounts(rt.store).by_token(header[7:].strip()), ""
        cookie = request.cookies.get(SESSION)
        if not cookie:
            return None, ""
        try:
            data = sessions.loads(cookie, max_age=max_age)
        except (SignatureExpired, BadSignature):
            return None, ""
        return Accounts(rt.store).get(data["user"]), csrf_for(data["sid"])

    def require(request: Request, rt: Runtime, *, write: bool, form_csrf: str | None = None) -> tuple[User, str]:
        user, csrf = who(request, rt)
        if user is None:
            raise _Refused(401, "log in first (or send an API token)")
        if write and csrf:  # a browser session: the form or the header must carry its CSRF token
            given = form_csrf if form_csrf is not None else request.headers.get("x-csrf-token", "")
            if not hmac.compare_digest(given, csrf):
                raise _Refused(403, "the request has no valid CSRF token: reload the page and try again")
        if write and user.read_only:
            raise _Refused(403, f"{user.name} is an auditor: auditors read, they do not change anything")
        return user, csrf

    app.add_middleware(_BodyLimit)

    @app.exception_handler(_Refused)
    async def refused(request: Request, exc: _Refused) -> Response:
        if request.url.path.startswith(("/api/", "/slack/")):
            return JSONResponse({"error": exc.message}, status_code=exc.status)
        if exc.status == 401:
            return RedirectResponse("/login", status_code=303)
        parts = request.url.path.split("/")
        if exc.status == 409 and len(parts) > 2 and parts[1] == "plans":  # back to the plan, saying why
            return RedirectResponse(
                f"/plans/{parts[2]}?{urlencode({'flash': 'Refused: ' + exc.message})}", status_code=303
            )
        return HTMLResponse(f"<h1>{exc.status}</h1><p>{_escape(exc.message)}</p>", status_code=exc.status)

    def page(request: Request, name: str, user: User | None, csrf: str, **context: Any) -> HTMLResponse:
        return templates.TemplateResponse(request, name, {"user": user, "csrf": csrf, **context})

    def governed(fn: Callable[[], Any], plan_id: str) -> Any:
        try:
            return fn()
        except NotFoundError as exc:
            raise _Refused(404, str(exc)) from None
        except GovernanceError as exc:
            raise _Refused(409, str(exc)) from None
        except (InputError, UsageError) as exc:
            raise _Refused(422, str(exc)) from None

    # -- login -----------------------------------------------------------------------------
    @app.get("/login", response_class=HTMLResponse)
    def login_page(request: Request) -> HTMLResponse:
        token = secrets.token_urlsafe(16)
        response = page(request, "login.html", None, "", login_csrf=token)
        response.set_cookie(LOGIN_CSRF, token, httponly=True, samesite="lax", secure=secure_cookies)
        return response

    @app.post("/login")
    def login(request: Request, name: str = Form(""), password: str = Form(""), csrf: str = Form("")) -> Response:
        expected = request.cookies.get(LOGIN_CSRF, "")
        if not expected or not hmac.compare_digest(csrf, expected):
            raise _Refused(403, "the login form has no valid CSRF token: reload the page")
        rt = runtime()
        user = Accounts(rt.store).login(name, password)
        if user is None:
            response = page(request, "login.html", None, "", login_csrf=expected, error="Wrong user or password.")
            response.status_code = 401
            return response
        cookie = sessions.dumps({"user": user.name, "sid": secrets.token_urlsafe(16)})
        redirect = RedirectResponse("/", status_code=303)
        redirect.set_cookie(SESSION, cookie, max_age=max_age, httponly=True, samesite="lax", secure=secure_cookies)
        return redirect

    @app.post("/logout")
    def logout(request: Request, csrf: str = Form("")) -> Response:
        require(request, runtime(), write=False)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(SESSION)
        return response

    # -- pages -----------------------------------------------------------------------------
    def listing(
        request: Request, status: str | None, *, category: str, risk: str, heading: str, subtitle: str
    ) -> HTMLResponse:
        rt = runtime()
        user, csrf = require(request, rt, write=False)
        rows = views.queue(rt, catalogue, status, category, risk)
        return page(
            request,
            "queue.html",
            user,
            csrf,
            plans=rows,
            category=category,
            risk=risk,
            heading=heading,
            subtitle=subtitle,
        )

    @app.get("/", response_class=HTMLResponse)
    def queue(request: Request, category: str = "", risk: str = "") -> HTMLResponse:
        return listing(
            request,
            "pending_approval",
            category=category,
            risk=risk,
            heading="Waiting for approval",
            subtitle="Oldest first. Open a plan to review it.",
        )

    @app.get("/plans", response_class=HTMLResponse)
    def all_plans(request: Request, category: str = "", risk: str = "") -> HTMLResponse:
        return listing(
            request, None, category=category, risk=risk, heading="All plans", subtitle="Every plan, oldest first."
        )

    @app.get("/plans/{plan_id}", response_class=HTMLResponse)
    def plan_page(request: Request, plan_id: str, flash: str = "") -> HTMLResponse:
        rt = runtime()
        user, csrf = require(request, rt, write=False)
        record: PlanRecord = governed(lambda: rt.get(plan_id), plan_id)
        return page(
            request,
            "plan.html",
            user,
            csrf,
            record=record,
            flash=flash,
            steps=views.steps(record, catalogue),
            touch=views.touch(record, catalogue),
            graph=views.graph_svg(record),
            can_decide=user.may_approve(record.category) and user.name != record.requested_by,
            can_edit=not user.read_only,
            can_execute=not user.read_only,
        )

    @app.post("/plans/{plan_id}/approve")
    def approve_form(
        request: Request, plan_id: str, plan_hash: str = Form(""), comment: str = Form(""), csrf: str = Form("")
    ) -> Response:
        rt = runtime()
        user, _ = require(request, rt, write=True, form_csrf=csrf)
        record: PlanRecord = governed(
            lambda: _decide(rt, user, plan_id, plan_hash, comment or None, approve=True), plan_id
        )
        return RedirectResponse(f"/plans/{record.id}?flash=Approved+by+{user.name}", status_code=303)

    @app.post("/plans/{plan_id}/reject")
    def reject_form(
        request: Request, plan_id: str, plan_hash: str = Form(""), comment: str = Form(""), csrf: str = Form("")
    ) -> Response:
        rt = runtime()
        user, _ = require(request, rt, write=True, form_csrf=csrf)
        record: PlanRecord = governed(lambda: _decide(rt, user, plan_id, plan_hash, comment, approve=False), plan_id)
        return RedirectResponse(f"/plans/{record.id}?flash=Rejected+by+{user.name}", status_code=303)

    @app.get("/plans/{plan_id}/edit", response_class=HTMLResponse)
    def edit_page(request: Request, plan_id: str) -> HTMLResponse:
        rt = runtime()
        user, csrf = require(request, rt, write=False)
        record: PlanRecord = governed(lambda: rt.get(plan_id), plan_id)
        return page(request, "edit.html", user, csrf, record=record, text=views.pretty(record), diff=None)

    @app.post("/plans/{plan_id}/edit", response_class=HTMLResponse)
    def edit_form(
        request: Request, plan_id: str, plan: str = Form(""), action: str = Form("preview"), csrf: str = Form("")
    ) -> Response:
        rt = runtime()
        user, csrf_token = require(request, rt, write=True, form_csrf=csrf)
        record: PlanRecord = governed(lambda: rt.get(plan_id), plan_id)
        try:
            new = Plan.parse(plan)
        except PlanError as exc:
            return page(
                request, "edit.html", user, csrf_token, record=record, text=plan, diff=[], error=str(exc), check=None
            )
        if action == "save":
            saved = governed(lambda: rt.edit(record.id, new, editor=user.name), plan_id)
            return RedirectResponse(f"/plans/{saved.id}?flash=Saved+version+{saved.version}", status_code=303)
        diff = list(
            difflib.unified_diff(
                views.pretty(record).splitlines(),
                views.pretty_plan(new).splitlines(),
                f"version {record.version}",
                "edited",
                lineterm="",
                n=2,
            )
        )
        result = check(new, catalogue, policy, user=record.requested_by, role=record.role)
        return page(
            request, "edit.html", user, csrf_token, record=record, text=views.pretty_plan(new), diff=diff, check=result
        )

    @app.post("/plans/{plan_id}/execute")
    def execute_form(request: Request, plan_id: str, csrf: str = Form("")) -> Response:
        rt = runtime()
        user, _ = require(request, rt, write=True, form_csrf=csrf)
        record: PlanRecord = governed(lambda: _start(rt, rt.get(plan_id), user), plan_id)
        return RedirectResponse(f"/plans/{record.id}/run", status_code=303)

    @app.post("/plans/{plan_id}/settle")
    def settle_form(
        request: Request,
        plan_id: str,
        *,
        step: int = Form(...),
        done: str = Form(""),
        output: str = Form(""),
        note: str = Form(""),
        csrf: str = Form(""),
    ) -> Response:
        rt = runtime()
        user, _ = require(request, rt, write=True, form_csrf=csrf)
        try:
            observed = json.loads(output) if output.strip() else None
        except json.JSONDecodeError as exc:
            raise _Refused(422, f"the output is not JSON: {exc}") from None
        may_decide(user, governed(lambda: rt.get(plan_id), plan_id))
        governed(
            lambda: rt.settle(plan_id, step, done=done == "yes", actor=user.name, output=observed, note=note or None),
            plan_id,
        )
        return RedirectResponse(f"/plans/{plan_id}/run", status_code=303)

    @app.post("/plans/{plan_id}/compensate")
    def compensate_form(request: Request, plan_id: str, reason: str = Form(""), csrf: str = Form("")) -> Response:
        rt = runtime()
        user, _ = require(request, rt, write=True, form_csrf=csrf)
        may_decide(user, governed(lambda: rt.get(plan_id), plan_id))
        result = governed(lambda: rt.compensate(plan_id, actor=user.name, reason=reason), plan_id)
        return RedirectResponse(
            f"/plans/{plan_id}?{urlencode({'flash': str(result).splitlines()[0]})}", status_code=303
        )

    @app.post("/plans/{plan_id}/resume")
    def resume_form(request: Request, plan_id: str, csrf: str = Form("")) -> Response:
        rt = runtime()
        user, _ = require(request, rt, write=True, form_csrf=csrf)
        record: PlanRecord = governed(lambda: rt.get(plan_id), plan_id)
        if record.status != "halted":
            raise _Refused(409, f"plan {record.id} is {record.status}; only a halted plan resumes here")
        governed(lambda: _start(rt, record, user), plan_id)
        return RedirectResponse(f"/plans/{record.id}/run", status_code=303)

    @app.get("/plans/{plan_id}/run", response_class=HTMLResponse)
    def run_page(request: Request, plan_id: str) -> HTMLResponse:
        rt = runtime()
        user, csrf = require(request, rt, write=False)
        record: PlanRecord = governed(lambda: rt.get(plan_id), plan_id)
        progress = views.progress(rt, record)
        steps = (
            [{"id": s.id, "tool": s.tool, **progress["steps"][str(s.id)]} for s in record.plan.steps]
            if record.plan
            else []
        )
        return page(request, "run.html", user, csrf, record=record, steps=steps)

    @app.get("/plans/{plan_id}/trace", response_class=HTMLResponse)
    def trace_page(request: Request, plan_id: str) -> HTMLResponse:
        from plangate.story import tell

        rt = runtime()
        user, csrf = require(request, rt, write=False)
        record: PlanRecord = governed(lambda: rt.get(plan_id), plan_id)
        return page(
            request,
            "lines.html",
            user,
            csrf,
            heading=f"Trace: {record.task}",
            subtitle=f"Every event recorded under {record.id}, in order.",
            lines=tell(rt.trace(record.id)),
        )

    @app.get("/audit", response_class=HTMLResponse)
    def audit_page(request: Request) -> HTMLResponse:
        from plangate import ledger
        from plangate.story import tell

        rt = runtime()
        user, csrf = require(request, rt, write=False)
        if user.role not in ("auditor", "governance"):
            raise _Refused(403, "the audit page is for auditors and governance")
        report = ledger.verify(rt.store)
        events = list(rt.store.events())[-200:]
        return page(
            request,
            "lines.html",
            user,
            csrf,
            heading="Audit log",
            subtitle=str(report),
            lines=[
                f"{e.plan_id[:8] if e.plan_id else '-':8}  {line}" for e, line in zip(events, tell(events), strict=True)
            ],
        )

    @app.get("/register", response_class=HTMLResponse)
    def register_page(request: Request, days: int = 90) -> HTMLResponse:
        from plangate.register import Register, report

        rt = runtime()
        user, csrf = require(request, rt, write=False)
        return page(
            request,
            "register.html",
            user,
            csrf,
            entries=Register(rt.store).all(),
            days=days,
            report=report(rt.store, days=days),
        )

    @app.post("/register")
    def register_form(
        request: Request,
        category: str = Form(""),
        state: str = Form("off"),
        reason: str = Form(""),
        csrf: str = Form(""),
    ) -> Response:
        from plangate.register import Register

        rt = runtime()
        user, _ = require(request, rt, write=True, form_csrf=csrf)
        governed(lambda: Register(rt.store).set(category, state == "on", by=user.name, reason=reason), "")
        return RedirectResponse("/register", status_code=303)

    @app.post("/slack/actions")
    async def slack_actions(request: Request) -> dict[str, Any]:
        """Approve or reject from a chat message's buttons: signed by the chat service, never forged."""
        from urllib.parse import parse_qs

        from plangate.notify import verify

        body = await request.body()
        if slack_signing_secret is None:
            raise _Refused(404, "chat buttons are not set up (no signing secret)")
        problem = verify(
            slack_signing_secret,
            request.headers.get("x-slack-request-timestamp", ""),
            body,
            request.headers.get("x-slack-signature", ""),
        )
        if problem is not None:
            raise _Refused(401, f"refused: {problem}")
        try:
            payload = json.loads(parse_qs(body.decode())["payload"][0])
            action = payload["actions"][0]
            plan_id, plan_hash = str(action["value"]).split(":", 1)
            name = str(payload["user"].get("username") or payload["user"]["name"])
        except (KeyError, IndexError, ValueError, json.JSONDecodeError) as exc:
            raise _Refused(400, f"not an interaction payload: {exc}") from None
        rt = runtime()
        user = Accounts(rt.store).get(name)
        if user is None or user.read_only:
            return {"response_type": "ephemeral", "text": f"{name} may not decide on plans here."}
        approve = action.get("action_id") == "plangate_approve"
        try:
            record = _decide(rt, user, plan_id, plan_hash, None if approve else "rejected from chat", approve=approve)
        except (GovernanceError, _Refused, NotFoundError) as exc:
            return {"response_type": "ephemeral", "text": f"Refused: {getattr(exc, 'message', exc)}"}
        return {"replace_original": False, "text": f"{user.name}: {record.task} is now {record.status}."}

    # -- the JSON API ----------------------------------------------------------------------
    @app.post("/api/plans", status_code=201)
    async def api_submit(request: Request) -> dict[str, Any]:
        body = await _json(request)
        rt = runtime()
        user, _ = require(request, rt, write=True)
        record: PlanRecord = governed(lambda: rt.submit(body, requested_by=user.name), "")
        return record.to_dict()

    @app.get("/api/plans")
    def api_list(request: Request, status: str | None = None) -> list[dict[str, Any]]:
        rt = runtime()
        require(request, rt, write=False)
        return [dict(row.__dict__) for row in rt.list_plans(status)]

    @app.get("/api/plans/{plan_id}")
    def api_get(request: Request, plan_id: str) -> dict[str, Any]:
        rt = runtime()
        require(request, rt, write=False)
        record: PlanRecord = governed(lambda: rt.get(plan_id), plan_id)
        return record.to_dict()

    @app.post("/api/plans/{plan_id}/approve")
    async def api_approve(request: Request, plan_id: str) -> dict[str, Any]:
        body = await _json(request)
        rt = runtime()
        user, _ = require(request, rt, write=True)
        record: PlanRecord = governed(
            lambda: _decide(rt, user, plan_id, str(body.get("hash", "")), body.get("comment"), approve=True), plan_id
        )
        return record.to_dict()

    @app.post("/api/plans/{plan_id}/reject")
    async def api_reject(request: Request, plan_id: str) -> dict[str, Any]:
        body = await _json(request)
        rt = runtime()
        user, _ = require(request, rt, write=True)
        record: PlanRecord = governed(
            lambda: _decide(rt, user, plan_id, body.get("hash"), str(body.get("comment", "")), approve=False), plan_id
        )
        return record.to_dict()

    @app.post("/api/plans/{plan_id}/edit")
    async def api_edit(request: Request, plan_id: str) -> dict[str, Any]:
        body = await _json(request)
        rt = runtime()
        user, _ = require(request, rt, write=True)
        record: PlanRecord = governed(lambda: rt.edit(plan_id, body.get("plan", {}), editor=user.name), plan_id)
        return record.to_dict()

    @app.post("/api/plans/{plan_id}/execute")
    def api_execute(request: Request, plan_id: str) -> dict[str, Any]:
        rt = runtime()
        user, _ = require(request, rt, write=True)
        result = governed(lambda: rt.execute(plan_id, actor=user.name), plan_id)
        return {
            "status": result.status,
            "outputs": {str(k): v for k, v in result.outputs.items()},
            "failed_step": result.failed_step,
            "error": result.error,
        }

    @app.get("/api/plans/{plan_id}/trace")
    def api_trace(request: Request, plan_id: str) -> list[dict[str, Any]]:
        rt = runtime()
        require(request, rt, write=False)
        return [e.to_dict() for e in governed(lambda: rt.trace(plan_id), plan_id)]

    @app.get("/api/plans/{plan_id}/progress")
    def api_progress(request: Request, plan_id: str) -> dict[str, Any]:
        rt = runtime()
        require(request, rt, write=False)
        return views.progress(rt, governed(lambda: rt.get(plan_id), plan_id))

    return app


def may_decide(user: User, record: PlanRecord) -> None:
    """Approving, rejecting, settling and rolling back are decisions: only for approvers of the plan's category."""
    if not user.may_approve(record.category):
        raise _Refused(403, f"{user.name} ({user.role}) may not decide on plans of category {record.category!r}")


def _decide(
    rt: Runtime, user: User, plan_id: str, plan_hash: str | None, comment: str | None, *, approve: bool
) -> PlanRecord:
    record = rt.get(plan_id)
    may_decide(user, record)
    if approve:
        return rt.approve(record.id, user.name, plan_hash or "", comment=comment)
    return rt.reject(record.id, user.name, comment or "", plan_hash=plan_hash or None)


def _start(rt: Runtime, record: PlanRecord, user: User) -> PlanRecord:
    """Claim the run now (so a second click is refused, not run twice), then run it in a thread of its own.

    The thread has its own store connection; the run page follows it.
    """
    if record.status not in ("approved", "halted"):
        raise GovernanceError(f"plan {record.id} is {record.status}, not approved")
    claim = rt.start(record.id, actor=user.name)
    _background(lambda worker: worker.drive(claim), rt.catalogue, rt.policy, rt.store.url)
    return record


def _background(
    job: Callable[[Runtime], Any], catalogue: Catalogue | None, policy: Policy | None, db: str | None
) -> None:
    """Run ``job`` in a thread with a runtime (and store connection) of its own."""

    def run() -> None:
        worker = Runtime(catalogue, policy, db=db)
        try:
            job(worker)
        finally:
            worker.close()

    threading.Thread(target=run, name="plangate-run", daemon=True).start()


async def _json(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        data = json.loads(raw or b"null")
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _Refused(400, f"the body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise _Refused(400, "the body must be a JSON object")
    return data


class _BodyLimit(BaseHTTPMiddleware):
    """Refuse bodies over 1 MiB before reading them."""

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY):
            return JSONResponse({"error": f"the body is over the limit of {MAX_BODY} bytes"}, status_code=413)
        return await call_next(request)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
