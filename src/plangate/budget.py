"""How much a planning model may think: a thinking budget set from the task's complexity.

The strongest signal is the number of steps the plan will need. Before a plan exists it
is estimated from the task's text: each clause that asks for an action ("refund invoice
42", "and tell the customer", "then close the ticket") is one step, plus one when the
task names a collection to go through ("each", "every", "all"); a template that matches
the task gives its exact step count instead. Weaker signals: the number of tools to
choose from, and the length of the task.

    tokens = base + per_step * steps + per_tool * tools + per_100_chars * len(task) / 100

clamped to [floor, ceiling]. OpenAI's reasoning models take a level instead: ``low``
below 2,048 tokens, ``high`` from 6,144, ``medium`` between. Every plan records the
budget it got and the tokens it used (``plangate usage``), so the constants can be
calibrated from history.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from plangate.models import Effort

_CLAUSES = re.compile(r"\b(?:and then|and|then|after that|also|finally)\b|[,;]|\n|\d+[.)]\s", re.IGNORECASE)
_COLLECTIONS = re.compile(r"\b(?:each|every|all)\b", re.IGNORECASE)


@dataclass(frozen=True, kw_only=True)
class Budget:
    tokens: int
    effort: Effort
    expected_steps: int
    signals: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class BudgetAllocator:
    base: int = 1024
    per_step: int = 768
    per_tool: int = 16
    per_100_chars: int = 64
    floor: int = 1024
    ceiling: int = 16_384

    def expected_steps(self, task: str) -> int:
        clauses = [c for c in _CLAUSES.split(task) if c and c.strip(" .")]
        return max(1, min(len(clauses) + (1 if _COLLECTIONS.search(task) else 0), 30))

    def allocate(self, task: str, tools: int, *, steps: int | None = None) -> Budget:
        expected = steps if steps is not None else self.expected_steps(task)
        raw = self.base + self.per_step * expected + self.per_tool * tools + self.per_100_chars * len(task) // 100
        tokens = max(self.floor, min(self.ceiling, raw))
        effort: Effort = "low" if tokens < 2048 else "high" if tokens >= 6144 else "medium"
        signals = {"expected_steps": expected, "tools": tools, "task_chars": len(task)}
        return Budget(tokens=tokens, effort=effort, expected_steps=expected, signals=signals)
