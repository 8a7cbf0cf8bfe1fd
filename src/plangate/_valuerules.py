"""The policy's rules on parameter values: ``deny`` (a deny-list).

A ``deny`` rule refuses a value in which its regular expression finds a match (matched
in linear time, see ``plangate._patterns``). It is held against a plan's own values when
it is checked, and against the values references bring in, by the engine, just before
each call.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pydantic import Field, field_validator

from plangate import references
from plangate._frozen import Frozen, cached
from plangate._patterns import PatternError, Regex, matches_any
from plangate.plan import Step
from plangate.violations import Violation

RULE_NAME = r"^[a-z0-9][a-z0-9_.-]{0,99}$"


class ValueRule(Frozen):
    """Which values a rule looks at: parameters named by ``params`` of steps whose tool and resource match."""

    name: str = Field(pattern=RULE_NAME)
    message: str | None = None
    tools: tuple[str, ...] = ("*",)
    params: tuple[str, ...] = ("*",)
    resources: tuple[str, ...] | None = None

    def applies(self, step: Step, resource: str | None) -> bool:
        if not matches_any(self.tools, step.tool):
            return False
        return self.resources is None or (resource is not None and matches_any(self.resources, resource))

    def values(self, params: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
        return ((name, value) for name, value in params.items() if matches_any(self.params, name))


class DenyRule(ValueRule):
    pattern: str

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            Regex(value)
        except PatternError as exc:
            raise ValueError(str(exc)) from None
        return value

    @cached
    def regex(self) -> Regex:
        """The pattern as an automaton: a search reads each character of the value once."""
        return Regex(self.pattern)


def value_violations(
    deny: Sequence[DenyRule], step: Step, params: Mapping[str, Any], resource: str | None
) -> Iterator[Violation]:
    """Every deny rule the step's parameter values break."""
    for denied in deny:
        if denied.applies(step, resource):
            yield from _denied(denied, step, params)


def _denied(rule: DenyRule, step: Step, params: Mapping[str, Any]) -> Iterator[Violation]:
    for name, value in rule.values(params):
        hit = next(((loc, text) for loc, text in references.walk(value, (name,)) if rule.regex.search(text)), None)
        if hit is not None:
            where = ".".join(str(part) for part in hit[0])
            why = rule.message or f"matches the denied pattern {rule.pattern!r}"
            message = f"param {where!r} {why} (value {_short(hit[1])})"
            yield Violation(rule=f"deny:{rule.name}", message=message, step=step.id, source="policy")
            return


def _short(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:57] + "...")
