"""Tools for the soak: quick steps that read and write a little, so the engine's own memory shows."""

from __future__ import annotations

from plangate import RunContext, tool


@tool
def lookup(n: int) -> dict[str, int]:
    """Read a record."""
    return {"n": n, "total": n * 3}


@tool(effect="write", idempotent=True)
def store_total(total: int, ctx: RunContext) -> str:
    """Write a total once per idempotency key."""
    return f"{ctx.idempotency_key}={total}"


@tool
def describe(text: str) -> str:
    """Say what was written."""
    return f"stored {text}"
