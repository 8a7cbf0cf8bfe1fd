"""``plangate mcp serve``: the catalogue offered to any MCP client, under the policy (see docs/mcp.md)."""

from __future__ import annotations

import re
from pathlib import Path

import click

from plangate._extras import need
from plangate.cli._common import db_option, identity_options, open_runtime, policy_option, tools_option
from plangate.errors import UsageError
from plangate.mcpserver import DASHBOARD_URL

_ADDRESS = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\[\]]+)):(?P<port>\d{1,5})$")


@click.group("mcp")
def mcp_group() -> None:
    """plangate and MCP: serve a catalogue to MCP clients, governed."""


@mcp_group.command("serve")
@tools_option
@policy_option
@db_option
@identity_options
@click.option(
    "--http",
    "address",
    metavar="HOST:PORT",
    help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio. Give a loopback host (127.0.0.1) "
    "unless every client that can reach the address may act as you.",
)
@click.option(
    "--dashboard-url",
    default=DASHBOARD_URL,
    show_default=True,
    metavar="URL",
    help="Where reviewers approve plans: answers link to URL/plans/ID.",
)
@click.option(
    "--category",
    metavar="NAME",
    help="Category of the plans single calls make (default: the first of the policy's categories "
    "that admits the tool).",
)
def serve_command(
    *,
    tools_spec: str,
    policy_file: Path | None,
    db: str | None,
    user: str | None,
    token: str | None,
    address: str | None,
    dashboard_url: str,
    category: str | None,
) -> None:
    """Serve the tools of MODULE to MCP clients (stdio by default), every call under the policy.

    Read tools run at once when the policy clears them without a person, and are recorded.
    A call of a tool that writes only proposes a one-step plan and answers with its id and
    a link: nothing with an effect runs from an MCP call. A person approves it (dashboard,
    plangate approve), and it runs by plangate execute or a worker. The plans are requested
    by you: --as in local mode, your token's account once the store has accounts.

    \b
    Example (a desktop MCP client's configuration starts this):
      plangate mcp serve --tools examples/business.py --policy examples/policy.yaml --as alice
    """
    need("mcp", "mcp serve")
    where = _address(address) if address else None
    from plangate import _mcpwire
    from plangate.mcpserver import Gate

    runtime = open_runtime(db, tools_spec, policy_file)
    gate = Gate(runtime, user=user, token=token, category=category, dashboard_url=dashboard_url)
    try:
        if where is None:
            _mcpwire.serve_stdio(gate)
            return
        host, port = where
        as_whom = gate.requester("submit")
        if host not in _mcpwire.LOOPBACK:
            click.echo(f"plangate: warning: {host} is not loopback: whoever reaches it submits as {as_whom}", err=True)
        click.echo(f"plangate MCP server at http://{address}/mcp, submitting as {as_whom}", err=True)
        _mcpwire.serve_http(gate, host, port)
    finally:
        runtime.close()


def _address(text: str) -> tuple[str, int]:
    found = _ADDRESS.match(text)
    if found is None or not 0 < int(found["port"]) < 65536:
        raise UsageError(f"--http takes HOST:PORT (127.0.0.1:8421, [::1]:8421), not {text!r}")
    return found["v6"] or found["host"], int(found["port"])


COMMANDS = [mcp_group]
