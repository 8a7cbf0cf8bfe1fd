"""Logging in and out of the dashboard.

The login form carries a double-submit token (a cookie and a field that must match);
browsers' cross-site POSTs are refused before that (:class:`plangate.server._security.SameOrigin`),
so nobody can log a victim into their own account. Failed logins are throttled per user
name and per client address (:mod:`plangate.server._throttle`).
"""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from plangate.accounts import Accounts, User
from plangate.server._bodies import read_form, validated
from plangate.server._deps import Config, FormSession, Rt, Settings, same
from plangate.server._errors import root
from plangate.server._pages import render

router = APIRouter(include_in_schema=False)


UserName = Annotated[str, Field(max_length=256)]
Password = Annotated[str, Field(max_length=1024)]
"""What a sign-in may give: the throttle remembers each name that failed, so none is a megabyte long."""


class LoginForm(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    name: UserName = ""
    password: Password = ""
    csrf: str = ""


async def login_form(request: Request) -> LoginForm:
    return validated(LoginForm, await read_form(request), strict=False)


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, config: Config) -> HTMLResponse:
    token = secrets.token_urlsafe(16)
    response = render(request, "login.html", None, login_csrf=token)
    response.set_cookie(config.login_cookie, token, httponly=True, samesite="lax", secure=config.secure_cookies)
    return response


@router.post("/login")
def login(request: Request, config: Config, rt: Rt, form: Annotated[LoginForm, Depends(login_form)]) -> Response:
    expected = request.cookies.get(config.login_cookie, "")
    if not expected or not same(form.csrf, expected):
        raise HTTPException(403, "the login form has no valid CSRF token: reload the page")
    accounts = Accounts(rt.store, config.clock)
    try:
        user = check_password(request, config, accounts, form.name, form.password)
    except HTTPException as exc:
        response = render(request, "login.html", None, login_csrf=expected, error=exc.detail)
        response.status_code = exc.status_code
        response.headers.update(exc.headers or {})
        return response
    cookie = config.sessions.dumps(accounts.open_session(user, hours=config.max_age / 3600).to_cookie())
    redirect = RedirectResponse(f"{root(request.scope)}/", status_code=303)
    redirect.set_cookie(
        config.session_cookie,
        cookie,
        max_age=config.max_age,
        httponly=True,
        samesite="lax",
        secure=config.secure_cookies,
    )
    redirect.delete_cookie(config.login_cookie, httponly=True, samesite="lax", secure=config.secure_cookies)
    return redirect


def check_password(request: Request, config: Settings, accounts: Accounts, name: str, password: str) -> User:
    """The account, if the password is right and the name and the client are not throttled.

    Refused with 429 (and ``Retry-After``) after repeated failures, 401 for a wrong user or
    password; the dashboard's login form and the API's token call both come through here.
    """
    address = request.client.host if request.client else ""
    wait = config.throttle.wait(name, address)
    if wait:
        minutes = -(-wait // 60)
        message = f"Too many failed logins for this user or from this address: try again in {minutes} minute(s)."
        raise HTTPException(429, message, headers={"Retry-After": str(wait)})
    user = accounts.login(name, password)
    if user is None:
        config.throttle.failed(name, address)
        raise HTTPException(401, "Wrong user or password.")
    return user


@router.post("/logout")
def logout(request: Request, config: Config, rt: Rt, caller: FormSession) -> Response:
    """End the session on the server (a copy of the cookie is worth nothing after this), then forget it."""
    if caller.session:
        Accounts(rt.store, config.clock).end_session(caller.session)
    response = RedirectResponse(f"{root(request.scope)}/login", status_code=303)
    response.delete_cookie(config.session_cookie, httponly=True, samesite="lax", secure=config.secure_cookies)
    return response
