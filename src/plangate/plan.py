"""The Plan: the typed, hashed, versioned artefact everything else hangs on.

A plan is data: JSON on the wire and on disk, a validated pydantic model in memory.
Its identity is the SHA-256 of its canonical JSON form (keys sorted, no white space,
UTF-8, defaults filled in), so two plans that say the same thing have the same hash
whatever their layout, and any change to what a plan says changes the hash.

Fields added to the format after its first release (``order``, ``answer``, a step's
``after`` and ``on_failure``) appear in the canonical form only when they differ from their default:
a plan that does not use them has the hash it always had, and one that does cannot be
mistaken for one that does not.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import ConfigDict, Field, JsonValue, ValidationError, model_validator

from plangate import _input, expr, references
from plangate._encode import reused_encoder
from plangate._frozen import Frozen, FrozenDict, FrozenList, ReadOnlyJSON, ReadOnlyList, cached
from plangate._jsontypes import JSON_TYPES
from plangate.errors import ConditionError, PlanError, Problem, RefError, RefusedInputError
from plangate.tools._tool import NAME, problems

SCHEMA_VERSION = 1
SCHEMA_ID = f"urn:plangate:plan:{SCHEMA_VERSION}"


@dataclass(frozen=True)
class Limits:
    """Hard limits on any plan, enforced when it is parsed (before any check runs)."""

    max_bytes: int = 1_048_576
    max_steps: int = 500
    max_string: int = 65_536
    max_depth: int = 32
    max_condition: int = 1_000
    max_step_id: int = 999_999


LIMITS = Limits()
EXPECTED_OUTPUT_PATTERN = r"^(any|(" + "|".join(JSON_TYPES) + r")(\|(" + "|".join(JSON_TYPES) + r"))*)$"


class StepRefs(NamedTuple):
    """What a step's references and condition say, worked out once per step."""

    params: tuple[references.Found, ...] = ()
    bad_params: tuple[tuple[references.Loc, RefError], ...] = ()
    condition: expr.Condition | None = None
    condition_error: ConditionError | None = None
    rollback: tuple[references.Ref, ...] = ()
    rollback_error: RefError | None = None
    depends_on: frozenset[int] = frozenset()
    """The steps whose outputs this step reads (in its parameters or its condition)."""


_NO_REFS = StepRefs()
_new_tuple = tuple.__new__


def _analyse(step: Step) -> StepRefs:
    params, bad = references.find(step.params)
    condition_text, rollback_text = step.condition, step.rollback
    if not params and not bad and condition_text is None and rollback_text is None:
        return _NO_REFS  # most steps: nothing to work out
    reads = {each.ref.step for each in params}
    condition, condition_error = None, None
    if condition_text is not None:
        try:
            condition = expr.parse(condition_text)
            reads.update(ref.step for ref in condition.refs)
        except ConditionError as exc:
            condition_error = exc
    rollback: tuple[references.Ref, ...] = ()
    rollback_error = None
    if rollback_text is not None and references.has_refs(rollback_text):
        try:
            rollback = tuple(references.scan(rollback_text))
        except RefError as exc:
            rollback_error = exc
    # Positionally, in the fields' order: a NamedTuple made by keyword costs several times more.
    fields = (tuple(params), tuple(bad), condition, condition_error, rollback, rollback_error, frozenset(reads))
    return _new_tuple(StepRefs, fields)


class Step(Frozen):
    """One call of one tool, with the reason for it."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    id: int = Field(
        ge=1, le=LIMITS.max_step_id, description="Unique positive integer; other steps refer to it as ${id}."
    )
    tool: str = Field(pattern=f"^{NAME.pattern}$", description="Name of a tool in the catalogue.")
    params: ReadOnlyJSON[JsonValue] = Field(
        default_factory=FrozenDict,
        description="Arguments for the tool. A value that is exactly ${N} or ${N.field.sub} takes step N's "
        "output (or a field of it) with its type; inside a longer string it is inserted as text.",
    )
    rationale: str = Field(min_length=1, description="Why this step is needed, for the reviewer.")
    expected_output: str = Field(
        default="any",
        pattern=EXPECTED_OUTPUT_PATTERN,
        description="JSON type the output must have: string, number, integer, boolean, object, array, "
        "null, several joined by '|', or any.",
    )
    condition: str | None = Field(
        default=None,
        max_length=LIMITS.max_condition,
        description="Optional expression over earlier outputs, e.g. '${1.total} > 100'; the step runs only "
        "when it is true. Operators: and or not == != < <= > >= in + - * / %.",
    )
    rollback: str | None = Field(
        default=None, description="How to undo this step, or why it cannot be undone (for the reviewer)."
    )
    after: ReadOnlyList[int] = Field(
        default_factory=FrozenList,
        max_length=LIMITS.max_steps,
        description="Ids of earlier steps that must finish before this one starts, though it reads nothing "
        "from them (e.g. notify only after the shipment).",
    )
    on_failure: Literal["halt", "continue"] = Field(
        default="halt",
        description="'halt' (the default) stops the plan when the step fails. 'continue', for read steps "
        "only: a failure is recorded, the step's output is null and the plan goes on (guard later uses "
        "with a condition such as '${N} != null').",
    )

    @cached
    def refs(self) -> StepRefs:
        """The step's references and parsed condition (computed on first use, then kept)."""
        return _analyse(self)


class Plan(Frozen):
    """A task broken into steps over catalogue tools; checked, approved, then executed."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        strict=True,
        json_schema_extra={"$id": SCHEMA_ID},
        title="plangate plan",
    )

    schema_version: Literal[1] = Field(default=1, description="Version of this plan format.")
    order: Literal["listed", "dataflow"] = Field(
        default="listed",
        description="'listed' (the default): steps that write or cannot be undone run in the order listed, "
        "with every step before them finished. 'dataflow': steps wait only for the steps they read or name "
        "in 'after'.",
    )
    task: str = Field(min_length=1, description="What the plan achieves, in one sentence.")
    category: str = Field(
        min_length=1, max_length=100, description="Kind of work (e.g. refunds); the policy decides approval by it."
    )
    steps: ReadOnlyList[Step] = Field(min_length=1, max_length=LIMITS.max_steps, description="The steps, in order.")
    answer: str | None = Field(
        default=None,
        min_length=1,
        description="Text for the user after the run, e.g. 'Total: ${1.total}' (references as in a parameter).",
    )

    @model_validator(mode="before")
    @classmethod
    def _within_limits(cls, data: Any) -> Any:
        try:
            _input.check_value(data, what="plan", max_depth=LIMITS.max_depth, max_string=LIMITS.max_string)
        except RefusedInputError as exc:
            raise _refused(exc, data) from None
        return data

    @classmethod
    def parse(cls, data: str | bytes | Mapping[str, Any]) -> Plan:
        """A plan from JSON text or decoded JSON; raises :class:`PlanError` listing every problem.

        Text is decoded strictly (``plangate._input``: no duplicate keys, no NaN, bounded
        nesting...), and decoded values are held to the same rules, so a plan given as a
        dict cannot carry what a plan given as text could not.
        """
        if isinstance(data, str | bytes):
            data = _decode(data)  # the limits are checked as it is validated, below
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise PlanError("not a valid plan:", _plan_problems(data, exc)) from None

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """A plan from a JSON file: a regular file within the size limit, read without ever blocking."""
        try:
            text = _input.read_bytes(path, what="plan", limit=LIMITS.max_bytes)
        except RefusedInputError as exc:
            raise PlanError(str(exc)) from None
        try:
            return cls.parse(text)
        except PlanError as exc:
            raise PlanError(f"{path}: {exc.summary}", list(exc.problems)) from None

    def canonical_json(self) -> str:
        """Keys sorted, no white space, UTF-8 text, every default filled in (but those of later fields)."""
        return canonical(self.data())

    def data(self) -> dict[str, Any]:
        """The plan as JSON data, as it is hashed: later fields (see the module) only when not at their default."""
        data = self.model_dump(mode="json")
        _drop_defaults(data, _LATER_PLAN_FIELDS)
        for step in data["steps"]:
            _drop_defaults(step, _LATER_STEP_FIELDS)
        return data

    @cached
    def hash(self) -> str:
        """SHA-256 of the canonical JSON form, as 64 hex digits."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def step(self, step_id: int) -> Step:
        for step in self.steps:
            if step.id == step_id:
                return step
        raise KeyError(f"plan has no step {step_id}")


_LATER_PLAN_FIELDS: dict[str, Any] = {"order": "listed", "answer": None}
_LATER_STEP_FIELDS: dict[str, Any] = {"after": [], "on_failure": "halt"}


def _drop_defaults(data: dict[str, Any], defaults: Mapping[str, Any]) -> None:
    for name, default in defaults.items():
        if data.get(name) == default:
            del data[name]


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_canonical = reused_encoder(_CANONICAL)


def canonical(value: Any) -> str:
    """Keys sorted, no white space, no NaN: the text that hashes and the audit log's data are made of."""
    return _canonical(value)


def same_json(a: Any, b: Any) -> bool:
    """Whether two JSON values are the same value: Python's ``==`` takes ``1``, ``1.0`` and ``true`` for one."""
    return a == b and (a is b or canonical(a) == canonical(b))


def plan_json_schema() -> dict[str, Any]:
    """The plan's JSON Schema: the one a planning model is given."""
    schema = Plan.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def loads(text: str | bytes) -> Any:
    """Decode a plan's JSON text strictly and within the plan limits; raises :class:`PlanError`."""
    data = _decode(text)
    try:
        _input.check_value(data, what="plan", max_depth=LIMITS.max_depth, max_string=LIMITS.max_string)
    except RefusedInputError as exc:
        raise _refused(exc, data) from None
    return data


def _decode(text: str | bytes) -> Any:
    try:
        return _input.decode_json(text, what="plan", limit=LIMITS.max_bytes, max_depth=LIMITS.max_depth)
    except RefusedInputError as exc:
        raise _refused(exc) from None


def _refused(exc: RefusedInputError, data: Any = None) -> PlanError:
    """A refusal as a plan error: a problem at its path (with its step), or one line when it has none."""
    if not exc.location:
        return PlanError(f"{exc.rule}: {exc.detail}")
    found = _STEP_INDEX.match(exc.location)
    step = _step_id(data, int(found.group(1))) if found else None
    return PlanError(
        "not a valid plan:", [Problem(location=exc.location, message=f"{exc.rule}: {exc.detail}", step=step)]
    )


_STEP_INDEX = re.compile(r"steps\[(\d+)\]")


def _step_id(data: Any, index: int) -> int | None:
    """The id the plan's ``index``-th step says it has, when it says one."""
    steps = data.get("steps") if isinstance(data, Mapping) else None
    raw = steps[index] if isinstance(steps, list) and index < len(steps) else None
    candidate = raw.get("id") if isinstance(raw, Mapping) else None
    return candidate if isinstance(candidate, int) and not isinstance(candidate, bool) else None


def _plan_problems(data: Any, exc: ValidationError) -> list[Problem]:
    found = problems(exc.errors(include_url=False))
    out: list[Problem] = []
    for problem, err in zip(found, exc.errors(include_url=False), strict=True):
        loc = err["loc"]
        step_id = _step_id(data, loc[1]) if len(loc) >= 2 and loc[0] == "steps" and isinstance(loc[1], int) else None
        out.append(Problem(location=problem.location or "plan", message=problem.message, step=step_id))
    return out


def expected_types(expected: str) -> frozenset[str] | None:
    """The JSON types an ``expected_output`` allows (``None``: any)."""
    return None if expected == "any" else frozenset(expected.split("|"))
