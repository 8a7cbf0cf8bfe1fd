"""One connection to an MCP server, held open on a thread of its own for as long as its catalogue lives.

The SDK is asynchronous and its sessions belong to the event loop that opened them, while
plangate calls tools from many places (the engine's loop, its threads, ReAct, a rollback).
So each connection runs its own event loop on a daemon thread: one task there holds the
transport and the session open, and callers on any thread hand it requests and wait for the
answers. A connection that broke (the server exited, the HTTP session ended) is opened again
on the next call; :meth:`McpConnection.close` ends it, and a later call opens it again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import shlex
import tempfile
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from plangate._extras import need
from plangate.errors import CatalogueError

if TYPE_CHECKING:  # imported where used, as the SDK is: a Temporal workflow's sandbox imports plangate whole
    from plangate._bounded import AsyncBoundedTransport
    from plangate.tools._mcpstdio import LineBound

PREFIX = "mcp:"
CONNECT_SECONDS = 30.0
MAX_PAGES = 1_000  # of a tool list: a server that hands out cursor after cursor is not listing tools
MAX_TOOLS = 10_000
MAX_RESULT_BYTES = 1_048_576
"""The most a call's result may take, as JSON, unless its source says otherwise (as much as a plan)."""
_ESCAPED = 6  # the most bytes JSON may spend on one byte of text (``\u0000``): a result's bound on the wire
_ENVELOPE = 65_536  # the JSON-RPC message around a result: its id, its ``_meta``


@dataclass(frozen=True, kw_only=True)
class McpSpec:
    """Where an MCP server is: a command to start (stdio) or a URL (streamable HTTP)."""

    text: str
    """The spec as given, canonical: ``mcp:stdio:COMMAND ARGS...`` or ``mcp:http://HOST:PORT/PATH``."""
    command: tuple[str, ...] = ()
    url: str | None = None


def parse_spec(text: str) -> McpSpec:
    """An MCP spec from ``--tools`` text (with or without the ``mcp:`` prefix); one plain line when malformed."""
    body = text[len(PREFIX) :] if text.startswith(PREFIX) else text
    if body.startswith("stdio:"):
        try:
            command = tuple(shlex.split(body[len("stdio:") :]))
        except ValueError as exc:
            raise CatalogueError(f"MCP spec {text!r}: the command cannot be split into words: {exc}") from None
        if not command:
            raise CatalogueError(f"MCP spec {text!r}: give the command that starts the server: mcp:stdio:COMMAND ARGS")
        return McpSpec(text=PREFIX + "stdio:" + shlex.join(command), command=command)
    if body.startswith(("http://", "https://")):
        _check_url(text, body)
        return McpSpec(text=PREFIX + body, url=body)
    raise CatalogueError(
        f"MCP spec {text!r}: expected mcp:stdio:COMMAND ARGS... or mcp:http://HOST:PORT/PATH (streamable HTTP)"
    )


def _check_url(text: str, url: str) -> None:
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise CatalogueError(f"MCP spec {text!r}: not a valid URL: {exc}") from None
    if not parts.hostname or any(c.isspace() for c in url):
        raise CatalogueError(f"MCP spec {text!r}: not a valid URL: give http://HOST:PORT/PATH")


@dataclass(frozen=True, kw_only=True)
class _Held:
    session: Any
    init: Any
    stop: asyncio.Event
    task: concurrent.futures.Future[None]
    ended: threading.Event  # set when the session can take no more calls: the next call opens a new one
    bounded: AsyncBoundedTransport | LineBound  # what reads its answers (HTTP) or lines (stdio), and what it refused


class McpConnection:
    """A session with one MCP server, usable from any thread (see the module's docstring)."""

    def __init__(
        self, spec: McpSpec, *, connect_seconds: float = CONNECT_SECONDS, max_result_bytes: int = MAX_RESULT_BYTES
    ) -> None:
        need("mcp", f"MCP tools ({spec.text})")
        if max_result_bytes < 1:
            raise CatalogueError(f"MCP server {spec.text!r}: max_result_bytes must be at least 1")
        self.spec = spec
        self.connect_seconds = connect_seconds
        self.max_result_bytes = max_result_bytes
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._held: _Held | None = None
        self.opened = 0  # how many times a session was opened: the first, then each reconnection
        self._pinned: str | None = None  # the server and its tools as first listed: a reopened session must match

    # -- what callers use ------------------------------------------------------------------
    def server(self) -> tuple[str, str]:
        """The server's name and version, as its initialize result gives them."""
        info = self._session().init.server_info
        return str(info.name), str(info.version)

    def list_tools(self) -> list[Any]:
        """Every tool the server lists, page after page; the first listing is what a reopened session must match."""
        held = self._session()
        try:
            found = self._listing(held)
        except CatalogueError:
            raise
        except Exception as exc:  # noqa: BLE001 - a server whose listing cannot be read: one line that names it
            raise CatalogueError(f"MCP server {self._what()}: its tool list cannot be read: {_reason(exc)}") from None
        with self._lock:
            if self._pinned is None and self._held is held:
                self._pinned = _digest(held.init, found)
        return found

    def call_tool(self, name: str, arguments: dict[str, Any], meta: dict[str, Any]) -> Any:
        """The server's ``CallToolResult`` for one call; raises when the connection fails (then reopened next time)."""
        return self._run(lambda s: s.call_tool(name, arguments, meta=meta))

    def close(self) -> None:
        """End the session and its thread; a later call opens a new one."""
        with self._lock:
            self._drop()
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            if not thread.is_alive():
                loop.close()

    # -- the thread, the loop and the session ------------------------------------------------
    def _run(self, request: Any) -> Any:
        held = self._session()
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(request(held.session), self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            refused = held.bounded.refused
            if _ended(held) or refused:  # the transport or the session ended: open a new one next time
                with self._lock:
                    if self._held is held:
                        self._drop()
            if refused:
                raise refused from None  # an answer over the bound ended the session: that is why the call failed
            raise

    def _session(self) -> _Held:
        with self._lock:
            if self._held is not None and _ended(self._held):
                self._drop()
            if self._held is None:
                self._held = self._open()
                self.opened += 1
                if self._pinned is not None:
                    self._same_as_pinned(self._held)
            return self._held

    def _listing(self, held: _Held) -> list[Any]:
        from mcp import types

        assert self._loop is not None
        found: list[Any] = []
        cursor: str | None = None
        deadline = time.monotonic() + self.connect_seconds  # the whole listing, every page, as for initialize
        for _ in range(MAX_PAGES):
            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            asked = asyncio.run_coroutine_threadsafe(held.session.list_tools(params=params), self._loop)
            try:
                page = asked.result(timeout=max(deadline - time.monotonic(), 0.0))
            except concurrent.futures.TimeoutError:
                asked.cancel()
                raise TimeoutError(f"no whole tool list within {self.connect_seconds:g} s") from None
            found.extend(page.tools)
            cursor = page.next_cursor
            if not cursor or len(found) > MAX_TOOLS:
                return found
        raise ValueError(f"the tool list goes on past {MAX_PAGES} pages")

    def _same_as_pinned(self, held: _Held) -> None:
        """A reopened session (the server restarted) must offer what the catalogue was made of, else it is drift."""
        try:
            now = _digest(held.init, self._listing(held))
        except Exception as exc:  # noqa: BLE001 - cannot tell: refuse, as for a change
            now = f"unreadable: {_reason(exc)}"
        if now != self._pinned:
            self._drop()
            raise CatalogueError(
                f"MCP server {self._what()} came back with other tools, schemas, annotations or version than "
                "when its catalogue was opened (drift): nothing was called; open the catalogue again so that "
                "plans are checked against what it offers now"
            )

    def _open(self) -> _Held:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="plangate-mcp", daemon=True)
            self._thread.start()
        ready: concurrent.futures.Future[_Held] = concurrent.futures.Future()
        with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as errlog:
            task = asyncio.run_coroutine_threadsafe(self._hold(ready, errlog), self._loop)
            try:
                return ready.result(timeout=self.connect_seconds)
            except concurrent.futures.TimeoutError:
                task.cancel()
                raise self._failed(f"no answer to initialize within {self.connect_seconds:g} s", errlog) from None
            except Exception as exc:  # noqa: BLE001 - whatever stopped it, one line that names the server
                raise self._failed(_reason(exc), errlog) from None

    async def _hold(self, ready: concurrent.futures.Future[_Held], errlog: Any) -> None:
        """The task that keeps the session open until told to stop (anyio needs one task for both ends)."""
        from mcp import ClientSession

        stop, ended = asyncio.Event(), threading.Event()
        bounded = self._bounded()
        try:
            async with (
                self._transport(errlog, bounded, ended) as (read, write),
                _watched(read, ended) as read,
                ClientSession(read, write) as session,
            ):
                init = await session.initialize()
                this = asyncio.current_task()
                assert this is not None
                ready.set_result(
                    _Held(session=session, init=init, stop=stop, task=_task_future(this), ended=ended, bounded=bounded)
                )
                await stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            if not isinstance(exc, Exception):
                raise

    def _bounded(self) -> AsyncBoundedTransport | LineBound:
        """What reads a session's answers: over HTTP, a plain JSON body is cut off past the bound while read (an
        event stream is many messages: the SDK bounds each event to the same); over stdio, each line (a message)."""
        from plangate._bounded import AsyncBoundedTransport
        from plangate.tools._mcpstdio import LineBound

        bound, what = self.max_result_bytes * _ESCAPED + _ENVELOPE, f"MCP server {self._what()}"
        if self.spec.url is None:
            return LineBound(bound, what=what)
        return AsyncBoundedTransport(bound, what=what, unbounded=("text/event-stream",))

    @contextlib.asynccontextmanager
    async def _transport(
        self, errlog: Any, bounded: AsyncBoundedTransport | LineBound, ended: threading.Event
    ) -> AsyncIterator[tuple[Any, Any]]:
        from plangate._bounded import AsyncBoundedTransport

        if self.spec.url is not None and isinstance(bounded, AsyncBoundedTransport):
            import httpx2
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

            timeout = httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT)
            async with (
                httpx2.AsyncClient(
                    transport=bounded, timeout=timeout, event_hooks={"response": [_gone(ended)]}
                ) as client,
                streamable_http_client(self.spec.url, http_client=client, max_sse_event_size=bounded.limit) as streams,
            ):
                yield streams[0], streams[1]
            return
        from plangate.tools._mcpstdio import LineBound, bounded_stdio

        assert isinstance(bounded, LineBound)
        async with bounded_stdio(self.spec.command, errlog, bounded) as streams:
            yield streams

    def _drop(self) -> None:
        """Tell the holding task to end its session (under the lock)."""
        held, self._held = self._held, None
        if held is None or self._loop is None or held.task.done():
            return
        self._loop.call_soon_threadsafe(held.stop.set)
        with contextlib.suppress(Exception):
            held.task.result(timeout=10)

    def _what(self) -> str:
        return f"command {shlex.join(self.spec.command)!r}" if self.spec.command else f"URL {self.spec.url}"

    def _failed(self, reason: str, errlog: Any) -> CatalogueError:
        what = self._what()
        errlog.flush()
        errlog.seek(0)
        said = [line.strip() for line in errlog.read()[-4000:].splitlines() if line.strip()]
        tail = f" (it said: {said[-1][:300]})" if said else ""
        return CatalogueError(f"MCP server {what} did not start: {reason}{tail}")


def _digest(init: Any, tools: list[Any]) -> str:
    """The server's name and version and each tool's name, schemas and annotations (not its description)."""
    info = init.server_info
    listed = [
        tool.model_dump(
            mode="json",
            by_alias=True,
            exclude_none=True,
            include={"name", "input_schema", "output_schema", "annotations"},
        )
        for tool in tools
    ]
    return json.dumps([str(info.name), str(info.version), listed], sort_keys=True, default=str)


def _ended(held: _Held) -> bool:
    """Whether a session can take no more calls: its server's messages ended, or its holding task did."""
    return held.ended.is_set() or held.task.done()


def _gone(ended: threading.Event) -> Any:
    """An HTTP response hook: a 404 to a request in a session says the server no longer has the session
    (it restarted, or ended it), and every later call in it would be refused the same way."""

    async def seen(response: Any) -> None:
        if response.status_code == 404 and "mcp-session-id" in response.request.headers:
            ended.set()

    return seen


@contextlib.asynccontextmanager
async def _watched(read: Any, ended: threading.Event) -> AsyncIterator[Any]:
    """The transport's messages, relayed; ``ended`` set as they end (the server exited, its output closed).

    The SDK's session then fails the calls in flight, but goes on as if open: every later call
    would fail at once, nothing sent, as if the connection broke during it. With ``ended`` set, the
    next call opens a new session instead.
    """
    import anyio

    sink, relayed = anyio.create_memory_object_stream[Any](0)

    async def relay() -> None:
        try:
            async for message in read:
                await sink.send(message)
        finally:
            ended.set()  # before the session sees the end: a call it fails finds the session ended
            sink.close()

    async with read:  # the session closes the stream it reads; this one is the relay's to close
        with sink, relayed:  # closed however it ends, the relay started or not
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(relay)
                yield relayed
                tasks.cancel_scope.cancel()


def _task_future(task: asyncio.Task[Any]) -> concurrent.futures.Future[None]:
    """A thread-safe view of whether the holding task has ended."""
    done: concurrent.futures.Future[None] = concurrent.futures.Future()
    task.add_done_callback(lambda _: done.set_result(None))
    return done


def _reason(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
