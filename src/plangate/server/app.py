"""The dashboard and the JSON API, over the same runtime as the command line: ``create_app`` assembles them.

::

    SecurityHeaders        every response: CSP, no framing, no sniffing, no caching    (_security)
     └ BodyLimit           bodies counted as they stream in; 413 past 1 MiB            (_security)
        └ SameOrigin       browsers' cross-site requests may not change anything       (_security)
           └ CatchAll      an unexpected error: a 500 with an id, the trace in the log (_errors)
              └ routers    _auth (login), _pages (dashboard), _api (JSON), _slack, _docs, _metrics
                 over dependencies (_deps): a runtime per request, closed after the
                 response; who is calling; bodies read only once credentials hold

Sessions are signed cookies (HttpOnly, SameSite=Lax; ``__Host-`` and Secure unless
served on loopback over plain HTTP), expiring after ``session_hours``. Every form carries
a CSRF token bound to the session; JSON calls authenticate with an API token
(``Authorization: Bearer ...``) or with the session plus an ``X-CSRF-Token`` header.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from importlib import resources

from fastapi import FastAPI
from fastapi.templating import Jinja2Templates

from plangate._clock import Clock, SystemClock
from plangate._keys import SECRET_KEY
from plangate.policy import Policy
from plangate.record import PlanRecord
from plangate.server import _api, _auth, _docs, _errors, _metrics, _pages, _slack
from plangate.server._deps import Settings
from plangate.server._security import MAX_BODY, BodyLimit, SameOrigin, SecurityHeaders
from plangate.server._throttle import LoginThrottle
from plangate.store import default_url
from plangate.tools import Catalogue

__all__ = ["MAX_BODY", "create_app"]


def create_app(
    catalogue: Catalogue,
    policy: Policy | None = None,
    db: str | None = None,
    *,
    session_hours: float = 8.0,
    secure_cookies: bool = True,
    notify: Callable[[PlanRecord], str | None] | None = None,
    slack_signing_secret: str | None = None,
    api_docs: bool = False,
    origins: Iterable[str] = (),
    clock: Clock | None = None,
    metrics: bool = False,
    metrics_token: str | None = None,
) -> FastAPI:
    """The server's ASGI app. ``db`` is a store URL; each request opens its own connection and closes it.

    ``api_docs`` serves ``/docs``, ``/redoc`` and ``/openapi.json`` to logged-in callers.
    ``origins`` are more origins (``https://gov.example.com``) whose forms are accepted,
    for a proxy that changes the ``Host`` header. ``clock`` is the time of the login
    throttle, sessions and token expiry. ``metrics`` serves ``/metrics`` (Prometheus's text
    format) and starts counting in this process; ``metrics_token``, when given, must come
    with each scrape as a bearer token.
    """
    app = FastAPI(
        title="plangate",
        description="Plans: submit, review, approve, execute, trace.",
        version="0.1.0",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    secret = SECRET_KEY.get()  # from PLANGATE_SECRET_KEY or its key file: never from the database
    app.state.plangate = Settings(
        catalogue=catalogue,
        policy=policy,
        db=db,
        notify=notify,
        slack_signing_secret=slack_signing_secret,
        secret=secret,
        max_age=int(session_hours * 3600),
        secure_cookies=secure_cookies,
        templates=Jinja2Templates(directory=str(resources.files("plangate").joinpath("server", "templates"))),
        throttle=LoginThrottle(clock=clock),
        clock=clock or SystemClock(),
    )
    for router in (_auth.router, _pages.router, _api.router, _slack.router):
        app.include_router(router)
    if api_docs:
        app.include_router(_docs.router)
    if metrics:
        app.include_router(_metrics.router(db or default_url(), metrics_token))
    _errors.install(app)  # the innermost middleware: CatchAll
    app.add_middleware(SameOrigin, origins=origins)
    app.add_middleware(BodyLimit)
    app.add_middleware(SecurityHeaders)
    return app
