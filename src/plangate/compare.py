"""Plan mode and ReAct side by side: the same tasks, model and tools, measured the same way.

For each task, plan mode plans (with the model; the library is not used), submits, gets
approved if it must be, and executes; its answer is the last step's output. ReAct mode
answers with its loop, approved action by action if it must be. For both: success (the
expected answer, or a check function), model calls, input/output/thinking tokens, tool
calls, wall time, policy violations and approvals needed.
"""

from __future__ import annotations

import importlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from plangate import _input
from plangate._clock import Clock, SystemClock
from plangate.costs import PriceTable
from plangate.errors import RefusedInputError, UsageError
from plangate.models import Model
from plangate.planner import Planner, PlanningError
from plangate.policy import Policy
from plangate.react import ReActAgent
from plangate.runtime import Runtime
from plangate.store import Store
from plangate.tools import Catalogue

APPROVER = "compare-approver"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass(frozen=True, kw_only=True)
class Task:
    question: str
    expect: str | None = None
    check: Callable[[str], bool] | None = None

    def passes(self, answer: str | None) -> bool:
        if answer is None:
            return False
        if self.check is not None:
            return bool(self.check(answer))
        if self.expect is None:
            return True
        wanted = _NUMBER.fullmatch(self.expect.strip())
        if wanted:
            return any(abs(float(n) - float(self.expect)) < 1e-6 for n in _NUMBER.findall(answer))
        return self.expect.lower() in answer.lower()


@dataclass(frozen=True, kw_only=True)
class Row:
    task: int
    mode: Literal["plan", "react"]
    success: bool
    answer: str | None
    model_calls: int
    input_tokens: int
    output_tokens: int
    thinking_tokens: int
    tool_calls: int
    seconds: float
    violations: int
    approvals: int
    note: str = ""


def load_tasks(path: str | Path) -> list[Task]:
    try:
        text = _input.read_text(path, what="tasks", limit=_input.MAX_FILE_BYTES)
        data = _input.load_yaml(text, what=f"tasks {str(path)!r}")
    except RefusedInputError as exc:
        raise UsageError(str(exc)) from None
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), list):
        raise UsageError(f"{path}: write 'tasks:' with a list of {{question, expect}} or {{question, check}}")
    tasks = []
    for item in data["tasks"]:
        if not isinstance(item, dict) or "question" not in item:
            raise UsageError(f"{path}: every task needs a question")
        check = _function(item["check"]) if "check" in item else None
        tasks.append(Task(question=str(item["question"]), expect=_text(item.get("expect")), check=check))
    return tasks


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _function(spec: str) -> Callable[[str], bool]:
    module, _, name = spec.partition(":")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"cannot load check function {spec!r}: {exc}") from None
    return found  # type: ignore[no-any-return]


@dataclass
class Comparison:
    model: Model
    catalogue: Catalogue
    store: Store
    policy: Policy | None = None
    clock: Clock | None = None
    prices: PriceTable | None = None
    max_steps: int = 10
    max_tokens: int = 2048

    def run(self, tasks: list[Task]) -> list[Row]:
        rows = []
        for number, task in enumerate(tasks, start=1):
            rows.append(self.plan_mode(number, task))
            rows.append(self.react_mode(number, task))
        return rows

    def plan_mode(self, number: int, task: Task) -> Row:
        clock = self.clock or SystemClock()
        runtime = Runtime(self.catalogue, self.policy, db=self.store, clock=clock)
        planner = Planner(
            self.catalogue,
            model=self.model,
            store=self.store,
            policy=self.policy,
            prices=self.prices or PriceTable.load(),
            clock=clock,
            use_library=False,
            max_tokens=self.max_tokens,
        )
        start = time.perf_counter()
        try:
            planned = planner.plan(task.question)
        except PlanningError as exc:
            return _plan_row(number, task, None, exc.calls, start, note=str(exc).splitlines()[0])
        record = runtime.submit(planned, requested_by="compare")
        approvals = 0
        if record.status == "pending_approval":
            approvals = 1
            runtime.approve(record.id, APPROVER, record.hash)
        if record.status == "rejected":
            return _plan_row(
                number,
                task,
                None,
                planned.calls,
                start,
                violations=len(record.violations),
                note="rejected by the check or the policy",
            )
        result = runtime.execute(record.id)
        last = result.outputs.get(record.plan.steps[-1].id) if record.plan and result.ok else None
        answer = None if last is None else last if isinstance(last, str) else json.dumps(last)
        return _plan_row(
            number,
            task,
            answer,
            planned.calls,
            start,
            tool_calls=len(result.ran),
            approvals=approvals,
            note="" if result.ok else f"halted: {result.error}",
        )

    def react_mode(self, number: int, task: Task) -> Row:
        clock = self.clock or SystemClock()
        runtime = Runtime(self.catalogue, self.policy, db=self.store, clock=clock)
        agent = ReActAgent(
            self.model,
            self.catalogue,
            self.store,
            policy=self.policy,
            clock=clock,
            prices=self.prices or PriceTable.load(),
            max_steps=self.max_steps,
            max_tokens=self.max_tokens,
            user="compare",
        )
        start = time.perf_counter()
        result = agent.run(task.question)
        usage, calls, tools, approvals = result.usage, result.model_calls, result.tool_calls, 0
        violations = result.violations
        while result.status == "paused" and result.pending_hash is not None:
            approvals += 1
            runtime.approve(result.run_id, APPROVER, result.pending_hash)
            result = agent.resume(result.run_id)
            usage, calls = usage + result.usage, calls + result.model_calls
            tools, violations = tools + result.tool_calls, violations + result.violations
        return Row(
            task=number,
            mode="react",
            success=task.passes(result.answer),
            answer=result.answer,
            model_calls=calls,
            input_tokens=usage.input,
            output_tokens=usage.output,
            thinking_tokens=usage.thinking,
            tool_calls=tools,
            seconds=time.perf_counter() - start,
            violations=violations,
            approvals=approvals,
            note=result.reason or "",
        )


def _plan_row(
    number: int,
    task: Task,
    answer: str | None,
    calls: Any,
    start: float,
    *,
    tool_calls: int = 0,
    violations: int = 0,
    approvals: int = 0,
    note: str = "",
) -> Row:
    """A plan-mode row: the model calls from the planning ledger; success when the answer fits the task."""
    return Row(
        task=number,
        mode="plan",
        success=task.passes(answer),
        answer=answer,
        model_calls=len(calls),
        input_tokens=sum(c.input_tokens for c in calls),
        output_tokens=sum(c.output_tokens for c in calls),
        thinking_tokens=sum(c.thinking_tokens for c in calls),
        tool_calls=tool_calls,
        seconds=time.perf_counter() - start,
        violations=violations,
        approvals=approvals,
        note=note,
    )


def table(rows: list[Row]) -> list[str]:
    """The comparison as aligned text, with totals per mode and ReAct's ratio to plan mode."""
    head = ("task", "mode", "ok", "calls", "in tok", "out tok", "think", "tools", "secs", "viol", "appr")
    lines = [_line(head)]
    for r in rows:
        lines.append(
            _line(
                (
                    str(r.task),
                    r.mode,
                    "yes" if r.success else "no",
                    str(r.model_calls),
                    str(r.input_tokens),
                    str(r.output_tokens),
                    str(r.thinking_tokens),
                    str(r.tool_calls),
                    f"{r.seconds:.2f}",
                    str(r.violations),
                    str(r.approvals),
                )
            )
        )
    totals = {}
    for mode in ("plan", "react"):
        mine = [r for r in rows if r.mode == mode]
        totals[mode] = mine
        lines.append(
            _line(
                (
                    "all",
                    mode,
                    f"{sum(r.success for r in mine)}/{len(mine)}",
                    str(sum(r.model_calls for r in mine)),
                    str(sum(r.input_tokens for r in mine)),
                    str(sum(r.output_tokens for r in mine)),
                    str(sum(r.thinking_tokens for r in mine)),
                    str(sum(r.tool_calls for r in mine)),
                    f"{sum(r.seconds for r in mine):.2f}",
                    str(sum(r.violations for r in mine)),
                    str(sum(r.approvals for r in mine)),
                )
            )
        )
    plan, react = totals["plan"], totals["react"]
    tokens = sum(r.input_tokens + r.output_tokens for r in plan)
    calls = sum(r.model_calls for r in plan)
    if tokens and calls:
        ratio_tokens = sum(r.input_tokens + r.output_tokens for r in react) / tokens
        ratio_calls = sum(r.model_calls for r in react) / calls
        lines.append(f"ReAct used {ratio_tokens:.2f}x the tokens and {ratio_calls:.2f}x the model calls of plan mode")
    return lines


def _line(cells: tuple[str, ...]) -> str:
    widths = (4, 5, 5, 5, 7, 7, 6, 5, 6, 4, 4)
    return "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))
