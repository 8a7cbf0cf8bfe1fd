"""An evaluation suite: tasks for a planning model, each with the plan it should write.

A YAML file, read strictly (``plangate._input``: no duplicate keys, no aliases, unknown
keys refused). Either a list of tasks, or a mapping::

    tools: ../business.py        # the tools module (a path is relative to this file); --tools wins
    policy: ../policy.yaml       # the policy to hold plans against; --policy wins
    user: alice                  # who asks, for the policy's role rules (each task may say otherwise)
    free: [send_email.body]      # TOOL.PARAM whose wording is the model's: present, not compared
    tasks:
      - id: refund-42            # unique
        task: Refund invoice 42 in full
        category: refunds        # a label for the report (default: the reference's category)
        expect: valid            # or invalid: the policy should refuse the plan (default valid)
        reference: plans/refund-42.json   # or the plan inline; an inline plan may leave out "task"

Anything wrong is a :class:`~plangate.errors.UsageError` of one line that says where.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from plangate import _input
from plangate.errors import PlanError, RefusedInputError, UsageError
from plangate.plan import Plan

_SUITE_KEYS = {"tools", "policy", "user", "free", "tasks"}
_TASK_KEYS = {"id", "task", "category", "user", "expect", "reference", "free"}


@dataclass(frozen=True, kw_only=True)
class EvalTask:
    """One task of a suite."""

    id: str
    task: str
    category: str = "-"
    user: str | None = None
    expect: Literal["valid", "invalid"] = "valid"
    reference: Plan | None = None
    free: frozenset[str] = frozenset()


@dataclass(frozen=True, kw_only=True)
class Suite:
    """The tasks, and the tools module and policy file the suite names (paths made absolute)."""

    tasks: tuple[EvalTask, ...]
    tools: str | None = None
    policy: Path | None = None


def load_suite(path: str | Path) -> Suite:
    """The suite in the YAML file at ``path``."""
    path = Path(path)
    try:
        text = _input.read_text(path, what="tasks", limit=_input.MAX_FILE_BYTES)
        data = _input.load_yaml(text, what=f"tasks {str(path)!r}")
    except RefusedInputError as exc:
        raise UsageError(str(exc)) from None
    return _Reader(path).suite(data)


@dataclass
class _Reader:
    path: Path

    def fail(self, where: str, detail: str) -> UsageError:
        return UsageError(f"{self.path}: {where}: {detail}")

    def suite(self, data: Any) -> Suite:
        if isinstance(data, list):
            data = {"tasks": data}
        if not isinstance(data, dict) or not isinstance(data.get("tasks"), list) or not data["tasks"]:
            raise self.fail("top level", "write a list of tasks, or a mapping with 'tasks:' and a list")
        self.unknown(data, _SUITE_KEYS, "top level")
        user = self.text(data, "user", "top level", required=False)
        free = self.free(data, "top level")
        tasks = [self.task(item, f"tasks[{i}]", user, free) for i, item in enumerate(data["tasks"])]
        seen: set[str] = set()
        for where, task in enumerate(tasks):
            if task.id in seen:
                raise self.fail(f"tasks[{where}]", f"the id {task.id!r} is used by an earlier task")
            seen.add(task.id)
        tools = self.text(data, "tools", "top level", required=False)
        policy = self.text(data, "policy", "top level", required=False)
        return Suite(tasks=tuple(tasks), tools=self.tools(tools), policy=self.relative(policy) if policy else None)

    def task(self, item: Any, where: str, user: str | None, free: frozenset[str]) -> EvalTask:
        if not isinstance(item, dict):
            raise self.fail(where, "a task is a mapping with at least 'id' and 'task'")
        self.unknown(item, _TASK_KEYS, where)
        ident = self.text(item, "id", where)
        where = f"{where} ({ident})"
        expect = item.get("expect", "valid")
        if expect not in ("valid", "invalid"):
            raise self.fail(where, f"expect is 'valid' or 'invalid', not {expect!r}")
        task = self.text(item, "task", where) or ""
        reference = self.reference(item.get("reference"), task, where)
        category = self.text(item, "category", where, required=False)
        return EvalTask(
            id=ident or "",
            task=task,
            category=category or (reference.category if reference else "-"),
            user=self.text(item, "user", where, required=False) or user,
            expect=expect,
            reference=reference,
            free=free | self.free(item, where),
        )

    def reference(self, value: Any, task: str, where: str) -> Plan | None:
        if value is None:
            return None
        try:
            if isinstance(value, str):
                return Plan.load(self.relative(value))
            if isinstance(value, Mapping):
                return Plan.parse({"task": task, **value})
        except PlanError as exc:
            raise self.fail(f"{where}: reference", "; ".join([exc.summary, *(str(p) for p in exc.problems)])) from None
        raise self.fail(f"{where}: reference", "write a plan, or the path of a plan's JSON file")

    def free(self, data: dict[str, Any], where: str) -> frozenset[str]:
        value = data.get("free", [])
        if not isinstance(value, list) or not all(isinstance(v, str) and "." in v for v in value):
            raise self.fail(where, "free is a list of TOOL.PARAM names")
        return frozenset(value)

    def text(self, data: dict[str, Any], key: str, where: str, *, required: bool = True) -> str | None:
        value = data.get(key)
        if value is None and not required:
            return None
        if isinstance(value, int | float) and not isinstance(value, bool) and key == "id":
            value = str(value)
        if not isinstance(value, str) or not value.strip():
            raise self.fail(where, f"{key} must be a non-empty string" + ("" if key in data else ", and is missing"))
        return value.strip()

    def unknown(self, data: dict[str, Any], known: set[str], where: str) -> None:
        extra = sorted(str(k) for k in data if k not in known)
        if extra:
            raise self.fail(where, f"unknown key {extra[0]!r} (known: {', '.join(sorted(known))})")

    def relative(self, value: str) -> Path:
        return (self.path.parent / value).resolve()

    def tools(self, value: str | None) -> str | None:
        """A tools path is relative to the suite; an import path (pkg.tools) is kept as it is."""
        if value is None or not (value.endswith(".py") or "/" in value):
            return value
        return str(self.relative(value))
