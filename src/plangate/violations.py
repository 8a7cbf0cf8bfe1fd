from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal


@dataclass(frozen=True, kw_only=True, slots=True)
class Violation:
    """One thing wrong with a plan: which step, which rule, and why, in plain words.

    ``rule`` is a stable kebab-case name (``unknown-tool``, ``param-type``...) or, for a
    rule a policy names itself, ``deny:NAME`` / ``sequence:NAME``.
    """

    rule: str
    message: str
    step: int | None = None
    source: Literal["plan", "check", "policy"] = "check"

    def __str__(self) -> str:
        where = f"step {self.step}" if self.step is not None else "plan"
        return f"{where}: {self.rule}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
