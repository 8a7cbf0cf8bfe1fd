"""The policy's rules on parameter values: ``deny`` (a deny-list) and ``require`` (an allow-list).

A ``deny`` rule refuses a value in which its regular expression finds a match (matched
in linear time, see ``plangate._regex``). A ``require`` rule refuses a value that
fails its check; the one check so far is ``sql: read-only``, decided by SQLite's own
parser (``plangate._sqlguard``). Both are held against a plan's own values when it is
checked, and against the values references bring in, by the engine, just before each
call; a ``require`` rule leaves a value that takes a reference to that second look.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

from pydantic import Field, field_validator

from plangate import references
from plangate._frozen import cached
from plangate._justified import Justified
from plangate._patterns import Meter, PatternError, TooCostlyError, matches_any
from plangate._regex import Regex
from plangate._sqlguard import ReadOnlySQL
from plangate.plan import Step
from plangate.violations import Violation

RULE_NAME = r"^[a-z0-9][a-z0-9_.-]{0,99}$"
_READ_ONLY = "must be one read-only SQL statement"


class ValueRule(Justified):
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


class RequireRule(ValueRule):
    sql: Literal["read-only"] = Field(
        description="read-only: one statement that only reads, as SQLite's parser compiles it against `tables`."
    )
    tables: str = Field(
        min_length=1, description="The CREATE TABLE (INDEX, VIEW) statements of the database the tool runs SQL on."
    )

    @field_validator("tables")
    @classmethod
    def _compiles(cls, value: str) -> str:
        ReadOnlySQL(value)  # a ValueError says what is wrong with them, at load
        return value

    @cached
    def checker(self) -> ReadOnlySQL:
        return ReadOnlySQL(self.tables)

    def problem(self, value: Any, *, resolved: bool) -> str | None:
        """Why ``value`` fails this rule; None when it passes, or when it takes a reference not resolved yet."""
        if not isinstance(value, str):
            return "must be one SQL statement, as text"
        known = value if resolved else references.known_text(value)  # the statement as the tool is given it
        if known is None:
            return None  # it takes a reference: checked once the engine has resolved it, before the call
        return self.checker.problem(known)


def value_violations(
    deny: Sequence[DenyRule],
    require: Sequence[RequireRule],
    step: Step,
    params: Mapping[str, Any],
    resource: str | None,
    *,
    resolved: bool,
    meter: Meter | None = None,
) -> Iterator[Violation]:
    """Every deny and require rule the step's parameter values break (``resolved``: as about to be called).

    ``meter``: a budget shared with other steps (a whole plan's, from :func:`plan_meter`);
    without one, each rule gets a budget for this step's values alone.
    """
    for denied in deny:
        if denied.applies(step, resource):
            yield from _denied(denied, step, params, meter, resolved=resolved)
    for required in require:
        if required.applies(step, resource):
            yield from _unmet(required, step, params, resolved=resolved)


def _denied(
    rule: DenyRule, step: Step, params: Mapping[str, Any], meter: Meter | None, *, resolved: bool
) -> Iterator[Violation]:
    texts = [(name, loc, text) for name, value in rule.values(params) for loc, text in _texts(value, (name,), resolved)]
    meter = meter or _meter(sum(len(text) for _, _, text in texts))  # many short texts add up too
    for name, value in rule.values(params):
        try:
            found = _texts(value, (name,), resolved)
            hit = next(((loc, text) for loc, text in found if rule.regex.search(text, meter)), None)
        except TooCostlyError as exc:  # unknown is not allowed: refuse, saying why
            message = (
                f"param {name!r} could not be checked against the denied pattern {rule.pattern!r} within its budget "
                f"({exc}): shorten the value or the pattern's repetitions"
            )
            yield Violation(rule=f"deny:{rule.name}", message=message, step=step.id, source="policy")
            return
        if hit is not None:
            where = ".".join(str(part) for part in hit[0])
            why = rule.message or f"matches the denied pattern {rule.pattern!r}"
            message = f"param {where!r}: {why} (value {_short(hit[1])})"  # a rule's message is free text
            yield Violation(rule=f"deny:{rule.name}", message=message, step=step.id, source="policy")
            return


def _unmet(rule: RequireRule, step: Step, params: Mapping[str, Any], *, resolved: bool) -> Iterator[Violation]:
    for name, value in rule.values(params):
        why = rule.problem(value, resolved=resolved)
        if why is not None:
            text = f"param {name!r}: {rule.message or _READ_ONLY}; {why} (value {_short(str(value))})"
            yield Violation(rule=f"require:{rule.name}", message=text, step=step.id, source="policy")


def _texts(value: Any, path: tuple[Any, ...], resolved: bool) -> Iterator[tuple[tuple[Any, ...], str]]:
    """Every text in a value, with its path: strings, and the keys of objects too (a key can carry a secret).

    Before the run (not ``resolved``) a string is plan text: its ``$${`` escapes are read as the
    ``${`` the tool will be given, its references as written. Keys are never resolved.
    """
    if isinstance(value, str):  # the usual value first
        yield path, value if resolved or "$${" not in value else references.unescaped(value)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield (*path, key), str(key)
            yield from _texts(item, (*path, key), resolved)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _texts(item, (*path, index), resolved)


def plan_meter(characters: Callable[[], int], rules: int) -> Meter:
    """One budget for every deny rule over a whole plan: each rule may read each character a few times.

    The plan's length is only measured if a small first budget runs out (most plans never do).
    """
    return Meter(budget=BASE_STEPS, grow=lambda: BASE_STEPS + PLAN_STEPS_PER_CHARACTER * characters() * max(rules, 1))


def _meter(characters: int) -> Meter:
    """A rule's budget for one step's values: linear in their length, as a plain pattern needs.

    A match reads each character once, but a pattern of many states (``a.{0,2000}b``) can
    build that many states per character; past :data:`STEPS_PER_CHARACTER` per character
    (and a small allowance) the step is refused as unchecked rather than checked for minutes.
    """
    return Meter(budget=BASE_STEPS + STEPS_PER_CHARACTER * characters)


BASE_STEPS = 20_000
STEPS_PER_CHARACTER = 16
PLAN_STEPS_PER_CHARACTER = 4


def _short(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:57] + "...")
