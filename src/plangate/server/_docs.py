"""The API's documentation (``create_app(..., api_docs=True)``): the OpenAPI document, Swagger UI and ReDoc.

Off by default. When on, each is behind the login like any page, and only the pages of a
logged-in caller may load the viewers' script from their CDN; the inline script that
starts them carries a nonce, so the CSP still allows no other inline script.
"""

from __future__ import annotations

import secrets
from typing import Any

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

from plangate.server._deps import Reader
from plangate.server._errors import root

router = APIRouter(include_in_schema=False)
CDN = "https://cdn.jsdelivr.net"


@router.get("/openapi.json")
def openapi(request: Request, _: Reader) -> JSONResponse:
    schema: dict[str, Any] = request.app.openapi()
    return JSONResponse(schema)


@router.get("/docs", response_class=HTMLResponse)
def swagger(request: Request, _: Reader) -> HTMLResponse:
    page = get_swagger_ui_html(openapi_url=f"{root(request.scope)}/openapi.json", title="plangate API")
    return _with_nonce(bytes(page.body).decode())


@router.get("/redoc", response_class=HTMLResponse)
def redoc(request: Request, _: Reader) -> HTMLResponse:
    page = get_redoc_html(
        openapi_url=f"{root(request.scope)}/openapi.json", title="plangate API", with_google_fonts=False
    )
    return _with_nonce(bytes(page.body).decode())


def _with_nonce(html: str) -> HTMLResponse:
    nonce = secrets.token_urlsafe(16)
    policy = (
        f"default-src 'self'; script-src 'self' {CDN} 'nonce-{nonce}'; style-src 'self' {CDN} 'unsafe-inline'; "
        f"img-src 'self' data: https://fastapi.tiangolo.com {CDN}; worker-src 'self' blob:; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'"
    )
    body = html.replace("<script>", f'<script nonce="{nonce}">')
    return HTMLResponse(body, headers={"Content-Security-Policy": policy})
