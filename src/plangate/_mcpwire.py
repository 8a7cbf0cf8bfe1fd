"""The MCP SDK's side of ``plangate mcp serve``: a :class:`~plangate.mcpserver.Gate` over stdio or streamable HTTP.

Imported only once the ``mcp`` extra is known to be there. The gate is synchronous (the
runtime's store and engine); each call is taken on a worker thread, so the server's event
loop stays free and the engine may run its own loop for a read it executes.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server

from plangate import __version__
from plangate.mcpserver import Gate, Offer

INSTRUCTIONS = (
    "plangate governs these tools. Read tools run at once when the policy clears them, and are recorded. "
    "Every tool with an effect only proposes a plan: the answer is a plan id and a link where a person "
    "approves it; it runs after that, never from this server. Ask plangate_plan_status and "
    "plangate_plan_result about a plan; build a plan of several steps with plangate_submit_plan or "
    "plangate_draft_add and plangate_draft_submit."
)
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def server(gate: Gate) -> Server[Any]:
    """The low-level MCP server answering ``tools/list`` and ``tools/call`` from the gate."""
    tools = [_tool(offer) for offer in gate.offers()]
    limiter = anyio.CapacityLimiter(1)

    async def list_tools(ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
        arguments = dict(params.arguments or {})
        reply = await anyio.to_thread.run_sync(gate.call, params.name, arguments, limiter=limiter)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=reply.text)],
            structured_content=reply.data,
            is_error=reply.error,
        )

    return Server(
        "plangate",
        version=__version__,
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _tool(offer: Offer) -> types.Tool:
    hints = offer.annotations
    return types.Tool(
        name=offer.name,
        description=offer.description,
        input_schema=offer.input_schema,
        annotations=types.ToolAnnotations(
            title=hints.get("title"),
            read_only_hint=hints["readOnlyHint"],
            destructive_hint=hints["destructiveHint"],
            idempotent_hint=hints["idempotentHint"],
            open_world_hint=hints["openWorldHint"],
        ),
    )


def serve_stdio(gate: Gate) -> None:
    """Serve one client on standard input and output until it closes them."""
    app = server(gate)

    async def main() -> None:
        async with stdio_server() as (read, write):
            await app.run(read, write, app.create_initialization_options())

    anyio.run(main)


def serve_http(gate: Gate, host: str, port: int) -> None:
    """Serve streamable HTTP at ``http://HOST:PORT/mcp`` until stopped (on loopback, DNS rebinding is refused)."""
    import uvicorn

    app = server(gate).streamable_http_app(host=host)
    uvicorn.run(app, host=host, port=port, log_level="warning")
