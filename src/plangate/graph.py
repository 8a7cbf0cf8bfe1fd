"""The dependency graph a plan's references draw between its steps."""

from __future__ import annotations

from dataclasses import dataclass

from plangate.plan import Plan


@dataclass(frozen=True)
class PlanGraph:
    """Which steps each step depends on, directly (``deps``) and transitively (``ancestors``).

    Only references to earlier steps are edges: anything else is a check error, so the
    graph is acyclic by construction and ``order`` is a valid execution order.
    """

    order: tuple[int, ...]
    deps: dict[int, frozenset[int]]
    ancestors: dict[int, frozenset[int]]

    @classmethod
    def of(cls, plan: Plan) -> PlanGraph:
        seen: set[int] = set()
        order: list[int] = []
        deps: dict[int, frozenset[int]] = {}
        ancestors: dict[int, frozenset[int]] = {}
        for step in plan.steps:
            if step.id in seen:
                continue
            direct = step.refs.depends_on & seen
            deps[step.id] = direct
            ancestors[step.id] = direct.union(*(ancestors[d] for d in direct))
            seen.add(step.id)
            order.append(step.id)
        return cls(tuple(order), deps, ancestors)

    def ordered(self, a: int, b: int) -> bool:
        """True when one of the two steps depends, directly or not, on the other."""
        return a in self.ancestors.get(b, ()) or b in self.ancestors.get(a, ())
