"""HTTP answers read with a limit: transports for httpx2 clients that stop reading a body past its bound.

The SDKs plangate talks through (the model providers', MCP's) read an answer whole before
anything looks at its size, so a hostile or misdirected server could send gigabytes. Through
these transports a client stops at the limit instead: reading fails with a
:class:`~plangate.errors.RefusedInputError` that names the limit, and the connection is
closed, so the server cannot finish writing. Compression is asked not to be used, since a
body of a few megabytes could unpack to gigabytes after it was counted; a body compressed
anyway is refused. Content types in ``unbounded`` pass as they are: an MCP event stream
is many messages, each bounded by the SDK's reader.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx2

from plangate._input import refuse
from plangate.errors import RefusedInputError

__all__ = ["AsyncBoundedTransport", "BoundedTransport"]


class BoundedTransport(httpx2.BaseTransport):
    """``inner`` (a plain ``HTTPTransport`` by default), with each answer's body held to ``limit`` bytes."""

    def __init__(
        self, limit: int, *, what: str, inner: httpx2.BaseTransport | None = None, unbounded: tuple[str, ...] = ()
    ) -> None:
        self.limit, self.what, self.unbounded = limit, what, unbounded
        self.inner = inner or httpx2.HTTPTransport()
        self.refused: RefusedInputError | None = None  # the last answer refused, if any

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        request.headers["Accept-Encoding"] = "identity"
        response = self.inner.handle_request(request)
        if not _passes(response, self.unbounded):
            response.stream = _Bounded(response, self)
        return response

    def close(self) -> None:
        self.inner.close()


class AsyncBoundedTransport(httpx2.AsyncBaseTransport):
    """The asynchronous :class:`BoundedTransport`."""

    def __init__(
        self,
        limit: int,
        *,
        what: str,
        inner: httpx2.AsyncBaseTransport | None = None,
        unbounded: tuple[str, ...] = (),
    ) -> None:
        self.limit, self.what, self.unbounded = limit, what, unbounded
        self.inner = inner or httpx2.AsyncHTTPTransport()
        self.refused: RefusedInputError | None = None  # the last answer refused, if any

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        request.headers["Accept-Encoding"] = "identity"
        response = await self.inner.handle_async_request(request)
        if not _passes(response, self.unbounded):
            response.stream = _AsyncBounded(response, self)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def _passes(response: httpx2.Response, unbounded: tuple[str, ...]) -> bool:
    kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
    return kind in unbounded


class _Counter:
    """The bytes of one body so far; refuses the body once they pass the limit, or when it is compressed."""

    def __init__(self, response: httpx2.Response, transport: BoundedTransport | AsyncBoundedTransport) -> None:
        self.transport, self.seen = transport, 0
        self.encoding = response.headers.get("content-encoding", "identity").strip().lower()

    def count(self, chunk: bytes) -> bytes:
        if self.encoding not in ("", "identity"):
            self._refuse(
                "compressed",
                f"the answer is compressed ({self.encoding}) though asked not to be: its size once unpacked "
                "cannot be bounded while read",
            )
        self.seen += len(chunk)
        if self.seen > self.transport.limit:
            self._refuse("too-large", f"the answer is over the limit of {self.transport.limit} bytes: reading stopped")
        return chunk

    def _refuse(self, rule: str, detail: str) -> None:
        self.transport.refused = refuse(self.transport.what, rule, detail)
        raise self.transport.refused


class _Bounded(httpx2.SyncByteStream):
    def __init__(self, response: httpx2.Response, transport: BoundedTransport) -> None:
        self.stream, self.counter = response.stream, _Counter(response, transport)

    def __iter__(self) -> Iterator[bytes]:
        assert isinstance(self.stream, httpx2.SyncByteStream)
        for chunk in self.stream:
            yield self.counter.count(chunk)

    def close(self) -> None:
        assert isinstance(self.stream, httpx2.SyncByteStream)
        self.stream.close()


class _AsyncBounded(httpx2.AsyncByteStream):
    def __init__(self, response: httpx2.Response, transport: AsyncBoundedTransport) -> None:
        self.stream, self.counter = response.stream, _Counter(response, transport)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        assert isinstance(self.stream, httpx2.AsyncByteStream)
        async for chunk in self.stream:
            yield self.counter.count(chunk)

    async def aclose(self) -> None:
        assert isinstance(self.stream, httpx2.AsyncByteStream)
        await self.stream.aclose()
