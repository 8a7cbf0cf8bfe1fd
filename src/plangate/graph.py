"""The dependency graph a plan's references draw between its steps, and the order its steps run in."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from plangate.plan import Plan

EFFECTS = ("write", "irreversible")


@dataclass(frozen=True)
class PlanGraph:
    """Which steps each step depends on, directly (``deps``) and transitively (``ancestors``).

    A step depends on the steps it reads (and, with ``after=True``, those its ``after``
    names: order without data). Only earlier steps are edges: anything else is a check
    error, so the graph is acyclic by construction and ``order`` is a valid execution order.
    """

    order: tuple[int, ...]
    deps: dict[int, frozenset[int]]
    ancestors: dict[int, frozenset[int]]

    @classmethod
    def of(cls, plan: Plan, *, after: bool = False) -> PlanGraph:
        order: list[int] = []
        deps: dict[int, frozenset[int]] = {}
        ancestors: dict[int, frozenset[int]] = {}
        seen: set[int] = set()  # the steps before this one
        for step in plan.steps:
            step_id = step.id
            if step_id in seen:
                continue
            reads = step.refs.depends_on
            if after and step.after:
                reads = reads | set(step.after)
            if reads:
                deps[step_id] = direct = reads & seen  # a frozenset: the left operand's type
                if len(direct) == 1:
                    (only,) = direct
                    ancestors[step_id] = direct | ancestors[only]
                else:
                    ancestors[step_id] = direct.union(*[ancestors[d] for d in direct])
            else:
                deps[step_id] = ancestors[step_id] = reads
            seen.add(step_id)
            order.append(step_id)
        return cls(tuple(order), deps, ancestors)

    def ordered(self, a: int, b: int) -> bool:
        """True when one of the two steps depends, directly or not, on the other."""
        return a in self.ancestors.get(b, ()) or b in self.ancestors.get(a, ())


def run_deps(plan: Plan, effect_of: Callable[[str], str | None]) -> dict[int, frozenset[int]]:
    """What each step waits for before it starts: the steps it reads or names in ``after``, and the listed order.

    A reviewer reads a plan top to bottom and approves that story, so by default effects
    are barriers: a step whose tool writes or is irreversible (or whose effect is unknown)
    starts only after every step listed before it has finished, and no step starts before
    every such step listed before it has finished. Reads between two effects still run at
    the same time. A plan with ``"order": "dataflow"`` asked for the data flow alone.
    ``effect_of`` gives a tool's effect by name.
    """
    deps: dict[int, frozenset[int]] = {}
    if plan.order == "dataflow":
        for step in plan.steps:
            if step.id not in deps:
                deps[step.id] = frozenset((step.refs.depends_on | set(step.after)) & deps.keys())
        return deps
    last_effect: int | None = None  # it waited for everything before it: waiting for it is enough
    since: list[int] = []  # the steps listed since that effect
    for step in plan.steps:
        if step.id in deps:
            continue
        effect = effect_of(step.tool) != "read"  # an unknown effect counts as one
        waits = set((step.refs.depends_on | set(step.after)) & deps.keys())
        if last_effect is not None:
            waits.add(last_effect)
        if effect:
            waits.update(since)
            last_effect, since = step.id, []
        else:
            since.append(step.id)
        deps[step.id] = frozenset(waits)
    return deps
