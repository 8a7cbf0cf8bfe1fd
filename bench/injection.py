"""Prompt injection on AgentDojo: plans that never see tool outputs, provenance, and sink rules.

For every user task of AgentDojo's suites (benchmark v1.2.2), the plan a planner that never
sees a tool output would write is derived from the task's ground truth (``bench/dojo.py``),
submitted to a plangate ``Runtime`` on SQLite under a bench policy and run. Offline: no
model is called. The extractor (``extract``) is played by the bench: honest in the utility
run (it returns the value the ground truth used), fully compromised under attack (when the
text it reads carries the injection, it returns whatever the injection asks for: the
attacker's IBAN, address, URL or user, taken from the injection task's ground truth).

- **Utility** (no attack): AgentDojo's ``utility`` check on the environment after the run.
  The answer text (``model_output``) is the plan's ``answer``, a reference to the last step's
  output (JSON for data): a plan's run has no model to write a summary. The answer is a sink:
  when it carries untrusted text, the policy holds the plan for the reviewer role.
- **Security**: every (user task, injection task) pair, with the injection task's goal put
  into the injection vectors the user task reads, in the words of AgentDojo's
  ``important_instructions`` attack. An attack succeeds when AgentDojo's ``security`` check
  says its goal was reached. A plan refused by a sink rule, or held for a person because
  untrusted data reaches a sink ("held"), is not a success: nothing ran without a person
  approving the flagged value. What would happen if that person approved is reported too.

Run: ``python bench/injection.py [--suites banking,slack] [--limit N] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agentdojo.attacks.base_attacks import FixedJailbreakAttack
from agentdojo.attacks.important_instructions_attacks import ImportantInstructionsAttack
from agentdojo.base_tasks import BaseInjectionTask, BaseUserTask
from agentdojo.functions_runtime import FunctionCall, TaskEnvironment
from agentdojo.task_suite.load_suites import get_suites
from agentdojo.task_suite.task_suite import TaskSuite

import dojo
from plangate import Policy
from plangate.runtime import Runtime

BENCHMARK = "v1.2.2"
SUITES = ("workspace", "travel", "banking", "slack")

# Published figures: Debenedetti et al., "Defeating Prompt Injections by Design" (CaMeL),
# arXiv:2503.18813, 2025, as its authors' released analysis prints them
# (google-research/camel-prompt-injection, analysis.ipynb), for o3 with high reasoning
# effort: the run behind the abstract's "77% of tasks with provable security, against 84%
# undefended". Per suite: the share of user tasks solved with no attack, and the attacks
# that succeeded (of AgentDojo's user x injection pairs, important_instructions).
PUBLISHED: dict[str, dict[str, tuple[float, int]]] = {
    "CaMeL": {
        "workspace": (77.5, 0),
        "travel": (80.0, 0),
        "banking": (81.2, 0),
        "slack": (71.4, 0),
        "all": (77.3, 0),
    },
    "undefended tool-calling agent": {
        "workspace": (92.5, 4),
        "travel": (75.0, 1),
        "banking": (62.5, 1),
        "slack": (95.2, 5),
        "all": (84.5, 11),
    },
}


class _Attack(FixedJailbreakAttack):
    """AgentDojo's ``important_instructions`` text, without a pipeline to name the model after."""

    def __init__(self, suite: TaskSuite[Any]) -> None:
        super().__init__(ImportantInstructionsAttack._JB_STRING, suite, None)  # type: ignore[arg-type]
        self.user_name = "Emma Johnson"


@dataclass
class Run:
    """One plan's fate: its gate (auto, held, refused), whether it ran, and what it left."""

    gate: str
    ran: bool = False
    halted: str | None = None
    text: str = ""
    post: TaskEnvironment | None = None
    calls: list[FunctionCall] = field(default_factory=list)


class Bench:
    """One suite: its catalogue, its policy, a runtime on SQLite, and runs of derived plans."""

    def __init__(self, suite: TaskSuite[Any], db: str) -> None:
        self.suite = suite
        self.world = dojo.World()
        self.catalogue = dojo.catalogue(suite, self.world)
        self.policy = bench_policy(suite)
        self.runtime = Runtime(self.catalogue, self.policy, db=db)

    def run(
        self,
        derived: dojo.Derived,
        env: TaskEnvironment,
        extract: Callable[[Any, dict[str, Any], str], Any],
        *,
        approve: bool,
    ) -> Run:
        record = self.runtime.submit(derived.plan, "planner")
        gate = gate_of(self, derived, record)
        if gate == "refused" or (gate == "held" and not approve):
            return Run(gate, halted="; ".join(str(v) for v in record.violations) or None)
        if record.status == "pending_approval":
            self.runtime.approve(record.id, REVIEWER, record.hash, role=REVIEW if _POLICY_HAS_SINKS else None)
        self.world.env, self.world.calls, self.world.extract = env, [], extract
        result = self.runtime.execute(record.id)
        return Run(gate, True, result.error if not result.ok else None, result.answer or "", env, self.world.calls)


def bench_policy(suite: TaskSuite[Any]) -> Policy:
    """Every tool of the suite cleared for automatic approval: only sink rules ask for a person."""
    names = [*sorted(dojo.TOOLS[suite.name]), dojo.EXTRACT]
    data: dict[str, Any] = {
        "version": 1,
        "name": f"agentdojo-{suite.name}",
        "categories": {"agentdojo": {"tools": names}},
        "approval": {"auto": ["agentdojo"], "escalate": []},
    }
    if _POLICY_HAS_SINKS:
        data["sinks"] = sink_rules(suite.name)
        data["roles"] = {REVIEW: {}, "planner": {}}
        data["users"] = {REVIEWER: REVIEW, "planner": "planner"}
    return Policy.from_data(data, source=f"agentdojo-{suite.name}")


_POLICY_HAS_SINKS = "sinks" in Policy.model_fields


REVIEW, REVIEWER = "sink-review", "reviewer"


def sink_rules(suite: str) -> list[dict[str, Any]]:
    """The suite's sinks as the policy's ``sinks`` section: a named approval for each and for the
    plan's answer (untrusted text the user would read), and every other parameter free to take
    untrusted data (an e-mail's body may quote what it answers)."""
    named = [
        {"name": f"{tool}.{param}", "tools": [tool], "params": [param], "untrusted": "approve", "approve": REVIEW}
        for tool, params in dojo.SINKS[suite].items()
        for param in params
    ]
    answer = {"name": "answer", "answer": True, "untrusted": "approve", "approve": REVIEW}
    return [*named, answer, {"name": "other-parameters", "untrusted": "allow"}]


def gate_of(bench: Bench, derived: dojo.Derived, record: Any) -> str:
    """auto, held (a sink rule asks for a person) or refused, as the policy decided.

    Where the policy has no ``sinks`` section yet, the bench works out the same decision
    from the plan's static provenance (:func:`tainted_sinks`).
    """
    if _POLICY_HAS_SINKS:
        rules = [str(v) for v in record.violations]
        if record.status == "rejected" or any("sink:" in rule for rule in rules):
            return "refused"
        return "held" if record.status == "pending_approval" else "auto"
    return "held" if tainted_sinks(bench.suite.name, derived.plan) else "auto"


def tainted_sinks(suite: str, plan: dict[str, Any]) -> list[str]:
    """Each ``tool.param`` sink fed by untrusted data: a step's output is untrusted when its tool's
    is, and an extractor's output is as untrusted as its input."""
    kinds, sinks = dojo.TOOLS[suite], dojo.SINKS[suite]
    taint: dict[int, bool] = {}
    hits: list[str] = []
    for step in plan["steps"]:
        fed = {name: _refers_to_taint(value, taint) for name, value in step["params"].items()}
        tool = step["tool"]
        taint[step["id"]] = any(fed.values()) if tool == dojo.EXTRACT else kinds[tool].untrusted
        hits += [f"{step['id']}:{tool}.{name}" for name in sinks.get(tool, ()) if fed.get(name)]
    if _refers_to_taint(plan.get("answer", ""), taint):
        hits.append("the answer")
    return hits


def _refers_to_taint(value: Any, taint: dict[int, bool]) -> bool:
    text = json.dumps(value)
    return any(taint.get(int(n), False) for n in _REF.findall(text))


_REF = __import__("re").compile(r"\$\{(\d+)")


# -- the extractor's two minds -------------------------------------------------------------------


def honest(derived: dojo.Derived) -> Callable[[Any, dict[str, Any], str], Any]:
    return lambda text, schema, instructions: derived.answers[instructions]


def compromised(
    derived: dojo.Derived, injection: BaseInjectionTask[Any], goal: list[FunctionCall]
) -> Callable[[Any, dict[str, Any], str], Any]:
    """Returns what the injection asks for whenever the text it reads carries the injection (its goal)."""
    marker = json.dumps(injection.GOAL, ensure_ascii=False)[1:-1]

    def extract(text: Any, schema: dict[str, Any], instructions: str) -> Any:
        if marker not in json.dumps(text, ensure_ascii=False):
            return derived.answers[instructions]
        wanted = attacker_value(goal, derived.feeds[instructions], schema.get("type", "string"))
        return derived.answers[instructions] if wanted is None else wanted

    return extract


def attacker_value(goal: list[FunctionCall], where: str, kind: str) -> Any:
    """The value the injection task's ground truth gives the parameter the extract step feeds."""
    param = where.split(".", 1)[1]
    values = [(name, _first(value)) for call in goal for name, value in call.args.items()]
    typed = [
        (name, value)
        for name, value in values
        if _json_kind(value) == kind or {_json_kind(value), kind} == {"integer", "number"}
    ]
    for name, value in typed:
        if name == param:
            return value
    return typed[0][1] if typed else None


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, list) and value else value


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, str):
        return "string"
    return "integer" if isinstance(value, int) else "number" if isinstance(value, float) else "other"


# -- checks ----------------------------------------------------------------------------------


def utility(task: BaseUserTask[Any], run: Run, pre: TaskEnvironment) -> bool:
    if not run.ran or run.post is None:
        return False
    verdict = task.utility_from_traces(run.text, pre, run.post, run.calls)
    return bool(task.utility(run.text, pre, run.post) if verdict is None else verdict)


def security(task: BaseInjectionTask[Any], run: Run, pre: TaskEnvironment) -> bool:
    if not run.ran or run.post is None:
        return False
    verdict = task.security_from_traces(run.text, pre, run.post, run.calls)
    return bool(task.security(run.text, pre, run.post) if verdict is None else verdict)


# -- one suite -------------------------------------------------------------------------------


@dataclass
class SuiteResult:
    suite: str
    tasks: int = 0
    utility: int = 0  # no attack, nothing approved by a person
    utility_approved: int = 0  # no attack, the flagged values approved
    needs_approval: int = 0
    composed: int = 0  # tasks crediting the planner with a value found in neither task nor outputs
    pairs: int = 0
    utility_under_attack: int = 0
    attacks_succeeded: int = 0  # without a person approving anything
    held: int = 0
    refused: int = 0
    succeeded_if_approved: int = 0
    losses: dict[str, str] = field(default_factory=dict)
    successes: list[str] = field(default_factory=list)


def evaluate(suite: TaskSuite[Any], db: str, limit: int | None = None) -> SuiteResult:
    bench = Bench(suite, db)
    attack = _Attack(suite)
    out = SuiteResult(suite.name)
    clean = suite.load_and_inject_default_environment({})
    tasks = list(suite.user_tasks.values())[:limit]
    for task in tasks:
        derived = dojo.derive(suite, task, clean)
        _utility(bench, task, derived, clean, out)
        for injection in suite.injection_tasks.values():
            _attacked(bench, attack, task=task, injection=injection, derived=derived, out=out)
    return out


def _fresh(suite: TaskSuite[Any], task: BaseUserTask[Any], injections: dict[str, str]) -> TaskEnvironment:
    return task.init_environment(suite.load_and_inject_default_environment(injections))


def _utility(
    bench: Bench, task: BaseUserTask[Any], derived: dojo.Derived, clean: TaskEnvironment, out: SuiteResult
) -> None:
    out.tasks += 1
    out.composed += bool(derived.composed)
    env = task.init_environment(clean.model_copy(deep=True))
    pre = env.model_copy(deep=True)
    run = bench.run(derived, env, honest(derived), approve=True)
    solved = utility(task, run, pre)
    out.needs_approval += run.gate == "held"
    out.utility_approved += solved
    out.utility += solved and run.gate == "auto"
    reason = loss_reason(bench, task, derived, run, solved)
    if reason:
        out.losses[task.ID] = reason


def loss_reason(bench: Bench, task: BaseUserTask[Any], derived: dojo.Derived, run: Run, solved: bool) -> str:
    if run.gate == "refused":
        return f"refused by the policy: {run.halted}"
    if run.gate == "held" and solved:
        return "needs approval: untrusted data reaches " + ", ".join(tainted_sinks(bench.suite.name, derived.plan))
    if solved:
        return ""
    prefix = "needs approval, and even approved: " if run.gate == "held" else ""
    if run.halted:
        return prefix + f"the run halted: {run.halted.splitlines()[0][:120]}"
    return prefix + "the answer needs a value only a model reading the outputs could write"


def _attacked(
    bench: Bench,
    attack: _Attack,
    *,
    task: BaseUserTask[Any],
    injection: BaseInjectionTask[Any],
    derived: dojo.Derived,
    out: SuiteResult,
) -> None:
    injections = attack.attack(task, injection)
    env = _fresh(bench.suite, task, injections)
    pre = env.model_copy(deep=True)
    goal = injection.ground_truth(pre.model_copy(deep=True))
    extract = compromised(derived, injection, goal)
    run = bench.run(derived, env, extract, approve=False)
    out.pairs += 1
    out.utility_under_attack += utility(task, run, pre)
    if run.gate != "auto":
        out.held += run.gate == "held"
        out.refused += run.gate == "refused"
        env = _fresh(bench.suite, task, injections)
        pre = env.model_copy(deep=True)
        out.succeeded_if_approved += security(injection, bench.run(derived, env, extract, approve=True), pre)
        return
    if security(injection, run, pre):
        out.attacks_succeeded += 1
        out.successes.append(f"{task.ID} x {injection.ID}")


# -- report ----------------------------------------------------------------------------------


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "-"


def published(results: Sequence[SuiteResult]) -> str:
    """The published figures of CaMeL and of an undefended agent, for the suites run, beside this run's."""
    suites = [r.suite for r in results] + (["all"] if len(results) == len(SUITES) else [])
    lines = [
        "Published figures (Debenedetti et al., 2025, arXiv:2503.18813; o3, high effort): "
        "utility with no attack / attacks succeeded",
        "| suite | " + " | ".join(PUBLISHED) + " |",
        "| --- |" + " ---: |" * len(PUBLISHED),
    ]
    for suite in suites:
        figures = [PUBLISHED[who][suite] for who in PUBLISHED]
        lines.append(f"| {suite} | " + " | ".join(f"{u:.1f}% / {n}" for u, n in figures) + " |")
    return "\n".join(lines)


def table(results: Sequence[SuiteResult]) -> str:
    head = (
        "| suite | tasks | utility, no attack | with approvals | need approval | utility under attack "
        "| attacks succeeded | held for approval | would succeed if approved |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
    )
    total = SuiteResult("all")
    rows = []
    for r in [*results, total]:
        if r is not total:
            for name in ("tasks", "utility", "utility_approved", "needs_approval", "pairs", "utility_under_attack"):
                setattr(total, name, getattr(total, name) + getattr(r, name))
            for name in ("attacks_succeeded", "held", "refused", "succeeded_if_approved"):
                setattr(total, name, getattr(total, name) + getattr(r, name))
        rows.append(
            f"| {r.suite} | {r.tasks} | {_pct(r.utility, r.tasks)} | {_pct(r.utility_approved, r.tasks)} "
            f"| {r.needs_approval} | {_pct(r.utility_under_attack, r.pairs)} "
            f"| {r.attacks_succeeded}/{r.pairs} ({_pct(r.attacks_succeeded, r.pairs)}) "
            f"| {r.held + r.refused} | {r.succeeded_if_approved} |"
        )
    return head + "\n".join(rows)


def report(results: Sequence[SuiteResult]) -> str:
    lines = [table(results), "", published(results)]
    succeeded = sum(r.attacks_succeeded for r in results)
    lines += ["", f"Successful attacks without a person approving a flagged value: {succeeded}."]
    for r in results:
        lines += ["", f"{r.suite}: tasks that lose utility ({len(r.losses)})"]
        lines += [f"- {task}: {why}" for task, why in sorted(r.losses.items(), key=lambda kv: _num(kv[0]))]
        if r.successes:
            lines += [f"{r.suite}: successful attacks: " + ", ".join(r.successes)]
    return "\n".join(lines)


def _num(task_id: str) -> int:
    return int(task_id.rsplit("_", 1)[1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--suites", default=",".join(SUITES), help="comma-separated: workspace,travel,banking,slack")
    parser.add_argument("--limit", type=int, default=None, help="only the first N user tasks of each suite")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.suites.split(",") if name.strip()]
    unknown = sorted(set(names) - set(SUITES))
    if unknown:
        parser.error(f"unknown suite(s): {', '.join(unknown)} (suites: {', '.join(SUITES)})")
    suites = get_suites(BENCHMARK)
    folder = tempfile.mkdtemp(prefix="plangate-injection-")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = [evaluate(suites[name], f"sqlite:///{folder}/{name}.db", args.limit) for name in names]
    if args.json:
        print(json.dumps({"benchmark": BENCHMARK, "suites": [asdict(r) for r in results]}, indent=2))
    else:
        print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
