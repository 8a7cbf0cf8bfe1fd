"""Test doubles that ship with the tests: a fixed clock, and a plan builder."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any


class FixedClock:
    """Time that advances one millisecond per reading, and ids that count up: runs repeat exactly."""

    def __init__(self, start: datetime = datetime(2026, 11, 29, 9, 0, tzinfo=UTC)) -> None:
        self._ticks = itertools.count()
        self._ids = itertools.count(1)
        self.start = start

    def now(self) -> datetime:
        return self.start + timedelta(milliseconds=next(self._ticks))

    def new_id(self) -> str:
        return str(uuid.UUID(int=next(self._ids)))


def plan(*steps: dict[str, Any], category: str = "ops", task: str = "test") -> dict[str, Any]:
    return {"task": task, "category": category, "steps": [{"rationale": "needed", **s} for s in steps]}
