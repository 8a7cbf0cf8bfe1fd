"""An MCP server spoken to over its stdin and stdout, each line it writes read with a bound.

A server writes one JSON-RPC message a line. The SDK's ``stdio_client`` joins what it reads
until a newline comes, however long that takes: a hostile server could send one line of
gigabytes, held in memory until the call's time limit. This transport starts the server as
the SDK does (a session of its own, the SDK's inherited environment, stderr to the given log)
and reads each line with a bound: past it, reading stops, the session ends, and the call
fails with a refusal that names the limit, as an HTTP answer over its bound does
(:mod:`plangate._bounded`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from plangate._input import refuse
from plangate.errors import RefusedInputError

STOP_SECONDS = 2.0
"""As the SDK: how long a server has to exit once its stdin is closed, then its process group is ended."""


class LineBound:
    """The most one line of a server's output may take, and the line refused, if one was."""

    def __init__(self, limit: int, *, what: str) -> None:
        self.limit, self.what = limit, what
        self.refused: RefusedInputError | None = None


@contextlib.asynccontextmanager
async def bounded_stdio(command: tuple[str, ...], errlog: Any, bound: LineBound) -> AsyncIterator[tuple[Any, Any]]:
    """The started server's read and write streams, as the SDK's client gives them; the server ended on leaving."""
    import anyio
    from mcp.client.stdio import get_default_environment

    process = await anyio.open_process(
        list(command), env=get_default_environment(), stderr=errlog, start_new_session=True
    )
    sink, read_stream = anyio.create_memory_object_stream[Any](0)
    write_stream, source = anyio.create_memory_object_stream[Any](0)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(_read, process, sink, bound)
        tasks.start_soon(_write, process, source, sink)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):  # a cancelled caller still ends the server
                await _stop(process)
            tasks.cancel_scope.cancel()


async def _read(process: Any, sink: Any, bound: LineBound) -> None:
    """Hand the session each line as a message (a line that is none: its error, as the SDK does), until the
    output ends or a line runs past the bound; closing ``sink`` then ends the session."""
    import anyio
    import mcp_types as types
    from anyio.streams.buffered import BufferedByteReceiveStream
    from mcp.shared.message import SessionMessage

    lines = BufferedByteReceiveStream(process.stdout)
    async with sink:
        while True:
            try:
                line = await lines.receive_until(b"\n", bound.limit)
            except anyio.DelimiterNotFound:
                detail = f"a line is over the limit of {bound.limit} bytes: reading stopped"
                bound.refused = refuse(bound.what, "too-large", detail)
                return
            except (anyio.IncompleteRead, anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                return
            try:
                message: Any = SessionMessage(types.jsonrpc_message_adapter.validate_json(line, by_name=False))
            except ValueError as exc:
                message = exc
            try:
                await sink.send(message)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return


async def _write(process: Any, source: Any, sink: Any) -> None:
    """Write each message the session sends as one line; a server that stops reading ends the session."""
    import anyio

    try:
        async with source:
            async for message in source:
                text = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                await process.stdin.send((text + "\n").encode())
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        await sink.aclose()


async def _stop(process: Any) -> None:
    """Close the server's stdin and let it exit; past :data:`STOP_SECONDS`, end its whole process group."""
    import anyio
    from mcp.os.posix.utilities import terminate_posix_process_tree

    with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
        await process.stdin.aclose()
    with anyio.move_on_after(STOP_SECONDS):
        await process.wait()
    if process.returncode is None:
        await terminate_posix_process_tree(process, STOP_SECONDS)
    with anyio.move_on_after(STOP_SECONDS), contextlib.suppress(OSError):
        await process.aclose()
