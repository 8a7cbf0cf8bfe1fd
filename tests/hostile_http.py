"""A hostile HTTP server on loopback, in a thread of the test: it answers one kind of request with a huge body.

As an MCP server over streamable HTTP (:func:`mcp_answers`) it answers ``initialize`` and
``tools/list`` as a server should and every ``tools/call`` with a JSON body of ``size`` bytes;
as a model provider (:func:`model_answers`) it answers every request with a recorded reply
(tests/recordings) padded to ``size`` bytes. Each huge body is written in pieces, and the
server notes how far it got: a client that stops reading and closes the connection leaves it
unable to finish (``finished`` stays False once ``ended`` is set).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

PIECE = 65_536
Answer = Callable[[dict[str, Any]], tuple[bytes, bytes] | bytes | None]
"""From a request's JSON: ``(head, tail)`` to send with ``size`` bytes of padding between, plain bytes, or
None for 202 Accepted (a notification)."""


@dataclass
class Hostile:
    """The server's URL, the requests it received, and how far its huge body got."""

    url: str = ""
    size: int = 0
    received: list[dict[str, Any]] = field(default_factory=list)
    written: int = 0
    finished: bool = False
    ended: threading.Event = field(default_factory=threading.Event)


@contextmanager
def serving(answer: Answer, size: int, path: str = "/") -> Iterator[Hostile]:
    """A server on a free loopback port answering each POST as ``answer`` says."""
    hostile = Hostile(size=size)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            hostile.received.append(request)
            found = answer(request)
            if found is None:
                self._head(202, 0)
            elif isinstance(found, bytes):
                self._head(200, len(found))
                self.wfile.write(found)
            else:
                self._huge(*found)

        def do_GET(self) -> None:  # no event stream of the server's own
            self._head(405, 0)

        def do_DELETE(self) -> None:  # the session's end
            self._head(200, 0)

        def _head(self, status: int, length: int) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(length))
            self.send_header("Mcp-Session-Id", "hostile")
            self.end_headers()

        def _huge(self, head: bytes, tail: bytes) -> None:
            self._head(200, len(head) + hostile.size + len(tail))
            try:
                self.wfile.write(head)
                while hostile.written < hostile.size:
                    piece = min(PIECE, hostile.size - hostile.written)
                    self.wfile.write(b"x" * piece)
                    hostile.written += piece
                self.wfile.write(tail)
                hostile.finished = True
            except OSError:
                self.close_connection = True  # the client stopped reading and hung up
            finally:
                hostile.ended.set()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    hostile.url = f"http://127.0.0.1:{server.server_address[1]}{path}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hostile
    finally:
        server.shutdown()
        server.server_close()


def mcp_answers(tool: dict[str, Any]) -> Answer:
    """An MCP server listing ``tool`` and answering each call with a text of the server's ``size`` bytes."""

    def answer(request: dict[str, Any]) -> tuple[bytes, bytes] | bytes | None:
        method, ident = request.get("method"), request.get("id")
        if ident is None:
            return None
        if method == "tools/call":
            head = json.dumps({"jsonrpc": "2.0", "id": ident, "result": {"content": [{"type": "text", "text": ""}]}})
            cut = head.index('"text": "') + len('"text": "')
            return head[:cut].encode(), head[cut:].encode()
        if method == "initialize":
            result: dict[str, Any] = {
                "protocolVersion": request["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile-http", "version": "1"},
            }
        else:
            result = {"tools": [tool]} if method == "tools/list" else {}
        return json.dumps({"jsonrpc": "2.0", "id": ident, "result": result}).encode()

    return answer


def model_answers(recorded: dict[str, Any], field_path: tuple[str | int, ...]) -> Answer:
    """A model provider answering each request with ``recorded``, its text at ``field_path`` padded with x's."""

    def answer(request: dict[str, Any]) -> tuple[bytes, bytes]:
        marker = "\u0000PAD\u0000"
        reply = json.loads(json.dumps(recorded))
        where = reply
        for key in field_path[:-1]:
            where = where[key]
        where[field_path[-1]] = marker
        head, _, tail = json.dumps(reply).partition(json.dumps(marker)[1:-1])
        return head.encode(), tail.encode()

    return answer
