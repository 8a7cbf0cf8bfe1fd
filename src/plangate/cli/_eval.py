"""Measuring a planning model before it goes live: eval planner."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from plangate.cli._common import base_url_option, db_option, json_option, model_option_saying, prices_option
from plangate.cli._errors import EXIT_VIOLATIONS
from plangate.errors import UsageError


def _rate(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """A share of the tasks: 0.9, or 90%."""
    if value is None:
        return None
    text = value.strip()
    try:
        rate = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a share: write 0.9 or 90%") from None
    if not 0 <= rate <= 1:
        raise click.BadParameter(f"{value!r} is not between 0 and 1 (0% and 100%)")
    return rate


def _threshold(measure: str, what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option(
        f"--min-{measure}", f"min_{measure}", metavar="X", callback=_rate, help=f"Exit 1 below this share {what}."
    )


@click.group("eval")
def eval_group() -> None:
    """Measure a part of the agent on a suite of tasks before it goes live."""


@eval_group.command("planner")
@click.argument("tasks_file", metavar="TASKS.yaml", type=click.Path(dir_okay=False, path_type=Path))
@model_option_saying("Required: the model whose plans are measured (the plan library is not used).")
@base_url_option
@click.option(
    "--tools", "tools_spec", envvar="PLANGATE_TOOLS", metavar="MODULE", help="Tools module (default: the suite's)."
)
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Policy YAML file (default: the suite's).",
)
@click.option("--as", "user", metavar="USER", help="Who asks, for the policy's role rules (default: the suite's).")
@click.option("--max-tokens", default=8192, show_default=True, help="The most tokens the model may write for a plan.")
@prices_option
@db_option
@json_option
@_threshold("valid", "of tasks that get a plan that parses")
@_threshold("check", "of tasks whose plan passes the checker")
@_threshold("policy", "of tasks whose plan the policy judges as the task expects")
@_threshold("match", "of tasks with a reference whose plan does what the reference does")
def eval_planner_command(
    *,
    tasks_file: Path,
    model_spec: str | None,
    base_url: str | None,
    tools_spec: str | None,
    policy_file: Path | None,
    user: str | None,
    max_tokens: int,
    prices_file: Path | None,
    db: str | None,
    as_json: bool,
    **minimums: float | None,
) -> None:
    """Plan every task of TASKS.yaml with --model and measure the plans: valid, passing the
    checker, judged by the policy as expected, doing what the reference plan does; with
    tokens, cost and seconds. Progress goes to standard error as tasks finish.

    Model calls go into the cost ledger like any planning call (plangate usage), and the
    policy's cost caps hold. Exit 0, 1 when a --min-... threshold is missed, 2 for bad input.
    """
    from dataclasses import replace

    from plangate.cli._common import open_runtime
    from plangate.costs import PriceTable
    from plangate.evaluate import MEASURES, Evaluation, progress_line, table
    from plangate.models import from_spec
    from plangate.suite import load_suite

    if not model_spec:
        raise UsageError("the evaluation needs a model: --model PROVIDER:NAME")
    suite = load_suite(tasks_file)
    tools = tools_spec or suite.tools
    if not tools:
        raise UsageError("give --tools MODULE, or name the tools module in the tasks file (tools: ...)")
    policy = policy_file or suite.policy
    thresholds = {m: rate for m in MEASURES if (rate := minimums.get(f"min_{m}")) is not None}
    if "policy" in thresholds and policy is None:
        raise UsageError("--min-policy needs a policy: --policy FILE, or policy: in the tasks file")
    tasks = [replace(t, user=user) for t in suite.tasks] if user else list(suite.tasks)
    runtime = open_runtime(db, tools, policy)
    evaluation = Evaluation(
        model=from_spec(model_spec, base_url=base_url),
        catalogue=runtime.catalogue,
        policy=runtime.policy,
        store=runtime.store,
        prices=PriceTable.load(prices_file),
        clock=runtime.clock,
        max_tokens=max_tokens,
    )
    report = evaluation.run(
        tasks, progress=lambda n, result: click.echo(progress_line(n, len(tasks), result), err=True)
    )
    click.echo(json.dumps(report.to_dict(), indent=2) if as_json else "\n".join(table(report)))
    misses = report.misses(thresholds)
    for miss in misses:
        click.echo(miss, err=True)
    sys.exit(EXIT_VIOLATIONS if misses else 0)


COMMANDS = (eval_group,)
