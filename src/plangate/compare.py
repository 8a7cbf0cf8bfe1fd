"""Plan mode and ReAct side by side, with the ReAct paper's two baselines: the same tasks,
model and tools, measured the same way.

For each task, plan mode plans (with the model; the library is not used), submits, gets
approved if it must be, and executes; its answer is the last step's output. ReAct mode
answers with its loop, approved action by action if it must be; Act-only is the same loop
with actions and no thoughts; CoT-only reasons and answers in one call, with no tools. For
each: success (the expected answer, or a check function), model calls, input/output/
thinking tokens, tool calls, wall time, policy violations and approvals needed. The table
by number of steps is in :mod:`plangate._comparereport`.

The comparison approves what it runs itself, as :data:`APPROVER`, a name no account
proves, so it refuses a store with accounts: it runs on a store of its own.
"""

from __future__ import annotations

import importlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from plangate import _input
from plangate._clock import Clock, SystemClock
from plangate._comparereport import by_steps, table, to_json
from plangate._comparescript import Script
from plangate.accounts import Accounts
from plangate.costs import PriceTable
from plangate.errors import GovernanceError, RefusedInputError, UsageError
from plangate.models import Message, Model, ModelError, ModelRequest
from plangate.planner import Planner, PlanningError, prompt
from plangate.policy import Policy
from plangate.react import ReActAgent
from plangate.runtime import Runtime
from plangate.store import Store
from plangate.tools import Catalogue

__all__ = ["MODES", "Comparison", "Row", "Task", "by_steps", "load_tasks", "table", "to_json"]

APPROVER = "compare-approver"
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_FINAL = re.compile(r"Final Answer\s*:\s*(?P<answer>.*)", re.DOTALL)
Mode = Literal["plan", "react", "act", "cot"]
MODES: tuple[Mode, ...] = get_args(Mode)


@dataclass(frozen=True, kw_only=True)
class Task:
    question: str
    expect: str | None = None
    check: Callable[[str], bool] | None = None
    script: Script | None = None  # the decisions a scripted model makes for it

    @property
    def steps(self) -> int | None:
        """How many tool calls the task takes, where its script says."""
        return None if self.script is None else len(self.script.steps)

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
    mode: Mode
    steps: int | None  # the task's tool calls, where its script says
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
        script = (
            Script.parse(f"{path}: {item['question']!r}", item["steps"], item.get("answer"))
            if "steps" in item
            else None
        )
        tasks.append(Task(question=str(item["question"]), expect=_text(item.get("expect")), check=check, script=script))
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
    max_steps: int = 15
    max_tokens: int = 2048
    modes: tuple[Mode, ...] = ("plan", "react")

    def run(self, tasks: list[Task]) -> list[Row]:
        """Each task in each mode. A store with accounts is refused: the comparison approves what it runs itself."""
        if Accounts(self.store).any():
            raise GovernanceError(
                f"the comparison approves every plan and action itself, as {APPROVER!r}, a name no account proves; "
                "this store has accounts: give the comparison a store of its own (--db sqlite:///PATH)"
            )
        runs = {"plan": self.plan_mode, "react": self.react_mode, "act": self.act_mode, "cot": self.cot_mode}
        return [runs[mode](number, task) for number, task in enumerate(tasks, start=1) for mode in self.modes]

    def plan_mode(self, number: int, task: Task) -> Row:
        clock = self.clock or SystemClock()
        runtime = Runtime(self.catalogue, self.policy, db=self.store, clock=clock)
        planner = Planner.model_alone(
            self.catalogue,
            self.model,
            store=self.store,
            policy=self.policy,
            prices=self.prices,
            clock=clock,
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

    def act_mode(self, number: int, task: Task) -> Row:
        """Act-only: the ReAct loop with actions and no thoughts."""
        return self.react_mode(number, task, thoughts=False)

    def cot_mode(self, number: int, task: Task) -> Row:
        """CoT-only: one call that reasons and answers, with no tools."""
        request = ModelRequest(
            system=prompt("cot").template,
            messages=(Message(role="user", content=f"Question: {task.question}"),),
            max_tokens=self.max_tokens,
        )
        start = time.perf_counter()
        try:
            response = self.model.complete(request)
        except ModelError as exc:
            return _row(number, task, "cot", None, start, model_calls=1, note=f"the model failed: {exc}")
        found = _FINAL.search(response.text)
        answer = (found.group("answer") if found else response.text).strip()
        usage = response.usage
        return _row(
            number,
            task,
            "cot",
            answer,
            start,
            model_calls=1,
            tokens=(usage.input, usage.output, usage.thinking),
            note="" if found else "no 'Final Answer:' line",
        )

    def react_mode(self, number: int, task: Task, *, thoughts: bool = True) -> Row:
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
            thoughts=thoughts,
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
        return _row(
            number,
            task,
            "react" if thoughts else "act",
            result.answer,
            start,
            model_calls=calls,
            tokens=(usage.input, usage.output, usage.thinking),
            tool_calls=tools,
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
    tokens = (
        sum(c.input_tokens for c in calls),
        sum(c.output_tokens for c in calls),
        sum(c.thinking_tokens for c in calls),
    )
    return _row(
        number,
        task,
        "plan",
        answer,
        start,
        model_calls=len(calls),
        tokens=tokens,
        tool_calls=tool_calls,
        violations=violations,
        approvals=approvals,
        note=note,
    )


def _row(
    number: int,
    task: Task,
    mode: Mode,
    answer: str | None,
    start: float,
    *,
    model_calls: int,
    tokens: tuple[int, int, int] = (0, 0, 0),
    tool_calls: int = 0,
    violations: int = 0,
    approvals: int = 0,
    note: str = "",
) -> Row:
    return Row(
        task=number,
        mode=mode,
        steps=task.steps,
        success=task.passes(answer),
        answer=answer,
        model_calls=model_calls,
        input_tokens=tokens[0],
        output_tokens=tokens[1],
        thinking_tokens=tokens[2],
        tool_calls=tool_calls,
        seconds=time.perf_counter() - start,
        violations=violations,
        approvals=approvals,
        note=note,
    )
