"""Is a planning model good enough? Plan a suite of tasks with it and measure.

Each task is planned through the real :class:`~plangate.planner.Planner` (its repair
round and its cost caps; never the plan library: the model is what is measured), and
its plan is checked against the catalogue and held against the policy. Per task: did a
plan parse (*valid*), does it pass the checker (*check*), is the policy's verdict the
one the task expects (*policy*: pass, or refused where refusing is the point), and,
where the task names a reference plan, does the plan do the same thing
(:mod:`plangate.equivalence`). With tokens, cost, seconds and model calls, per task and
in total. The tasks file's format is in :mod:`plangate.suite` and docs/planning.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from plangate._clock import Clock
from plangate.check import check
from plangate.costs import PriceTable
from plangate.equivalence import match
from plangate.models import Model
from plangate.planner import MAX_ANSWER_TOKENS, Planner, PlanningError
from plangate.policy import Policy
from plangate.store import CallRow, Store
from plangate.suite import EvalTask
from plangate.tools import Catalogue

Measure = Literal["valid", "check", "policy", "match"]
MEASURES: tuple[Measure, ...] = ("valid", "check", "policy", "match")


@dataclass(frozen=True, kw_only=True)
class TaskResult:
    """One task's outcome. ``policy`` is None without a policy, ``match`` None without a reference."""

    id: str
    category: str
    expect: Literal["valid", "invalid"]
    valid: bool
    check: bool
    policy: bool | None
    match: bool | None
    calls: int
    input_tokens: int
    output_tokens: int
    thinking_tokens: int
    cost: float | None
    seconds: float
    note: str = ""
    plan: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class EvalReport:
    """Every task's result, with totals and rates."""

    model: str
    results: tuple[TaskResult, ...]

    def rate(self, measure: Measure) -> float | None:
        """The share of tasks that pass ``measure``, of those it applies to (None when none)."""
        passed, counted = self.passed(measure)
        return passed / counted if counted else None

    def passed(self, measure: Measure) -> tuple[int, int]:
        """How many tasks pass ``measure``, of how many it applies to."""
        values = [getattr(r, measure) for r in self.results if getattr(r, measure) is not None]
        return sum(values), len(values)

    @property
    def cost(self) -> float | None:
        costs = [r.cost for r in self.results]
        return None if any(c is None for c in costs) else sum(c for c in costs if c is not None)

    def totals(self) -> dict[str, Any]:
        return {
            "tasks": len(self.results),
            "calls": sum(r.calls for r in self.results),
            "input_tokens": sum(r.input_tokens for r in self.results),
            "output_tokens": sum(r.output_tokens for r in self.results),
            "thinking_tokens": sum(r.thinking_tokens for r in self.results),
            "cost_usd": self.cost,
            "seconds": round(sum(r.seconds for r in self.results), 3),
        }

    def misses(self, thresholds: dict[Measure, float]) -> list[str]:
        """One line for each threshold the report misses."""
        out = []
        for measure, wanted in thresholds.items():
            got = self.rate(measure)
            if got is None or got < wanted:
                shown = "no task it applies to" if got is None else f"{got:.1%}"
                out.append(f"missed --min-{measure} {wanted:.1%}: {measure} rate {shown}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "totals": self.totals(),
            "rates": {m: self.rate(m) for m in MEASURES},
            "tasks": [r.to_dict() for r in self.results],
        }


@dataclass
class Evaluation:
    """The settings of one evaluation; :meth:`run` plans every task and measures the plan."""

    model: Model
    catalogue: Catalogue
    policy: Policy | None = None
    store: Store | None = None
    prices: PriceTable | None = None
    clock: Clock | None = None
    max_tokens: int = MAX_ANSWER_TOKENS

    def run(self, tasks: Sequence[EvalTask], progress: Callable[[int, TaskResult], None] | None = None) -> EvalReport:
        planner = Planner.model_alone(
            self.catalogue,
            self.model,
            store=self.store,
            policy=self.policy,
            prices=self.prices,
            clock=self.clock,
            max_tokens=self.max_tokens,
        )
        results = []
        for number, task in enumerate(tasks, start=1):
            results.append(self.one(planner, task))
            if progress is not None:
                progress(number, results[-1])
        return EvalReport(model=self.model.name, results=tuple(results))

    def one(self, planner: Planner, task: EvalTask) -> TaskResult:
        start = time.perf_counter()
        try:
            planned = planner.plan(task.task)
        except PlanningError as exc:
            return _result(
                task,
                exc.calls,
                time.perf_counter() - start,
                policy=None if self.policy is None else False,
                match=None if task.reference is None else False,
                note=" ".join(str(exc).split()),
            )
        seconds = time.perf_counter() - start
        checked = check(planned.plan, self.catalogue, self.policy, user=task.user)
        check_ok = not any(v.source != "policy" for v in checked.violations)
        refused = any(v.source == "policy" for v in checked.violations)
        found = match(task.reference, planned.plan, self._effect, free=task.free) if task.reference else None
        same = None if found is None else found.ok
        notes = [str(v) for v in checked.violations] + ([found.reason] if found and not found.ok else [])
        note = ("refused, as expected: " if refused and task.expect == "invalid" else "") + "; ".join(notes)
        return _result(
            task,
            planned.calls,
            seconds,
            valid=True,
            check=check_ok,
            policy=None if self.policy is None else refused == (task.expect == "invalid"),
            match=same,
            note=note,
            plan=planned.plan.data(),
        )

    def _effect(self, name: str) -> str | None:
        tool = self.catalogue.get(name)
        return tool.effect if tool is not None else None


def evaluate_planner(
    tasks: Sequence[EvalTask],
    model: Model,
    catalogue: Catalogue,
    policy: Policy | None = None,
    **settings: Any,
) -> EvalReport:
    """Plan each task with ``model`` and measure the plans (``settings``: see :class:`Evaluation`)."""
    return Evaluation(model=model, catalogue=catalogue, policy=policy, **settings).run(tasks)


def _result(
    task: EvalTask,
    calls: Sequence[CallRow],
    seconds: float,
    *,
    valid: bool = False,
    check: bool = False,
    policy: bool | None,
    match: bool | None,
    note: str = "",
    plan: dict[str, Any] | None = None,
) -> TaskResult:
    costs = [c.cost for c in calls]
    return TaskResult(
        id=task.id,
        category=task.category,
        expect=task.expect,
        valid=valid,
        check=check,
        policy=policy,
        match=match,
        calls=len(calls),
        input_tokens=sum(c.input_tokens for c in calls),
        output_tokens=sum(c.output_tokens for c in calls),
        thinking_tokens=sum(c.thinking_tokens for c in calls),
        cost=None if any(c is None for c in costs) else sum(c for c in costs if c is not None),
        seconds=seconds,
        note=note,
        plan=plan,
    )


# -- reading it -------------------------------------------------------------------------------

_HEAD = ("valid", "check", "policy", "match", "calls", "in tok", "out tok", "think", "cost USD", "secs")
_WIDTHS = (5, 5, 6, 5, 5, 8, 8, 7, 9, 7)


def table(report: EvalReport) -> list[str]:
    """The report as aligned text: a row per task, the totals, the rates, then each task's notes."""
    width = max(len("id"), *(len(r.id) for r in report.results))
    kind = max(len("category"), *(len(r.category) for r in report.results))

    def line(ident: str, category: str, expect: str, cells: Sequence[str]) -> str:
        numbers = "  ".join(c.rjust(w) for c, w in zip(cells, _WIDTHS, strict=True))
        return f"{ident.ljust(width)}  {category.ljust(kind)}  {expect.ljust(7)}  {numbers}".rstrip()

    lines = [line("id", "category", "expect", _HEAD)]
    for r in report.results:
        verdicts = [_yes(r.valid), _yes(r.check), _yes(r.policy), _yes(r.match)]
        lines.append(line(r.id, r.category, r.expect, [*verdicts, *_usage(r.to_dict())]))
    counts = [_count(report.passed(m)) for m in MEASURES]
    lines.append(line("all", f"{len(report.results)} tasks", "", [*counts, *_usage(report.totals())]))
    rates = [_percent(report.rate(m)) for m in MEASURES]
    lines.append(line("rate", "", "", [*rates, *[""] * 6]))
    lines.append(f"model {report.model}")
    notes = [f"  {r.id}: {_short(r.note)}" for r in report.results if r.note]
    return lines + (["notes:", *notes] if notes else [])


def progress_line(number: int, total: int, result: TaskResult) -> str:
    """One line for a task as soon as it is done."""
    verdicts = ", ".join(f"{m} {_yes(getattr(result, m))}" for m in MEASURES if getattr(result, m) is not None)
    return f"[{number}/{total}] {result.id}: {verdicts} ({result.calls} calls, {result.seconds:.1f} s)"


def _usage(row: dict[str, Any]) -> list[str]:
    """Calls, tokens, cost and seconds, from a task's dict or the totals."""
    cost = row["cost_usd"] if "cost_usd" in row else row["cost"]
    return [
        str(row["calls"]),
        str(row["input_tokens"]),
        str(row["output_tokens"]),
        str(row["thinking_tokens"]),
        "-" if cost is None else f"{cost:.4f}",
        f"{row['seconds']:.2f}",
    ]


def _yes(value: bool | None) -> str:
    return "-" if value is None else "yes" if value else "no"


def _count(passed: tuple[int, int]) -> str:
    return "-" if not passed[1] else f"{passed[0]}/{passed[1]}"


def _percent(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.0%}"


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
