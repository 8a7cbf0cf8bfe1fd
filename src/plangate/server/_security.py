"""What holds at every door, before any route runs: plain ASGI middleware.

- :class:`SecurityHeaders`: every response says it may not be framed, sniffed, cached or
  leak its address, and which sources a page may load (a CSP with no inline script or style).
- :class:`BodyLimit`: a body is counted while it streams in, and refused with 413 as soon
  as it passes :data:`MAX_BODY` (by its Content-Length, or chunk by chunk when it has none),
  before anything parses it.
- :class:`SameOrigin`: a request that changes something and says it comes from another
  site (``Origin``, or ``Sec-Fetch-Site``) is refused, whatever cookies it carries.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from plangate.server._errors import reply

MAX_BODY = 1_048_576
CSP = "default-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'"
HEADERS = (
    ("Content-Security-Policy", CSP),
    ("X-Frame-Options", "DENY"),
    ("X-Content-Type-Options", "nosniff"),
    # same-origin, not no-referrer: with no-referrer a browser sends "Origin: null" on a form's POST
    ("Referrer-Policy", "same-origin"),
    ("Cache-Control", "no-store"),
)
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})


class SecurityHeaders:
    """Adds :data:`HEADERS` to every response that does not set its own."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in HEADERS:
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, with_headers)


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` when the bytes read so far pass the limit; answered as 413."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the body is over the limit of {limit} bytes")


class BodyLimit:
    """Refuse a body over ``limit`` bytes while it streams in, before anything parses it."""

    def __init__(self, app: ASGIApp, limit: int = MAX_BODY) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length")
        if length is not None and not (length.isascii() and length.isdigit() and int(length) <= self.limit):
            too_large = BodyTooLarge(self.limit)
            await reply(scope, 413, str(too_large.detail))(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, counted, send)


class SameOrigin:
    """Refuse state-changing requests that a browser says come from another site.

    Browsers send ``Origin`` on every POST (and ``Sec-Fetch-Site``); it must name this
    server (the ``Host`` it was asked for) or one of ``origins``. Clients that are not
    browsers send neither, and are held by their token or the CSRF token instead.
    """

    def __init__(self, app: ASGIApp, origins: Iterable[str] = ()) -> None:
        self.app, self.origins = app, frozenset(o.rstrip("/") for o in origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in _SAFE:
            problem = self.cross_site(Headers(scope=scope))
            if problem is not None:
                await reply(scope, 403, problem)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def cross_site(self, headers: Headers) -> str | None:
        origin = headers.get("origin")
        if origin is not None:
            if origin in self.origins or _names_host(origin, headers.get("host", "")):
                return None
            return f"a request from another site ({origin[:100]}) may not change anything here"
        site = headers.get("sec-fetch-site")
        if site is not None and site not in ("same-origin", "none"):
            return f"a request from another site (Sec-Fetch-Site: {site[:40]}) may not change anything here"
        return None


def _names_host(origin: str, host: str) -> bool:
    """Whether ``origin`` (``scheme://host[:port]``) names the host the request was sent to."""
    try:
        parts = urlsplit(origin)
    except ValueError:  # not a URL at all
        return False
    if parts.scheme not in ("http", "https") or not parts.netloc or not host:
        return False
    default = ":443" if parts.scheme == "https" else ":80"
    return parts.netloc.lower().removesuffix(default) == host.lower().removesuffix(default)
