"""The comparison's report: a row per task and mode, and the summary by number of steps.

The summary is what the design's claim is about: tokens (input, output) and model calls
per mode for tasks of each length, and each mode's tokens as a multiple of plan mode's.
Wall time stays in the per-task table only, so the summary of a scripted run is exact.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from plangate.compare import Row

_TASK_WIDTHS = (4, 5, 5, 5, 7, 7, 6, 5, 6, 4, 4)
_STEP_WIDTHS = (5, 5, 5, 5, 5, 7, 7, 7, 7)
_NAMES = {"plan": "plan mode", "react": "ReAct", "act": "Act-only", "cot": "CoT-only"}


def table(rows: list[Row]) -> list[str]:
    """A row per task and mode, then totals per mode and each mode's tokens against plan mode's."""
    head = ("task", "mode", "ok", "calls", "in tok", "out tok", "think", "tools", "secs", "viol", "appr")
    lines = [_line(head, _TASK_WIDTHS)]
    for r in rows:
        cells = (str(r.task), r.mode, "yes" if r.success else "no", *_counts([r]))
        lines.append(_line((*cells, f"{r.seconds:.2f}", str(r.violations), str(r.approvals)), _TASK_WIDTHS))
    for mode in _modes(rows):
        mine = [r for r in rows if r.mode == mode]
        cells = ("all", mode, f"{sum(r.success for r in mine)}/{len(mine)}", *_counts(mine))
        extra = (f"{sum(r.seconds for r in mine):.2f}", str(sum(r.violations for r in mine)))
        lines.append(_line((*cells, *extra, str(sum(r.approvals for r in mine))), _TASK_WIDTHS))
    return lines + _verdict(rows)


def by_steps(rows: list[Row]) -> list[str]:
    """Per number of steps and mode: tasks, successes, model calls, tokens, and tokens against plan mode's."""
    head = ("steps", "mode", "tasks", "ok", "calls", "in tok", "out tok", "tokens", "x plan")
    lines = [_line(head, _STEP_WIDTHS)]
    for group in summary(rows):
        ratio = group["x_plan"]
        cells = (
            str(group["steps"]),
            group["mode"],
            str(group["tasks"]),
            str(group["ok"]),
            str(group["model_calls"]),
            str(group["input_tokens"]),
            str(group["output_tokens"]),
            str(group["input_tokens"] + group["output_tokens"]),
            "-" if ratio is None else f"{ratio:.2f}",
        )
        lines.append(_line(cells, _STEP_WIDTHS))
    return lines + _verdict(rows)


def summary(rows: list[Row]) -> list[dict[str, Any]]:
    """The by-steps table as data: one entry per (steps, mode), then one per mode over all tasks."""
    steps = _steps(rows)
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((str(steps[r.task]), r.mode), []).append(r)
    for r in rows:
        groups.setdefault(("all", r.mode), []).append(r)
    order = sorted({k for k, _ in groups if k != "all"}, key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else 0))
    result = []
    for key in [*order, "all"]:
        plan = groups.get((key, "plan"))
        for mode in _modes(rows):
            mine = groups.get((key, mode))
            if mine:
                result.append(_group(key, mode, mine, plan))
    return result


def to_json(rows: list[Row]) -> dict[str, Any]:
    """Everything, for ``--json``: the rows, the summary by steps, and the headline ratios."""
    return {"rows": [asdict(r) for r in rows], "by_steps": summary(rows), "ratios": _ratios(rows)}


def _group(key: str, mode: str, mine: list[Row], plan: list[Row] | None) -> dict[str, Any]:
    tokens = _tokens(mine)
    base = _tokens(plan) if plan else 0
    return {
        "steps": int(key) if key.isdigit() else key,
        "mode": mode,
        "tasks": len(mine),
        "ok": f"{sum(r.success for r in mine)}/{len(mine)}",
        "model_calls": sum(r.model_calls for r in mine),
        "input_tokens": sum(r.input_tokens for r in mine),
        "output_tokens": sum(r.output_tokens for r in mine),
        "x_plan": round(tokens / base, 4) if base else None,
    }


def _steps(rows: list[Row]) -> dict[int, int | str]:
    """A task's number of steps: its script's, else the most tool calls any mode made for it."""
    found: dict[int, int | str] = {}
    for r in rows:
        if r.steps is not None:
            found[r.task] = r.steps
    for r in rows:
        if r.task not in found:
            found[r.task] = max((x.tool_calls for x in rows if x.task == r.task), default=0) or "?"
    return found


def _ratios(rows: list[Row]) -> dict[str, dict[str, float]]:
    plan = [r for r in rows if r.mode == "plan"]
    tokens, calls = _tokens(plan), sum(r.model_calls for r in plan)
    if not tokens or not calls:
        return {}
    return {
        mode: {
            "tokens": round(_tokens(mine) / tokens, 4),
            "model_calls": round(sum(r.model_calls for r in mine) / calls, 4),
        }
        for mode in _modes(rows)
        if mode != "plan" and (mine := [r for r in rows if r.mode == mode])
    }


def _verdict(rows: list[Row]) -> list[str]:
    return [
        f"{_NAMES[mode]} used {ratio['tokens']:.2f}x the tokens and {ratio['model_calls']:.2f}x the model calls "
        "of plan mode"
        for mode, ratio in _ratios(rows).items()
    ]


def _counts(rows: list[Row]) -> tuple[str, ...]:
    return (
        str(sum(r.model_calls for r in rows)),
        str(sum(r.input_tokens for r in rows)),
        str(sum(r.output_tokens for r in rows)),
        str(sum(r.thinking_tokens for r in rows)),
        str(sum(r.tool_calls for r in rows)),
    )


def _tokens(rows: Iterable[Row]) -> int:
    return sum(r.input_tokens + r.output_tokens for r in rows)


def _modes(rows: list[Row]) -> list[str]:
    return list(dict.fromkeys(r.mode for r in rows))


def _line(cells: tuple[str, ...], widths: tuple[int, ...]) -> str:
    return "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))
