"""Where time and ids come from, so that a run can be replayed exactly."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    """The engine's only source of time and fresh ids."""

    def now(self) -> datetime: ...

    def new_id(self) -> str: ...


class SystemClock:
    """Wall-clock UTC time and random UUIDs."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def new_id(self) -> str:
        return str(uuid.uuid4())


def iso(moment: datetime) -> str:
    """A timestamp as stored: ISO 8601 in UTC, microseconds, with a ``Z``."""
    if moment.tzinfo is not UTC:
        moment = moment.astimezone(UTC)
    return moment.isoformat(timespec="microseconds")[:-6] + "Z"  # "+00:00" said as "Z"


def parse_iso(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
