"""ReAct, and plan mode against ReAct on the same tasks: react, compare."""

from __future__ import annotations

import json
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import click

from plangate.cli._common import (
    acting,
    base_url_option,
    db_option,
    model_option_saying,
    open_runtime,
    policy_option,
    prices_option,
    token_option,
    tools_option,
)
from plangate.cli._errors import EXIT_HALTED
from plangate.errors import UsageError


@click.command("react")
@click.argument("question", required=False)
@tools_option
@model_option_saying("Required: the model that thinks and chooses each action.")
@base_url_option
@click.option(
    "--policy",
    "policy_file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="PLANGATE_POLICY",
    help="Policy YAML file to hold each action against. Env: PLANGATE_POLICY.",
)
@click.option(
    "--as",
    "user",
    metavar="USER",
    help="Who asks (local mode: recorded, default 'react'; with accounts: your token's account).",
)
@token_option
@click.option("--role", metavar="ROLE", help="The asker's role, for the policy.")
@click.option(
    "--mode",
    type=click.Choice(["text", "native"]),
    default="text",
    show_default=True,
    help="text: Thought/Action/Observation; native: the provider's tool calling. "
    "A resumed run keeps the mode it started with.",
)
@click.option("--max-steps", default=10, show_default=True, help="Stop after this many steps (each tool call is one).")
@click.option("--max-tokens", default=1024, show_default=True, help="The most tokens per model turn.")
@click.option("--resume", "resume_id", metavar="ID", help="Carry on a run paused for an approval.")
@prices_option
@db_option
def react_command(
    *,
    question: str | None,
    tools_spec: str,
    model_spec: str | None,
    base_url: str | None,
    policy_file: Path | None,
    user: str | None,
    token: str | None,
    role: str | None,
    mode: str,
    max_steps: int,
    max_tokens: int,
    resume_id: str | None,
    prices_file: Path | None,
    db: str | None,
) -> None:
    """Answer QUESTION with a ReAct loop, printing each step as it happens and the answer last.

    Write actions pause for an approval (plangate approve RUN_ID ...), then --resume RUN_ID.
    Exit 0 when answered (or paused), 3 when stopped (max steps, a loop, unparseable output).
    """
    from plangate.costs import PriceTable
    from plangate.models import from_spec
    from plangate.react import ReActAgent

    if not model_spec:
        raise UsageError("ReAct needs a model: --model PROVIDER:NAME")
    if (question is None) == (resume_id is None):
        raise UsageError("give a QUESTION, or --resume RUN_ID")
    runtime = open_runtime(db, tools_spec, policy_file)
    if resume_id:  # carrying on a paused run starts work on it: only for someone who may see it
        paused = runtime.get(runtime.resolve_id(resume_id))
        user = acting(
            runtime, user, token, "execute", category=paused.category, requested_by=paused.requested_by, default="react"
        )
    else:
        user = acting(runtime, user, token, "submit", default="react")
    agent = ReActAgent(
        from_spec(model_spec, base_url=base_url),
        runtime.catalogue,
        runtime.store,
        policy=runtime.policy,
        clock=runtime.clock,
        prices=PriceTable.load(prices_file),
        mode="native" if mode == "native" else "text",
        max_steps=max_steps,
        max_tokens=max_tokens,
        user=user,
        role=role,
        on_step=_print_step,
    )
    with closing(runtime), closing(agent):  # the agent's connection may be one made again after a store cut
        result = agent.resume(runtime.resolve_id(resume_id)) if resume_id else agent.run(question or "")
    click.echo(
        f"run {result.run_id}: {result.model_calls} model calls, {result.usage.input} input and "
        f"{result.usage.output} output tokens, {result.tool_calls} tool calls"
    )
    if result.status == "answered":
        click.echo(f"Final answer: {result.answer}")
    elif result.status == "paused":
        click.echo(
            f"{result.reason}\n  approve with: plangate approve {result.run_id[:8]} --as APPROVER --hash "
            f"{result.pending_hash}\n  then: plangate react --resume {result.run_id[:8]} --tools ... --model ..."
        )
    else:
        click.echo(f"stopped: {result.reason}")
    sys.exit(EXIT_HALTED if result.status == "stopped" else 0)


def _print_step(step: Any) -> None:
    if step.thought:
        click.echo(f"[{step.number}] Thought: {step.thought}")
    if step.tool:
        click.echo(f"[{step.number}] Action: {step.tool} {json.dumps(step.arguments, ensure_ascii=False)}")
    if step.kind in ("action", "refused", "unparsed"):
        text = step.observation if len(step.observation) <= 300 else step.observation[:297] + "..."
        click.echo(f"[{step.number}] Observation: {text}")


@click.command("compare")
@click.argument("tasks_file", metavar="TASKS.yaml", type=click.Path(dir_okay=False, path_type=Path))
@tools_option
@model_option_saying("Required: the model both modes use.")
@base_url_option
@policy_option
@click.option(
    "--modes",
    default="plan,react,act,cot",
    show_default=True,
    help="Which to run, comma-separated: plan, react, act (Act-only) and cot (CoT-only).",
)
@click.option("--max-tokens", default=2048, show_default=True, help="The most tokens per model call.")
@click.option("--max-steps", default=15, show_default=True, help="The most steps of a ReAct or Act-only run.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows, the summary by steps and the ratios as JSON.")
@prices_option
@db_option
def compare_command(
    *,
    tasks_file: Path,
    tools_spec: str,
    model_spec: str | None,
    base_url: str | None,
    policy_file: Path | None,
    modes: str,
    max_tokens: int,
    max_steps: int,
    as_json: bool,
    prices_file: Path | None,
    db: str | None,
) -> None:
    """Run each task in plan mode, ReAct, Act-only and CoT-only with the same model and tools; print tables.

    --model scripted answers from the tasks' own scripts (their steps and answer), the same
    decisions in every mode, with a fixed clock: an offline run that repeats exactly.
    """
    from plangate._comparescript import ScriptClock, scripted_model
    from plangate.compare import MODES, Comparison, by_steps, load_tasks, table, to_json
    from plangate.costs import PriceTable
    from plangate.models import Model, from_spec

    if not model_spec:
        raise UsageError("the comparison needs a model: --model PROVIDER:NAME, or --model scripted")
    chosen = tuple(m.strip() for m in modes.split(",") if m.strip())
    unknown = [m for m in chosen if m not in MODES]
    if unknown or not chosen:
        raise UsageError(f"--modes: choose from {', '.join(MODES)} (not {', '.join(unknown) or 'nothing'})")
    tasks = load_tasks(tasks_file)
    runtime = open_runtime(db, tools_spec, policy_file)
    clock = runtime.clock
    model: Model
    if model_spec == "scripted":
        scripts = {t.question: t.script for t in tasks if t.script is not None}
        if len(scripts) < len(tasks):
            raise UsageError(f"{tasks_file}: --model scripted needs 'steps' and 'answer' for every task")
        model, clock = scripted_model(scripts), ScriptClock()
    else:
        model = from_spec(model_spec, base_url=base_url)
    comparison = Comparison(
        model=model,
        catalogue=runtime.catalogue,
        store=runtime.store,
        policy=runtime.policy,
        clock=clock,
        prices=PriceTable.load(prices_file),
        max_tokens=max_tokens,
        max_steps=max_steps,
        modes=chosen,  # type: ignore[arg-type]  # checked against MODES above
    )
    rows = comparison.run(tasks)
    if as_json:
        click.echo(json.dumps(to_json(rows), indent=2, ensure_ascii=False))
        return
    for line in [*table(rows), "", *by_steps(rows)]:
        click.echo(line)


COMMANDS = (react_command, compare_command)
