"""Your tools: typed Python functions with governance metadata (a starter; make it yours).

A plan can call only what is listed here. Each tool says what it does to the world
(``effect``), which permissions it needs (``scopes``) and what it touches (``resource``);
the policy decides who may use it and which plans need a person's approval.
"""

from __future__ import annotations

from typing_extensions import TypedDict  # pydantic needs this TypedDict on Python 3.11

from plangate import RunContext, tool

# Stands in for your system of record: each plangate command runs in a process of its own.
TICKETS = {
    "T-1": {"id": "T-1", "title": "Printer on fire", "status": "open"},
    "T-2": {"id": "T-2", "title": "Password reset", "status": "open"},
}


class Ticket(TypedDict):
    id: str
    title: str
    status: str


@tool(scopes=["tickets:read"], resource="ticket:{ticket_id}")
def get_ticket(ticket_id: str) -> Ticket:
    """Fetch one ticket."""
    found = TICKETS[ticket_id]
    return Ticket(id=found["id"], title=found["title"], status=found["status"])


@tool(effect="write", scopes=["tickets:write"], resource="ticket:{ticket_id}", idempotent=True)
def close_ticket(ticket_id: str, note: str, ctx: RunContext) -> str:
    """Close a ticket with a note (safe to repeat: the same run closes it once)."""
    TICKETS[ticket_id]["status"] = "closed"
    return f"closed {ticket_id}: {note} ({ctx.idempotency_key})"
