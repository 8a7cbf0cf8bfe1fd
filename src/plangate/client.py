"""A client of plangate's JSON API: the command line's ``--server URL`` mode.

Remote operators do not need the database or the audit key: the server holds both, and
authenticates each call with the operator's API token (``Authorization: Bearer``). The
server's refusals come back as plangate's own errors, so the command line prints them and
exits with the same codes as it does against a local store::

    401 -> SignInRequiredError   403 -> NotPermittedError   404 -> NotFoundError
    409 -> GovernanceError       400, 413, 422 -> InputError   429 -> GovernanceError
    anything else -> ServerError (a 500 carries the id the server logged it under)

(the server's side of the same table is :data:`plangate.errors.HTTP_STATUS`)
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from plangate.errors import HTTP_STATUS, GovernanceError, InputError, PlangateError, UsageError

SERVER_VARIABLE = "PLANGATE_SERVER"
_REFUSALS: dict[int, type[PlangateError]] = {
    **{status: kind for kind, status in reversed(HTTP_STATUS)},  # the most specific class wins
    422: InputError,
    400: InputError,
    413: InputError,
    429: GovernanceError,
}


class ServerError(PlangateError):
    """The server failed in a way that is not a refusal (a 500, a reply that is not JSON)."""


class Client:
    """The JSON API of the plangate server at ``url``, as ``token``'s account."""

    def __init__(self, url: str, token: str | None, *, timeout: float = 60.0, transport: Any = None) -> None:
        try:
            import httpx2 as httpx
        except ImportError:  # pragma: no cover - httpx2 comes with plangate
            raise UsageError("the command line's --server mode needs httpx2: pip install plangate") from None
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"--server takes the server's address, such as https://plangate.example:8420, not {url!r}")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, **params: Any) -> Any:
        """One API call: the reply's JSON, or plangate's error for the refusal."""
        import httpx2 as httpx

        query = {k: v for k, v in params.items() if v is not None}
        try:
            reply = self._http.request(method, f"/api{path}", json=body, params=query or None)
        except httpx.HTTPError as exc:
            raise UsageError(f"cannot reach the plangate server at {self.url}: {exc}") from None
        try:
            data = reply.json()
        except ValueError:
            data = None
        if reply.is_success:
            if data is None and reply.content:
                raise ServerError(f"the server at {self.url} answered {path} with something that is not JSON")
            return data
        message = data.get("error") if isinstance(data, dict) else None
        text = str(message or reply.reason_phrase or "no reason given")
        if reply.status_code == 429 and (wait := reply.headers.get("retry-after")):
            text += f" (try again in {wait} s)"
        error = _REFUSALS.get(reply.status_code)
        if error is None:
            raise ServerError(f"the server failed ({reply.status_code}): {text}")
        raise error(text)

    def plan_path(self, plan_id: str, action: str = "") -> str:
        return f"/plans/{quote(plan_id, safe='')}" + (f"/{action}" if action else "")
