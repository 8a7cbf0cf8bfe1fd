"""Every exception plangate raises, in one place.

Three families, so callers can tell a mistake from a failure from a signal::

    PlangateError
    ├── UsageError                 misuse or bad configuration: fix the code or the file
    │   ├── ToolDefinitionError    a function that cannot become a tool
    │   ├── CatalogueError         a catalogue that cannot be built or loaded
    │   └── PolicyError            a policy file that cannot be read or is malformed
    ├── InputError                 untrusted input that is rejected (nothing was done)
    │   ├── RefusedInputError      refused at the edge: a FIFO, a duplicate key, a bidi control...
    │   ├── PlanError              a plan that is not JSON or not of the plan's shape
    │   ├── ParamsError            tool parameters that do not fit the tool's schema
    │   ├── ReferenceError_        a ``${N.path}`` reference that cannot be resolved
    │   ├── ConditionError         a condition that does not parse or cannot be evaluated
    │   └── NotFoundError          no plan with that id
    ├── GovernanceError            a request that breaks a governance rule (nothing was done)
    │   ├── StateError             the plan is not in a state that allows this
    │   ├── StaleHashError         an approval for a version that is no longer current
    │   ├── SelfApprovalError      the requester (or the author of the version) approving it
    │   ├── SignInRequiredError    the store has accounts and no live token or session was given
    │   └── NotPermittedError      the account's role does not allow this
    ├── StoreError                 the store cannot be opened, or is of a newer schema
    │   └── StoreLostError         the store went away mid-run: carries the outcomes the run knew
    └── LeaseLostError             a control-flow signal: a worker's lease expired and another took the plan

Run failures (a tool raising, an output of the wrong type) are not raised: the engine
records them and halts, and ``Runtime.execute`` returns a halted result that says which
step, why, and what to do next.

Exceptions never log and never do I/O: they carry data, callers decide what to show.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from plangate.engine import Unconfirmed


class PlangateError(Exception):
    """Base class of every error plangate raises on purpose."""


class UsageError(PlangateError):
    """The caller or a configuration file is wrong; retrying the same thing cannot help."""


class ToolDefinitionError(UsageError):
    """A Python function cannot be turned into a tool (missing type hints, ``*args``...)."""


class CatalogueError(UsageError):
    """A catalogue cannot be built (duplicate names, a module that cannot be imported...)."""


class PolicyError(UsageError):
    """A policy file cannot be read, is not YAML, or does not follow the policy format."""


class InputError(PlangateError):
    """Untrusted input was rejected before anything happened."""


class RefusedInputError(InputError):
    """Input refused at the edge, before it was parsed into anything (see ``plangate._input``).

    ``rule`` names the rule it broke (``not-a-regular-file``, ``duplicate-key``,
    ``bidi-control``...), ``location`` says where (a JSON path such as
    ``steps[2].params.note``, or a line), and the message says both, and why.
    """

    def __init__(self, message: str, *, rule: str, location: str = "", detail: str = "") -> None:
        self.rule = rule
        self.location = location
        self.detail = detail or message
        super().__init__(message)


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One thing wrong with an input: where (``location``), and what, in plain words."""

    location: str
    message: str
    step: int | None = None

    def __str__(self) -> str:
        return f"{self.location}: {self.message}" if self.location else self.message


class PlanError(InputError):
    """The input is not a plan: not JSON, too large, or not of the plan's shape.

    ``problems`` lists every problem found, not just the first.
    """

    def __init__(self, summary: str, problems: list[Problem] | None = None) -> None:
        self.summary = summary
        self.problems: tuple[Problem, ...] = tuple(problems or ())
        lines = [summary, *(f"  {p}" for p in self.problems)]
        super().__init__("\n".join(lines))


class ParamsError(InputError):
    """Parameters do not fit a tool's parameter schema; ``problems`` names each one."""

    def __init__(self, tool: str, problems: list[Problem]) -> None:
        self.tool = tool
        self.problems = tuple(problems)
        detail = "; ".join(str(p) for p in problems)
        super().__init__(f"invalid parameters for tool {tool!r}: {detail}")


class RefError(InputError):
    """A ``${N.path}`` reference is malformed or points at something that does not exist."""


class ConditionError(InputError):
    """A step condition does not parse, or cannot be evaluated on the outputs it reads."""

    def __init__(self, message: str, *, column: int | None = None) -> None:
        self.column = column
        where = f"at column {column}: " if column is not None else ""
        super().__init__(f"{where}{message}")


class GovernanceError(PlangateError):
    """A request that breaks a governance rule; it was refused and nothing changed."""


class NotFoundError(InputError, LookupError):
    """No plan (or run) with that id."""


class StateError(GovernanceError):
    """The plan is not in a state that allows the request (executing an unapproved plan...)."""


class StaleHashError(GovernanceError):
    """An approval names a plan hash that is not the current version's."""


class SelfApprovalError(GovernanceError):
    """The requester, or the author of the current version, tried to approve it."""


class SignInRequiredError(GovernanceError):
    """The store has accounts: the request needs a live API token or session, and had none."""


class NotPermittedError(GovernanceError):
    """The account is known, but its role (or its categories) does not allow this."""


class StoreError(PlangateError):
    """The store cannot be opened or used (a bad URL, a newer schema, a locked file)."""


class StoreLostError(StoreError):
    """The connection to the store broke during a run (a server restart, a network cut): the run stopped.

    ``known`` holds what the run knew and could not confirm recorded: the outcomes of the calls its
    tools had answered, each with the attempt it answered (an
    :class:`plangate.engine.Unconfirmed`). ``Runtime.drive`` takes the run back under the same lease
    once the store answers, and records them only for a step still started at that attempt; raised
    past it, the store was not back within the lease, and the message says which outcomes were known
    and not recorded: the next run of the plan decides them (a retry can help once the store answers).
    A ReAct run takes itself back in its own loop; raised past it, ``known`` is empty and the message
    names the action whose answer was known and not recorded.
    """

    def __init__(self, message: str, known: Unconfirmed) -> None:
        self.known = known
        super().__init__(message)


class OutcomeUnknownError(PlangateError):
    """A tool's call may or may not have had its effect (its server's connection broke during the call).

    The engine treats it as an overrun: a tool that is not idempotent is not called again on
    its own, and the run halts with the step's outcome unknown for a person to settle.
    """


class LeaseLostError(PlangateError):
    """A worker's lease on a plan expired and another worker took the plan over: this one stops."""


HTTP_STATUS = (  # what the JSON API answers for each refusal; the most specific class first
    (NotFoundError, 404),
    (SignInRequiredError, 401),
    (NotPermittedError, 403),
    (GovernanceError, 409),
    (InputError, 422),
    (UsageError, 422),
)


def quoted_id(text: str) -> str:
    """A plan id as typed, quoted for an error line: cut short when it is far longer than any id."""
    return repr(text) if len(text) <= 64 else f"{text[:40]!r}... ({len(text)} characters)"
