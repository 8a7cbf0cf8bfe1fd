"""A small MCP server for the tests, run as a subprocess: ``mcpserver.py http PORT LOG`` or ``stdio STATE``.

Over HTTP its tools write each call (arguments and the request's ``_meta``) to LOG, one JSON line
each; ``record`` has no annotations, so plangate must treat it as a write that is not idempotent;
``pair`` answers once a second call of it is in flight, so two plans' calls overlap.
Over stdio its ``greet`` tool's schema follows the STATE file (``v1`` or ``v2``), so a test can
change the server's schema between a plan's approval and its run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations


def http(port: int, log: Path) -> None:
    server = MCPServer("recorder")

    @server.tool(structured_output=False)  # no output schema: its output is the text
    def record(note: str, ctx: Context) -> str:
        """Record a note (an effect: it is written down)."""
        meta = dict(ctx.request_context.meta or {})
        with log.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"note": note, "meta": meta}) + "\n")
        return f"recorded {note}"

    waiting: list[anyio.Event] = []

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True), structured_output=False)
    async def pair(note: str, ctx: Context) -> str:
        """Answer once a second call is in flight beside this one: the note and the call's idempotency key."""
        here = anyio.Event()
        waiting.append(here)
        if len(waiting) == 2:
            for each in waiting:
                each.set()
            waiting.clear()
        await here.wait()
        return f"{note} {dict(ctx.request_context.meta or {})['plangate/idempotency_key']}"

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def broken(why: str) -> str:
        """Always fails."""
        raise ValueError(f"broken: {why}")

    server.run("streamable-http", host="127.0.0.1", port=port)


def stdio(state: Path) -> None:
    server = MCPServer("greeter")
    read_only = ToolAnnotations(readOnlyHint=True, openWorldHint=False)
    if state.read_text().strip() == "v1":

        @server.tool(annotations=read_only)
        def greet(name: str) -> str:
            """Greet someone."""
            return f"hello {name}"
    else:

        @server.tool(annotations=read_only)
        def greet(name: str, title: str) -> str:
            """Greet someone, by title."""
            return f"hello {title} {name}"

    server.run("stdio")


if __name__ == "__main__":
    if sys.argv[1] == "http":
        http(int(sys.argv[2]), Path(sys.argv[3]))
    else:
        stdio(Path(sys.argv[2]))
