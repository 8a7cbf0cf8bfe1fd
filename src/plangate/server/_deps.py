"""The server's dependencies: its settings, a runtime per request, and who is calling.

::

    settings   -> Settings         what create_app was given (app.state.plangate)
    runtime    -> Runtime          opened for the request, closed after the response is sent
    identity   -> Caller | None    an API token (Authorization: Bearer) or a session cookie
    reader     -> Caller           identity, or 401
    writer     -> Caller           reader; not an auditor; a session's call carries X-CSRF-Token
    form_session -> Caller         reader; the form (read only now) carries the session's CSRF token
    form_writer  -> Caller         form_session; not an auditor
    json_of(T), form_of(T)         the body as T, read only after writer / form_session

Credentials are always checked before a body is read.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.templating import Jinja2Templates
from itsdangerous import BadSignature, SignatureExpired, URLSafeTimedSerializer
from starlette.exceptions import HTTPException

from plangate._clock import Clock
from plangate.accounts import Accounts, Session, User
from plangate.policy import Policy
from plangate.record import PlanRecord
from plangate.runtime import Runtime
from plangate.server._bodies import read_form, read_json, validated
from plangate.server._throttle import LoginThrottle
from plangate.tools import Catalogue

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything create_app was given, and what it derived: one per app."""

    catalogue: Catalogue
    policy: Policy | None
    db: str | None
    notify: Callable[[PlanRecord], str | None] | None
    slack_signing_secret: str | None
    secret: bytes
    max_age: int
    secure_cookies: bool
    templates: Jinja2Templates
    throttle: LoginThrottle
    clock: Clock

    @property
    def sessions(self) -> URLSafeTimedSerializer:
        return URLSafeTimedSerializer(self.secret, salt="session")

    @property
    def session_cookie(self) -> str:
        # __Host-: only this host, path /, over TLS: a sibling domain cannot plant or overwrite it
        return "__Host-plangate_session" if self.secure_cookies else "plangate_session"

    @property
    def login_cookie(self) -> str:
        return "__Host-plangate_login_csrf" if self.secure_cookies else "plangate_login_csrf"

    def csrf_for(self, session_id: str) -> str:
        return hmac.new(self.secret, f"csrf:{session_id}".encode(), hashlib.sha256).hexdigest()

    def flash(self, message: str, page: str) -> dict[str, str]:
        """The query that shows ``message`` on ``page`` (a path in the app): signed for that page, so a link
        made elsewhere, or carrying it to another plan's page, shows nothing."""
        signed = json.dumps(["flash", page, message]).encode()
        return {"flash": message, "sig": hmac.new(self.secret, signed, hashlib.sha256).hexdigest()}

    def flashed(self, message: str, signature: str, page: str) -> str:
        """``message`` if this server signed it for ``page``, else nothing (a crafted link puts no words there)."""
        return message if message and same(signature, self.flash(message, page)["sig"]) else ""


@dataclass(frozen=True, kw_only=True)
class Caller:
    """Who is calling: the account, the session's CSRF token, and the session ('' and None for an API token)."""

    user: User
    csrf: str
    session: Session | None = None


def settings(request: Request) -> Settings:
    config: Settings = request.app.state.plangate
    return config


Config = Annotated[Settings, Depends(settings)]


def runtime(config: Config) -> Iterator[Runtime]:
    """A runtime with its own store connection, closed once the response has been sent (or the request failed)."""
    rt = Runtime(config.catalogue, config.policy, db=config.db, notify=config.notify)
    try:
        yield rt
    finally:
        rt.close()


Rt = Annotated[Runtime, Depends(runtime)]


def identity(request: Request, rt: Rt, config: Config) -> Caller | None:
    """The caller: a live API token's account, or a live session's.

    A session is its cookie, signed with the server's secret (outside the database): it
    names the account, when the session began and when it ends. It is over at logout (an
    audit event), when the account is disabled or all its tokens revoked, and when it
    expires; no row written in the database can make it anyone else's or revive it.
    """
    accounts, header = Accounts(rt.store, config.clock), request.headers.get("authorization", "")
    if header[:7].lower() == "bearer ":
        user = accounts.by_token(header[7:].strip())
        return Caller(user=user, csrf="") if user else None
    cookie = request.cookies.get(config.session_cookie)
    if not cookie:
        return None
    try:
        data = config.sessions.loads(cookie, max_age=config.max_age)
    except (SignatureExpired, BadSignature):
        return None
    session = Session.from_cookie(data)
    user = accounts.session_user(session) if session is not None else None
    return Caller(user=user, csrf=config.csrf_for(session.id), session=session) if user and session else None


def reader(caller: Annotated[Caller | None, Depends(identity)]) -> Caller:
    if caller is None:
        raise HTTPException(401, "log in first (or send an API token)")
    return caller


Reader = Annotated[Caller, Depends(reader)]


def writer(request: Request, caller: Reader) -> Caller:
    if caller.csrf and not same(request.headers.get("x-csrf-token", ""), caller.csrf):
        raise HTTPException(403, "the request has no valid CSRF token (X-CSRF-Token): reload the page and try again")
    return _may_write(caller)


Writer = Annotated[Caller, Depends(writer)]


async def form_session(request: Request, caller: Reader) -> Caller:
    fields = await read_form(request)
    if caller.csrf and not same(fields.get("csrf", ""), caller.csrf):
        raise HTTPException(403, "the request has no valid CSRF token: reload the page and try again")
    return caller


FormSession = Annotated[Caller, Depends(form_session)]


def form_writer(caller: FormSession) -> Caller:
    return _may_write(caller)


FormWriter = Annotated[Caller, Depends(form_writer)]


def _may_write(caller: Caller) -> Caller:
    if caller.user.read_only:
        raise HTTPException(403, f"{caller.user.name} is an auditor: auditors read, they do not change anything")
    return caller


def json_of(kind: type[T]) -> Any:
    """A dependency: the JSON body as ``kind``, read once the caller may write."""

    async def body(request: Request, _: Writer) -> T:
        data = read_json(await request.body())
        if not isinstance(data, dict):  # every body of the API is an object
            raise HTTPException(400, "the body must be a JSON object")
        return validated(kind, data)

    return Depends(body)


def form_of(kind: type[T]) -> Any:
    """A dependency: the form's fields as ``kind`` (lax: a form's values are text), read once its CSRF token holds."""

    async def fields(request: Request, _: FormSession) -> T:
        return validated(kind, await read_form(request), strict=False)

    return Depends(fields)


def same(given: str, expected: str) -> bool:
    """A constant-time comparison that takes any text (compare_digest refuses non-ASCII str)."""
    return hmac.compare_digest(given.encode(), expected.encode())
