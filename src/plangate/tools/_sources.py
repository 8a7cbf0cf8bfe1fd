"""Where a catalogue's tools come from: what ``--tools`` names, and tools files that list several sources.

``--tools`` (and ``Catalogue.from_spec``) takes:

- ``mcp:stdio:COMMAND ARGS...``: an MCP server started as a subprocess, spoken to over stdio;
- ``mcp:http://HOST:PORT/PATH``: an MCP server over streamable HTTP;
- ``FILE.yaml`` (or ``.yml``): a tools file listing sources, each with an optional prefix::

      sources:
        - module: examples/business.py      # an import path or a .py file (relative to this file)
        - mcp: stdio:python -m mcp_server_time
          prefix: time_                     # time_get_current_time, time_convert_time
          max_result_bytes: 4194304         # an MCP server's results, as JSON (default 1 MiB)

- anything else: a Python module, as an import path or a ``.py`` file.

With ``$PLANGATE_EXTRACT_MODEL`` set (``PROVIDER:NAME``), the catalogue also holds the
quarantined extractor, ``extract`` (:mod:`plangate.tools.extract`), asking that model.

The same text is recorded with each plan it submits, so a worker or a later ``execute``
opens the same catalogue again.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from plangate import _input
from plangate.errors import CatalogueError, RefusedInputError
from plangate.tools._mcpconn import MAX_RESULT_BYTES, PREFIX, McpConnection, parse_spec
from plangate.tools._tool import Tool, problems

if TYPE_CHECKING:
    from plangate.tools._catalogue import Catalogue

MAX_TOOLS_FILE = 256 * 1024
YAML_SUFFIXES = (".yaml", ".yml")


class Source(BaseModel):
    """One entry of a tools file: a Python module or an MCP server, and the prefix its tools' names take."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    module: str | None = Field(default=None, min_length=1, description="An import path or a .py file.")
    mcp: str | None = Field(
        default=None, min_length=1, description="stdio:COMMAND ARGS... or http://HOST:PORT/PATH (mcp: optional)."
    )
    prefix: str = Field(default="", pattern=r"^[A-Za-z0-9_.\-]*$", max_length=50)
    max_result_bytes: int | None = Field(
        default=None, ge=1, description=f"An MCP server's results, as JSON, at most (default {MAX_RESULT_BYTES})."
    )

    @model_validator(mode="after")
    def _one_kind(self) -> Source:
        if (self.module is None) == (self.mcp is None):
            raise ValueError("give exactly one of 'module' and 'mcp'")
        if self.module is not None and self.max_result_bytes is not None:
            raise ValueError("max_result_bytes is for an MCP server's results, not a module's")
        return self


class ToolsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    sources: list[Source] = Field(min_length=1, max_length=100)


def from_spec(cls: type[Catalogue], spec: str) -> Catalogue:
    if spec.startswith(PREFIX):
        found = from_mcp(cls, spec)
    elif spec.lower().endswith(YAML_SUFFIXES):
        found = from_file(cls, Path(spec))
    else:
        found = cls.from_module(spec)
    return with_extractor(cls, found)


def with_extractor(cls: type[Catalogue], catalogue: Catalogue) -> Catalogue:
    """``catalogue`` and the ``extract`` tool when ``$PLANGATE_EXTRACT_MODEL`` names its model (and it has none)."""
    if "extract" in catalogue or not os.environ.get("PLANGATE_EXTRACT_MODEL"):
        return catalogue
    from plangate.tools.extract import from_environment

    made = from_environment()
    return catalogue if made is None else cls.combine([catalogue, cls([made])])


def from_mcp(
    cls: type[Catalogue],
    server: str | Sequence[str],
    *,
    prefix: str = "",
    connect_seconds: float = 30.0,
    max_result_bytes: int = MAX_RESULT_BYTES,
) -> Catalogue:
    from plangate.tools._mcp import mcp_tools

    spec = parse_spec(server if isinstance(server, str) else PREFIX + "stdio:" + shlex.join(server))
    connection = McpConnection(spec, connect_seconds=connect_seconds, max_result_bytes=max_result_bytes)
    try:
        return cls(mcp_tools(connection, prefix), holds=[connection])
    except BaseException:
        connection.close()
        raise


def from_file(cls: type[Catalogue], path: Path) -> Catalogue:
    where = str(path)
    try:
        data = _input.load_yaml(_input.read_text(path, what="tools file", limit=MAX_TOOLS_FILE), what=where)
        listed = ToolsFile.model_validate(data)
    except RefusedInputError as exc:
        raise CatalogueError(str(exc)) from None
    except ValidationError as exc:
        first = problems(exc.errors(include_url=False))[0]
        raise CatalogueError(f"tools file {where!r}: {first}") from None
    parts: list[Catalogue] = []
    try:
        for source in listed.sources:
            parts.append(_source(cls, source, path.parent))
        names = [t.name for part in parts for t in part]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise CatalogueError(
                f"tools file {where!r}: two sources have a tool named {twice[0]!r}: give one of them a prefix"
            )
        return cls.combine(parts)
    except BaseException:
        for part in parts:
            part.close()
        raise


def _source(cls: type[Catalogue], source: Source, base: Path) -> Catalogue:
    if source.mcp is not None:
        spec = source.mcp if source.mcp.startswith(PREFIX) else PREFIX + source.mcp
        return from_mcp(cls, spec, prefix=source.prefix, max_result_bytes=source.max_result_bytes or MAX_RESULT_BYTES)
    assert source.module is not None
    module = source.module
    if module.endswith(".py") or "/" in module:
        module = str((base / module).resolve())
    found = cls.from_module(module)
    return found if not source.prefix else cls([_prefixed(t, source.prefix) for t in found])


def _prefixed(found: Tool, prefix: str) -> Tool:
    """The tool under a prefixed name; a compensating tool is of the same source, so it takes the prefix too."""
    undo = prefix + found.compensate if found.compensate is not None else None
    return dataclasses.replace(found, name=prefix + found.name, compensate=undo)
