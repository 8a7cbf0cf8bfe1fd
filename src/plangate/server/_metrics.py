"""``GET /metrics``: this process's Prometheus metrics (``create_app(..., metrics=True)``; see docs/observability.md).

Like other exporters it needs no login by default: it says how many plans, steps and
tokens there were, under which tool, rule and model names, and nothing of any plan's
content. With ``metrics_token`` (``PLANGATE_METRICS_TOKEN`` for ``plangate serve``) a
scrape must carry ``Authorization: Bearer TOKEN``; ``plangate serve --no-metrics`` serves
no ``/metrics`` at all.
"""

from __future__ import annotations

import hmac

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse

from plangate import metrics


def router(db: str, token: str | None) -> APIRouter:
    """The route, counting in this process from now on, with the pending approvals read from ``db``."""
    registry = metrics.start(db)
    routes = APIRouter(include_in_schema=False)

    @routes.get("/metrics")
    def scrape(request: Request) -> Response:
        if token is not None and not _bearer_is(request.headers.get("authorization", ""), token):
            # a plain 401 for a scraper, not the dashboard's way to the login page
            return PlainTextResponse("metrics need the scrape token\n", 401, headers={"WWW-Authenticate": "Bearer"})
        body, content_type = metrics.exposition(registry, request.headers.get("accept", ""))
        return Response(body, media_type=content_type)

    return routes


def _bearer_is(header: str, token: str) -> bool:
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())
