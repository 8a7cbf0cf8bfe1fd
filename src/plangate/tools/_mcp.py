"""MCP servers as tools: each tool a server lists becomes a plangate tool.

Its parameters come from the tool's ``inputSchema``, its output from ``outputSchema`` (the
call's ``structuredContent``) or, without one, the text the call returned. The server's
annotations are hints from a party plangate does not trust, so a missing hint reads as the
safe answer, and the policy's ``tools`` section may set any of them (:mod:`plangate._overrides`):

==================================  ==========================================
annotation                          plangate
==================================  ==========================================
``readOnlyHint: true``              effect ``read`` (idempotent unless ``idempotentHint: false``)
``destructiveHint: true``           effect ``irreversible``
``destructiveHint: false``          effect ``write``
neither                             effect ``write``
``idempotentHint: true``            idempotent (else not)
``openWorldHint: false``            not external (else external)
==================================  ==========================================

Every MCP tool's output is untrusted, and each call carries the step's idempotency key in
the request's ``_meta`` (``plangate/idempotency_key``, with ``plangate/plan_id``,
``plangate/step_id`` and ``plangate/attempt``). A result the server marks ``isError`` is
the tool failing. A result over the connection's ``max_result_bytes`` (as JSON) is refused
whole; since the server answered, the call's outcome is unknown (unless it said it failed).
Over HTTP an answer far past it (more than the JSON of a result of that size can take) is cut
off while read, and its outcome is unknown too: what it said was never read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from plangate.errors import CatalogueError, OutcomeUnknownError, RefusedInputError
from plangate.tools._context import RunContext
from plangate.tools._mcpconn import McpConnection
from plangate.tools._schematool import schema_tool
from plangate.tools._tool import Effect, Tool

CTX = "_plangate_ctx"  # the run context's parameter: never a parameter a plan can set
META = "plangate/"


class McpToolError(RuntimeError):
    """The server answered the call with an error result (``isError``)."""


def hints(annotations: Any) -> tuple[Effect, bool, bool]:
    """``(effect, idempotent, external)`` from a tool's annotations, the safe answer where one is missing."""
    read_only = getattr(annotations, "read_only_hint", None)
    destructive = getattr(annotations, "destructive_hint", None)
    idempotent = getattr(annotations, "idempotent_hint", None)
    open_world = getattr(annotations, "open_world_hint", None)
    effect: Effect = "read" if read_only is True else "irreversible" if destructive is True else "write"
    repeatable = idempotent is not False if effect == "read" else idempotent is True
    return effect, repeatable, open_world is not False


def mcp_tools(connection: McpConnection, prefix: str = "") -> list[Tool]:
    """The server's tools, named ``prefix`` + their name on the server."""
    server, version = connection.server()
    made: list[Tool] = []
    for listed in connection.list_tools():
        effect, idempotent, external = hints(listed.annotations)
        params = {k: v for k, v in dict(listed.input_schema).items() if k != "title"}
        output = dict(listed.output_schema) if listed.output_schema is not None else None
        origin = {"source": connection.spec.text, "server": server, "version": version, "tool": listed.name}
        made.append(
            schema_tool(
                name=prefix + listed.name,
                fn=_caller(connection, listed.name, structured=output is not None),
                params_schema=params,
                output_schema=output,
                ctx_param=CTX,
                description=(listed.description or listed.title or "").strip(),
                effect=effect,
                idempotent=idempotent,
                external=external,
                scopes=(),
                resource=None,
                compensate=None,
                untrusted_output=True,
                tags=("mcp",),
                origin=origin,
            )
        )
    return made


def _caller(connection: McpConnection, name: str, *, structured: bool) -> Callable[..., Any]:
    def call(**kwargs: Any) -> Any:
        ctx = kwargs.pop(CTX, None)
        try:
            result = connection.call_tool(name, kwargs, meta(ctx))
        except CatalogueError:
            raise  # the session could not be opened, or is not the one approved: nothing was sent
        except RefusedInputError as exc:  # an answer over the bound, cut off while read: the server answered
            raise OutcomeUnknownError(
                f"the MCP tool {name!r}: {exc} (max_result_bytes is {connection.max_result_bytes}): its output is "
                "refused, and the call's effect may have happened"
            ) from None
        except Exception as exc:
            if _answered(exc):
                raise
            raise OutcomeUnknownError(
                f"the connection to MCP server {connection.spec.text!r} broke during the call of {name!r} "
                f"({type(exc).__name__}: {exc}); the server may have made the call's effect"
            ) from exc
        return output(name, result, structured=structured, limit=connection.max_result_bytes)

    call.__name__ = name
    return call


def _answered(exc: Exception) -> bool:
    """Whether the server answered the call with a JSON-RPC error (it said no), not a broken connection."""
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED

    return isinstance(exc, MCPError) and exc.code != CONNECTION_CLOSED


def meta(ctx: RunContext | None) -> dict[str, Any]:
    """The request's ``_meta``: which step of which plan calls, under which idempotency key."""
    if ctx is None:
        return {}
    found: dict[str, Any] = {
        META + "idempotency_key": ctx.idempotency_key,
        META + "plan_id": ctx.plan_id,
        META + "step_id": ctx.step_id,
        META + "attempt": ctx.attempt,
    }
    if ctx.trace_context:
        found["traceparent"] = ctx.trace_context
    return found


def output(name: str, result: Any, *, structured: bool, limit: int) -> Any:
    """The call's output: its structured content when the tool declares an output schema, else its text.

    A result over ``limit`` bytes (as JSON) is refused whole: the server answered, so the call's effect
    may have happened, unless it said the call failed.
    """
    size = len(result.model_dump_json(by_alias=True, exclude_none=True).encode())
    if size > limit:
        said = f"{size} bytes, over the limit of {limit} bytes (max_result_bytes)"
        if result.is_error:
            raise McpToolError(f"the MCP tool {name!r} reported an error of {said}: not shown")
        raise OutcomeUnknownError(
            f"the MCP tool {name!r} answered with {said}: its output is refused, and the call's effect may have "
            "happened"
        )
    text = "\n".join(_text(part) for part in result.content or ())
    if result.is_error:
        raise McpToolError(text.strip() or f"the MCP tool {name!r} reported an error and said nothing more")
    if not structured:
        return text
    if result.structured_content is None:
        try:
            return json.loads(text)  # an older server: the JSON in its text
        except ValueError:
            raise McpToolError(
                f"the MCP tool {name!r} declares an output schema but returned no structured content"
            ) from None
    return result.structured_content


def _text(part: Any) -> str:
    if getattr(part, "type", None) == "text":
        return str(part.text)
    mime = getattr(part, "mime_type", None) or getattr(part, "type", "content")
    return f"[{mime} content, not shown]"
