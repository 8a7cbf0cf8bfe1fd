"""The policy's ``tools`` section: what governance says a tool is, over what the tool says of itself.

An MCP server's annotations are hints from a party plangate does not trust, and a Python
tool's metadata is its author's word; either may be set here, by tool name pattern::

    tools:
      "git_*": {effect: write, scopes: ["repo:write"], resource: "repo:{repo_path}"}
      git_status: {effect: read, idempotent: true, external: false}
      "time_*": {untrusted_output: false}

Every pattern that matches a tool applies, in the order written, so a later one wins on a
field both set. The catalogue a runtime, the checker and the engine use is the catalogue
under its policy (:func:`governed`); a tool's ``overridden`` names the fields the policy set,
and ``plangate tools --policy`` marks them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic import Field

from plangate._justified import Justified
from plangate._patterns import matches_any
from plangate.errors import PolicyError, ToolDefinitionError
from plangate.tools import Catalogue, Effect, Tool
from plangate.tools._tool import _resource_template

if TYPE_CHECKING:
    from plangate.policy import Policy

FIELDS = ("effect", "idempotent", "external", "scopes", "resource", "untrusted_output")


class ToolOverride(Justified):
    """What the policy says of the tools a pattern names; a field left out keeps the tool's own."""

    effect: Effect | None = None
    idempotent: bool | None = None
    external: bool | None = None
    scopes: tuple[str, ...] | None = None
    resource: str | None = Field(default=None, description="What it touches; '{param}' is filled from the step.")
    untrusted_output: bool | None = None


def governed(catalogue: Catalogue, policy: Policy | None) -> Catalogue:
    """The catalogue as the policy says its tools are (itself when the policy says nothing of them)."""
    rules = policy.tools if policy is not None else None
    if not rules or policy is None:
        return catalogue
    return catalogue.with_changes(policy.hash, lambda tool: overridden(tool, rules))


def overridden(tool: Tool, rules: Mapping[str, ToolOverride]) -> Tool:
    changes: dict[str, Any] = {}
    for pattern, rule in rules.items():
        if matches_any((pattern,), tool.name):
            changes.update({k: getattr(rule, k) for k in FIELDS if getattr(rule, k) is not None})
    if not changes:
        return tool
    where = f"policy tools section, tool {tool.name!r}"
    try:
        if "resource" in changes:
            changes["_resource_parts"] = _resource_template(changes["resource"], tool.params_schema, where)
        return dataclasses.replace(tool, **changes, overridden=tuple(k for k in FIELDS if k in changes))
    except ToolDefinitionError as exc:
        raise PolicyError(str(exc)) from None


def origin(tool: Tool) -> dict[str, str]:
    """What an event says of where a step's tool comes from: for an MCP tool, the server and its name there."""
    if tool.origin is None:
        return {}
    found = {"source": tool.origin.get("source", "")}
    if "server" in tool.origin:
        found["server"] = f"{tool.origin['server']} {tool.origin.get('version', '')}".strip()
    if "tool" in tool.origin:
        found["server_tool"] = tool.origin["tool"]
    return found


def told_origin(data: Mapping[str, Any]) -> str | None:
    """What an event's data (as :func:`origin` wrote it) says of an MCP tool: ``NAME on MCP server SERVER``."""
    if "server_tool" not in data:
        return None
    return f"{data['server_tool']} on MCP server {data.get('server') or data['source']}"
