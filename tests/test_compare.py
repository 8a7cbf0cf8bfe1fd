"""The comparison on the bundled multi-step tasks: plan mode, ReAct, Act-only and CoT-only.

The scripted runs are exact (a fixed clock, counted tokens), so the tables are pinned here:
the one the command line prints (the library's stand-in tokenizer) and the README's (the
SmolLM2 tokenizer, as bench/compare.py counts).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from plangate.cli import main
from plangate.compare import by_steps
from tests.conftest import EXAMPLES, ROOT

TASKS = str(EXAMPLES / "compare" / "tasks.yaml")
TOOLS = str(EXAMPLES / "compare" / "tools.py")


def compare(tmp_path: Path, *options: str) -> Any:
    done = CliRunner().invoke(
        main,
        ["compare", TASKS, "--tools", TOOLS, "--model", "scripted", "--db", f"sqlite:///{tmp_path}/c.db", *options],
    )
    assert done.exit_code == 0, done.output
    return done.stdout


def test_the_scripted_task_set_gives_the_table_by_steps(tmp_path: Path) -> None:
    report = json.loads(compare(tmp_path, "--json"))
    got = {
        (g["steps"], g["mode"]): (g["ok"], g["model_calls"], g["input_tokens"], g["output_tokens"])
        for g in report["by_steps"]
    }
    assert got[(3, "plan")] == ("1/1", 1, 1229, 172) and got[(3, "react")] == ("1/1", 4, 2760, 77)
    assert got[(10, "plan")] == ("1/1", 1, 1236, 532) and got[(10, "react")] == ("1/1", 11, 9570, 252)
    assert got[("all", "act")] == ("7/7", 50, 39089, 1127) and got[("all", "cot")] == ("0/7", 7, 369, 308)
    assert report["ratios"] == {
        "react": {"tokens": 3.7725, "model_calls": 7.1429},
        "act": {"tokens": 3.5818, "model_calls": 7.1429},
        "cot": {"tokens": 0.0603, "model_calls": 1.0},
    }
    # ReAct's share grows with the number of steps; plan mode makes one call whatever the length
    react = [g["x_plan"] for g in report["by_steps"] if g["mode"] == "react" and g["steps"] != "all"]
    assert react == sorted(react) and react[0] > 2 and react[-1] > 5
    rows = report["rows"]
    assert {r["mode"] for r in rows} == {"plan", "react", "act", "cot"} and len(rows) == 28
    assert all(r["success"] for r in rows if r["mode"] != "cot") and not any(
        r["tool_calls"] for r in rows if r["mode"] == "cot"
    )
    assert sum(r["approvals"] for r in rows if r["mode"] == "react") == 13  # one per write action, against 7 plans


def test_the_command_prints_both_tables_and_runs_the_baselines_alone(tmp_path: Path) -> None:
    lines = compare(tmp_path, "--modes", "act,cot").splitlines()
    assert lines[0].split()[:3] == ["task", "mode", "ok"]
    assert {line.split()[1] for line in lines[1:15]} == {"act", "cot"}
    head = lines.index("") + 1
    assert lines[head].split() == [
        "steps",
        "mode",
        "tasks",
        "ok",
        "calls",
        "in",
        "tok",
        "out",
        "tok",
        "tokens",
        "x",
        "plan",
    ]
    assert lines[head + 1].split()[:4] == ["3", "act", "1", "1/1"] and lines[head + 2].split()[:4] == [
        "3",
        "cot",
        "1",
        "0/1",
    ]
    refused = CliRunner().invoke(
        main, ["compare", TASKS, "--tools", TOOLS, "--model", "scripted", "--modes", "plan,nope"]
    )
    assert refused.exit_code != 0 and "--modes" in refused.output


def test_the_readme_table_is_what_the_bench_measures() -> None:
    spec = importlib.util.spec_from_file_location("bench_compare", ROOT / "bench" / "compare.py")
    assert spec is not None and spec.loader is not None
    bench: Any = importlib.util.module_from_spec(spec)
    sys.modules["bench_compare"] = bench
    spec.loader.exec_module(bench)
    measured = by_steps(bench.run(bench.tokenizer()))
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("steps   mode  tasks") :].split("```", 1)[0].rstrip("\n").splitlines()
    assert measured == block
