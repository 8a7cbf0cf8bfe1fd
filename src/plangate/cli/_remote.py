"""The command line as a client of a plangate server (``--server URL`` or ``PLANGATE_SERVER``).

Remote operators need neither the database nor the audit key: each command becomes one
or two calls to the server's JSON API, authenticated with the operator's token, and
prints what the same command prints against a local store. The server's policy and
tools are the ones that count, so ``--tools`` and ``--policy`` are not sent.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import click

from plangate.client import SERVER_VARIABLE, Client
from plangate.plandiff import PlanDiff
from plangate.record import PlanRecord
from plangate.rundiff import RunDiff
from plangate.store import Event, PlanQuery, PlanRow

server_option = click.option(
    "--server",
    metavar="URL",
    envvar=SERVER_VARIABLE,
    help="A plangate server to talk to instead of a local store (its JSON API, with your token). "
    f"Env: {SERVER_VARIABLE}.",
)


def client(server: str, token: str | None) -> Client:
    from plangate.identity import find_token

    return Client(server, find_token(token))


def record(api: Client, plan_id: str) -> PlanRecord:
    return PlanRecord.from_dict(api.call("GET", api.plan_path(plan_id)))


def submit(api: Client, plan: dict[str, Any]) -> PlanRecord:
    return PlanRecord.from_dict(api.call("POST", "/plans", plan))


def decide(api: Client, plan_id: str, action: str, body: dict[str, Any]) -> PlanRecord:
    return PlanRecord.from_dict(api.call("POST", api.plan_path(plan_id, action), body))


def rows(api: Client, query: PlanQuery, limit: int) -> list[PlanRow]:
    """The plans ``query`` selects among those the caller may see (its ``scope`` is the server's to set)."""
    wanted = {name: getattr(query, name) for name in ("status", "kind", "category", "order", "before", "after")}
    return [PlanRow(**row) for row in api.call("GET", "/plans", limit=limit, **wanted)]


def events(api: Client, plan_id: str) -> list[Event]:
    return [Event(**event) for event in api.call("GET", api.plan_path(plan_id, "trace"))]


def run(api: Client, plan_id: str, method: str) -> tuple[bool, str]:
    """Execute or resume on the server and wait: whether it succeeded, and the result's summary."""
    reply = api.call("POST", api.plan_path(plan_id, method))
    return bool(reply["ok"]), str(reply["summary"])


def edit(api: Client, plan_id: str, plan: dict[str, Any]) -> PlanRecord:
    return PlanRecord.from_dict(api.call("POST", api.plan_path(plan_id, "edit"), {"plan": plan}))


def diff(api: Client, plan_id: str, from_version: int | None, to_version: int | None) -> PlanDiff:
    versions: dict[str, Any] = {"from": from_version, "to": to_version}
    return PlanDiff.from_dict(api.call("GET", api.plan_path(plan_id, "diff"), **versions))


def compare(api: Client, plan_id: str, other: str) -> RunDiff:
    """Two plans' runs side by side, as the server tells them (both must be plans the caller may read)."""
    return RunDiff.from_dict(api.call("GET", api.plan_path(plan_id, f"compare/{quote(other, safe='')}")))
