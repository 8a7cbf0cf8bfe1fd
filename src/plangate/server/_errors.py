"""Every error reply the server makes, in one place.

The API, the chat callback and the OpenAPI document answer ``{"error": "..."}``; dashboard
pages answer a missing login with a redirect to the login page, a governance refusal on a
plan with a redirect back to the plan saying why, and anything else with a short page. All
of it honours the prefix the app is mounted under (``scope["root_path"]``).

An unexpected exception becomes a 500 that carries an error id: the id and the traceback
go to the server's log (logger ``plangate.server``), never into the reply.
"""

from __future__ import annotations

import logging
import secrets
from html import escape
from urllib.parse import urlencode

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from plangate.errors import HTTP_STATUS, LeaseLostError, StoreLostError

log = logging.getLogger("plangate.server")

# A runtime refusal becomes the status that says what kind it is; the most specific class first. A run cut off
# from its store says so too: the store not back within the run's lease (503: the next run, once it is back,
# decides what this one knew), or another runner holding the plan by then (409). Not refusals a client turns
# back into these errors (it reads a 503 as the server's failure, with the same words).
_STATUS = (*HTTP_STATUS, (StoreLostError, 503), (LeaseLostError, 409))


def root(scope: Scope) -> str:
    """The prefix the app is mounted under ('' when it is not)."""
    return str(scope.get("root_path", "")).rstrip("/")


def route(scope: Scope) -> str:
    """The request's path inside this app, whatever prefix it is mounted under."""
    path, prefix = str(scope["path"]), root(scope)
    if prefix and (path == prefix or path.startswith(prefix + "/")):
        return path[len(prefix) :] or "/"
    return path


def wants_json(scope: Scope) -> bool:
    path = route(scope)
    return path.startswith(("/api/", "/slack/")) or path == "/openapi.json"


def reply(scope: Scope, status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """The answer to a refused request: JSON for machines, a redirect or a short page for people."""
    if wants_json(scope):
        if status == 401:  # RFC 9110: say which scheme would do
            headers = {**(headers or {}), "WWW-Authenticate": 'Bearer realm="plangate"'}
        return JSONResponse({"error": message}, status_code=status, headers=headers)
    prefix, parts = root(scope), route(scope).split("/")
    if status == 401:
        return RedirectResponse(f"{prefix}/login", status_code=303)
    if status == 409 and len(parts) > 2 and parts[1] == "plans":  # back to the plan, saying why
        page = f"/plans/{parts[2]}"
        flash = urlencode(scope["app"].state.plangate.flash("Refused: " + message, page))
        return RedirectResponse(f"{prefix}{page}?{flash}", status_code=303)
    return HTMLResponse(_page(status, message), status_code=status, headers=headers)


def _page(status: int, message: str) -> str:
    return f"<!doctype html><title>{status}</title><h1>{status}</h1><p>{escape(message)}</p>"


def describe(errors: object) -> str:
    """Pydantic's or FastAPI's validation errors as one line: where, and what is wrong (never the input)."""
    parts = []
    for error in errors if isinstance(errors, list) else ():
        where = ".".join(str(p) for p in error.get("loc", ()) if p not in ("body", "query", "path"))
        parts.append(f"{where}: {error.get('msg', 'invalid')}" if where else str(error.get("msg", "invalid")))
    return "; ".join(parts) or "the request does not fit"


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return reply(request.scope, exc.status_code, str(exc.detail), dict(exc.headers or {}) or None)


async def _invalid(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    return reply(request.scope, 422, describe(list(exc.errors())))


async def _refused(request: Request, exc: Exception) -> Response:
    status = next(code for kind, code in _STATUS if isinstance(exc, kind))
    return reply(request.scope, status, str(exc))


def install(app: FastAPI) -> None:
    """Refusals as replies: HTTP errors, requests that do not validate, the runtime's refusals."""
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    for kind, _ in _STATUS:
        app.add_exception_handler(kind, _refused)
    app.add_middleware(CatchAll)


class CatchAll:
    """Any exception nobody handled: a 500 with an error id; the id and the traceback go to the log."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except ClientDisconnect:  # nobody is left to answer
            return
        except Exception as exc:
            error_id = secrets.token_hex(6)
            log.error("error %s on %s %s", error_id, scope.get("method"), scope.get("path"), exc_info=exc)
            if not started:
                await _unexpected(scope, error_id)(scope, receive, send)


def _unexpected(scope: Scope, error_id: str) -> Response:
    message = f"an unexpected error (error id {error_id}); the server's log has the details"
    if wants_json(scope):
        return JSONResponse({"error": message, "error_id": error_id}, status_code=500)
    return HTMLResponse(_page(500, message), status_code=500)
