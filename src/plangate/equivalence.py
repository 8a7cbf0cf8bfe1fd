"""Whether a plan does the same thing as a reference plan.

Two plans do the same thing when their steps pair up one to one, each pair calling the
same tool with the same parameters, and every ordering the reference's run order imposes
(:func:`plangate.graph.run_deps`: the steps a step reads, its ``after``, and the barriers
around effects) holds in the other plan's run order too. So step numbers do not matter
(a reference ``${2.total}`` is compared through the pairing), nor does the order of steps
the run order leaves free, such as two lookups side by side. Rationales, expected outputs,
conditions and rollbacks are the reviewer's reading, not what the plan does, and are not
compared; nor is the category (the policy judges it). Parameters named in ``free``
(``"send_email.body"``) must be present, but their wording is the model's to choose.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from plangate.graph import run_deps
from plangate.plan import Plan, Step
from plangate.references import renumber

MAX_TRIES = 100_000  # pairings tried before giving up: plans of many identical steps could take factorial time


@dataclass(frozen=True, kw_only=True)
class Match:
    """The verdict: ``ok``, the pairing (reference step id to candidate step id), or why not."""

    ok: bool
    pairs: dict[int, int] = field(default_factory=dict)
    reason: str = ""


def match(
    reference: Plan, candidate: Plan, effect_of: Callable[[str], str | None], *, free: Collection[str] = ()
) -> Match:
    """Whether ``candidate`` does what ``reference`` does (see the module); ``effect_of`` gives a tool's effect."""
    ids = [s.id for s in candidate.steps]
    if len(set(ids)) != len(ids):
        return Match(ok=False, reason="the plan gives two steps the same id")
    missing = Counter(s.tool for s in reference.steps) - Counter(s.tool for s in candidate.steps)
    extra = Counter(s.tool for s in candidate.steps) - Counter(s.tool for s in reference.steps)
    if missing or extra:
        return Match(ok=False, reason=_tool_difference(missing, extra))
    ordered = _Search(reference, candidate, effect_of, frozenset(free), ordered=True)
    if ordered.run():
        return Match(ok=True, pairs=dict(ordered.pairs))
    if ordered.tries > MAX_TRIES:
        return Match(ok=False, reason=f"undecided: more than {MAX_TRIES} ways to pair the steps")
    if _Search(reference, candidate, effect_of, frozenset(free), ordered=False).run():
        return Match(ok=False, reason="the same calls, but in an order the reference does not allow")
    return Match(ok=False, reason=_parameter_difference(reference, candidate, frozenset(free)))


class _Search:
    """A backtracking search for a pairing, reference steps in their listed order.

    A reference step only reads or waits for steps listed before it, so when a step is
    paired, everything its parameters and its ordering name is already paired.
    """

    def __init__(
        self,
        reference: Plan,
        candidate: Plan,
        effect_of: Callable[[str], str | None],
        free: frozenset[str],
        *,
        ordered: bool,
    ) -> None:
        self.reference = reference.steps
        self.candidate = candidate.steps
        self.needs = run_deps(reference, effect_of) if ordered else {}
        self.before = _ancestors(run_deps(candidate, effect_of))
        self.free = free
        self.pairs: dict[int, int] = {}
        self.used: set[int] = set()
        self.tries = 0

    def run(self, index: int = 0) -> bool:
        if index == len(self.reference):
            return True
        wanted = self.reference[index]
        for step in self.candidate:
            self.tries += 1
            if self.tries > MAX_TRIES:
                return False
            if step.id in self.used or not self._fits(wanted, step):
                continue
            self.pairs[wanted.id] = step.id
            self.used.add(step.id)
            if self.run(index + 1):
                return True
            del self.pairs[wanted.id]
            self.used.discard(step.id)
        return False

    def _fits(self, wanted: Step, step: Step) -> bool:
        if step.tool != wanted.tool:
            return False
        if any(self.pairs[need] not in self.before.get(step.id, ()) for need in self.needs.get(wanted.id, ())):
            return False
        return same_params(wanted.tool, renumber(wanted.params, self.pairs), step.params, self.free)


def same_params(tool: str, wanted: Mapping[str, Any], given: Mapping[str, Any], free: Collection[str] = ()) -> bool:
    """The same parameter names, and the same values but for those named ``TOOL.PARAM`` in ``free``."""
    if wanted.keys() != given.keys():
        return False
    return all(f"{tool}.{name}" in free or same_value(value, given[name]) for name, value in wanted.items())


def same_value(a: Any, b: Any) -> bool:
    """JSON equality: 20 and 20.0 are the same number, but true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _ancestors(deps: Mapping[int, frozenset[int]]) -> dict[int, frozenset[int]]:
    """Every step each step waits for, directly or not (``deps`` names only steps listed earlier)."""
    found: dict[int, frozenset[int]] = {}
    for step, direct in deps.items():
        found[step] = direct.union(*(found.get(d, frozenset()) for d in direct))
    return found


def _tool_difference(missing: Counter[str], extra: Counter[str]) -> str:
    parts = []
    if missing:
        parts.append("lacks " + ", ".join(_times(tool, n) for tool, n in sorted(missing.items())))
    if extra:
        parts.append("adds " + ", ".join(_times(tool, n) for tool, n in sorted(extra.items())))
    return "different tools: the plan " + " and ".join(parts)


def _times(tool: str, count: int) -> str:
    return tool if count == 1 else f"{tool} x{count}"


def _parameter_difference(reference: Plan, candidate: Plan, free: frozenset[str]) -> str:
    """The first reference step that no step of the candidate calls with its parameters, references aside."""
    for wanted in reference.steps:
        blanked = _blank_refs(wanted.params)
        if not any(
            s.tool == wanted.tool and same_params(wanted.tool, blanked, _blank_refs(s.params), free)
            for s in candidate.steps
        ):
            return f"no step calls {wanted.tool} with the parameters of reference step {wanted.id}"
    return "the same calls, but their references point at different steps"


def _blank_refs(params: Mapping[str, Any]) -> Any:
    return renumber(params, _AnyStep())


class _AnyStep(dict[int, int]):
    """Maps every step to step 0, so that references compare by their path alone."""

    def __contains__(self, key: object) -> bool:
        return isinstance(key, int)

    def __getitem__(self, key: int) -> int:
        return 0
