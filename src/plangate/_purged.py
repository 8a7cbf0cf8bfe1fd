"""What a retention purge removes, and how a purged record says so (see :mod:`plangate.retention`).

A purge keeps what governance needs (who asked, who decided, on which hash, what the check
and the policy said, every transition) and removes the payloads: step parameters, outputs
and errors, the plan's text, a ReAct run's thoughts, arguments and observations, a
planning model's thinking. A purged event keeps the rest of its data and gains
``"purged": {"at": DATE, "seal": TAG}``, the tag made under the audit key (see
:meth:`plangate.audit.Chain.purge_seal`); a purged plan text is :func:`body` of the date.
"""

from __future__ import annotations

import json
from typing import Any

PAYLOADS = frozenset(
    {"params", "output", "error", "note", "thinking", "slots", "thought", "answer", "arguments", "text", "observation"}
)
"""The keys of an event's data that carry payloads."""

SHOWN = "(purged)"
"""What a purged payload reads as where one is shown."""


def purged_at(data: Any) -> str | None:
    """When the event with this data was purged, or None."""
    marker = data.get("purged") if isinstance(data, dict) else None
    return str(marker["at"]) if isinstance(marker, dict) and "at" in marker else None


def body(at: str) -> str:
    """The text a purged plan version keeps in place of the plan."""
    return json.dumps({"purged": at}, separators=(",", ":"))


def body_purged_at(text: str) -> str | None:
    """When a stored plan text was purged (it is :func:`body` of that date, exactly: nothing beside it), or None."""
    if not text.startswith('{"purged":'):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    at = data.get("purged") if isinstance(data, dict) else None
    return at if isinstance(at, str) and text == body(at) else None


def shown(data: dict[str, Any]) -> dict[str, Any]:
    """The data with each payload a purge removed reading :data:`SHOWN` (unchanged if it was never purged)."""
    if purged_at(data) is None:
        return data
    return {**{key: SHOWN for key in PAYLOADS}, **data}
