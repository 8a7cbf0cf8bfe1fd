"""The planner: a task in, a plan out, from the plan library or from a reasoning model.

First the library: a template whose pattern the task fits is filled deterministically,
no model needed (this is the offline default). Otherwise the model is given the task, the
catalogue, the plan's format (as compact types, or
the full JSON Schema) and the policy's limits (prompt files in
``plangate/prompts``) and a thinking budget set from the task's complexity. Its answer is
parsed leniently (code fences, prose around the JSON, a wrapping ``{"plan": ...}``,
trailing commas) and validated strictly; if it is not a valid plan, the model gets one
repair round with the exact errors, then the planner gives up with a clear error. A plan
that parses but breaks the checker or the policy is *not* repaired: it goes to
``submit``, which rejects it with its reasons.

Every model call is recorded in the cost ledger (tokens by kind, cost, the budget it
got); a policy's ``budgets`` cap refuses a call that could take the plan or the day
over its limit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import timedelta
from importlib import resources
from string import Template
from typing import Any, Literal

from plangate import library, metrics, tracing
from plangate._clock import Clock, SystemClock, iso
from plangate._lenient import answer_json as _answer_json
from plangate._lenient import json_text as _json_text
from plangate.budget import Budget, BudgetAllocator
from plangate.costs import PriceTable, most_prompt_tokens
from plangate.errors import PlanError, PlangateError, RefusedInputError
from plangate.models import Message, Model, ModelError, ModelRequest, ModelResponse, Usage
from plangate.models._base import token_count
from plangate.plan import SCHEMA_VERSION, Plan, plan_json_schema
from plangate.policy import Envelope, Policy
from plangate.store import CallRow, Store
from plangate.tools import Catalogue, render_tool
from plangate.tracing import Traces

MAX_ANSWER_TOKENS = 8192


class PlanningError(PlangateError):
    """No plan came out: the model failed twice, refused, errored, or a cost cap said no."""

    def __init__(self, message: str, *, calls: tuple[CallRow, ...] = ()) -> None:
        super().__init__(message)
        self.calls = calls


@dataclass(frozen=True, kw_only=True)
class PlanningResult:
    """A plan and how it was made: from a template, or by which model, at what cost."""

    plan: Plan
    source: Literal["library", "model"]
    template: str | None = None
    slots: dict[str, Any] = field(default_factory=dict)
    model: str | None = None
    budget: Budget | None = None
    calls: tuple[CallRow, ...] = ()
    thinking: str = ""

    @property
    def usage(self) -> Usage:
        return sum(
            (Usage(input=c.input_tokens, output=c.output_tokens, thinking=c.thinking_tokens) for c in self.calls),
            Usage(),
        )

    @property
    def cost(self) -> float | None:
        costs = [c.cost for c in self.calls]
        return None if any(c is None for c in costs) else sum(c for c in costs if c is not None)

    @property
    def seconds(self) -> float:
        return sum(c.seconds for c in self.calls)

    def record(self) -> dict[str, Any]:
        """What the audit log keeps about how the plan was made (thinking included)."""
        return {
            "source": self.source,
            "template": self.template,
            "slots": self.slots,
            "model": self.model,
            "budget": self.budget.tokens if self.budget else None,
            "effort": self.budget.effort if self.budget else None,
            "expected_steps": self.budget.expected_steps if self.budget else None,
            "calls": len(self.calls),
            "input_tokens": self.usage.input,
            "output_tokens": self.usage.output,
            "thinking_tokens": self.usage.thinking,
            "cost_usd": self.cost,
            "seconds": round(self.seconds, 3),
            "thinking": self.thinking,
        }


def prompt(name: str) -> Template:
    return Template(resources.files("plangate").joinpath("prompts", f"{name}.md").read_text())


@dataclass
class Planner:
    """Plans tasks over a catalogue: the library first, then the model (when there is one)."""

    catalogue: Catalogue
    model: Model | None = None
    store: Store | None = None
    policy: Policy | None = None
    prices: PriceTable = field(default_factory=PriceTable.load)
    allocator: BudgetAllocator = field(default_factory=BudgetAllocator)
    clock: Clock = field(default_factory=SystemClock)
    use_library: bool = True
    max_tokens: int = MAX_ANSWER_TOKENS
    schema_text: Literal["compact", "json"] = "compact"
    """How the prompt shows the plan's format: TypeScript-like types (about a sixth of the
    tokens), or the full JSON Schema. The request carries the JSON Schema either way, for
    providers that constrain decoding to it."""
    traces: Traces | None = None
    """Where model calls' spans go (:mod:`plangate.tracing`); None: the process's, off unless configured."""

    @classmethod
    def model_alone(
        cls,
        catalogue: Catalogue,
        model: Model,
        *,
        store: Store | None = None,
        policy: Policy | None = None,
        prices: PriceTable | None = None,
        clock: Clock | None = None,
        max_tokens: int = MAX_ANSWER_TOKENS,
    ) -> Planner:
        """A planner that always asks the model (the library off), for measuring the model itself."""
        return cls(
            catalogue,
            model=model,
            store=store,
            policy=policy,
            prices=prices or PriceTable.load(),
            clock=clock or SystemClock(),
            use_library=False,
            max_tokens=max_tokens,
        )

    def plan(self, task: str) -> PlanningResult:
        task = task.strip()
        if not task:
            raise PlanningError("the task is empty")
        if self.use_library and self.store is not None:
            found = library.match(self.store.templates(), task)
            if found is not None:
                return PlanningResult(
                    plan=found.plan, source="library", template=found.template.name, slots=found.slots
                )
        if self.model is None:
            raise PlanningError(
                f"no template in the library fits {task!r}, and no model was given to plan it "
                "(use --model PROVIDER:NAME)"
            )
        return self._with_model(self.model, task)

    # -- the model tier --------------------------------------------------------------------
    def _with_model(self, model: Model, task: str) -> PlanningResult:
        budget = self.allocator.allocate(task, len(self.catalogue))
        request = ModelRequest(
            system=self._system_prompt(),
            messages=(Message(role="user", content=task),),
            max_tokens=self.max_tokens,
            thinking_budget=budget.tokens,
            effort=budget.effort,
            json_schema=plan_json_schema(),
        )
        calls: list[CallRow] = []
        response = self._call(model, request, task=task, budget=budget, purpose="plan", calls=calls)
        thinking = [response.thinking] if response.thinking else []
        try:
            plan = parse_answer(response)
        except PlanError as first:
            repair = ModelRequest(
                **{
                    **request.__dict__,
                    "messages": (
                        *request.messages,
                        Message(role="assistant", content=response.text),
                        Message(role="user", content=prompt("repair").substitute(errors=_errors(first))),
                    ),
                }
            )
            response = self._call(model, repair, task=task, budget=budget, purpose="repair", calls=calls)
            thinking += [response.thinking] if response.thinking else []
            try:
                plan = parse_answer(response)
            except PlanError as second:
                raise PlanningError(
                    f"{model.name} did not write a valid plan, even after one repair round:\n"
                    f"first answer: {_errors(first)}\nafter repair: {_errors(second)}",
                    calls=tuple(calls),
                ) from None
        return PlanningResult(
            plan=plan,
            source="model",
            model=model.name,
            budget=budget,
            calls=tuple(calls),
            thinking="\n\n".join(thinking),
        )

    def _call(
        self, model: Model, request: ModelRequest, *, task: str, budget: Budget, purpose: str, calls: list[CallRow]
    ) -> ModelResponse:
        self._check_caps(model, request, calls)
        at = iso(self.clock.now())
        row = CallRow(
            id=self.clock.new_id(),
            at=at,
            plan_id=None,
            task=task,
            model=model.name,
            purpose=purpose,
            expected_steps=budget.expected_steps,
            budget=budget.tokens,
            effort=budget.effort,
        )
        try:
            response = (self.traces or tracing.default()).complete(model, request, purpose=purpose)
            usage = _checked_usage(model.name, response.usage)
        except ModelError as exc:
            self._record(calls, replace(row, error=str(exc)))
            raise PlanningError(f"planning failed: {exc}", calls=tuple(calls)) from None
        self._record(
            calls,
            replace(
                row,
                input_tokens=usage.input,
                output_tokens=usage.output,
                thinking_tokens=usage.thinking,
                cost=self.prices.cost(model.name, usage),
                seconds=response.seconds,
                ok=True,
            ),
        )
        return response

    def _record(self, calls: list[CallRow], row: CallRow) -> None:
        calls.append(row)
        metrics.model_call(row)
        if self.store is not None:
            with self.store.transaction():
                self.store.record_call(row)

    def _check_caps(self, model: Model, request: ModelRequest, calls: list[CallRow]) -> None:
        caps = self.policy.budgets if self.policy is not None else None
        if caps is None or (caps.per_plan_usd is None and caps.per_day_usd is None):
            return
        price = self.prices.price(model.name)
        if price is None:
            raise PlanningError(
                f"the policy caps planning costs, but the price table has no price for "
                f"{model.name}: add one (--prices FILE)",
                calls=tuple(calls),
            )
        prompt = most_prompt_tokens(request)
        worst = price.cost(Usage(input=prompt, output=request.max_tokens + (request.thinking_budget or 0)))
        spent_plan = sum(c.cost or 0.0 for c in calls)
        if caps.per_plan_usd is not None and spent_plan + worst > caps.per_plan_usd:
            raise PlanningError(
                f"refused by the policy's budgets.per_plan_usd ({caps.per_plan_usd:.4f} USD): this call could cost "
                f"up to {worst:.4f} USD on top of {spent_plan:.4f} already spent on this plan",
                calls=tuple(calls),
            )
        if caps.per_day_usd is not None and self.store is not None:
            since = iso(self.clock.now() - timedelta(days=1))
            today = sum(c.cost or 0.0 for c in self.store.calls(since=since))
            if today + worst > caps.per_day_usd:
                raise PlanningError(
                    f"refused by the policy's budgets.per_day_usd ({caps.per_day_usd:.4f} USD): {today:.4f} USD "
                    f"spent in the last 24 hours, and this call could cost up to {worst:.4f} USD",
                    calls=tuple(calls),
                )

    def _system_prompt(self) -> str:
        tools = "\n".join(render_tool(t) for t in self.catalogue)
        return prompt("plan").substitute(
            tools=tools,
            limits=_limits(self.policy),
            schema=self._schema(),
            extract=prompt("plan_extract").template if "extract" in self.catalogue else "",
        )

    def _schema(self) -> str:
        if self.schema_text == "compact":
            return prompt("plan_schema").substitute(schema_version=SCHEMA_VERSION)
        schema = json.dumps(plan_json_schema(), separators=(",", ":"))
        return f"The plan's JSON Schema (version {SCHEMA_VERSION}):\n\n{schema}\n"


def _checked_usage(model: str, usage: Usage) -> Usage:
    """The response's usage, refused when a count is not a whole number of tokens (the ledger
    would record a negative or made-up cost, and a cap would count it)."""
    return Usage(
        input=token_count(model, "input", usage.input),
        output=token_count(model, "output", usage.output),
        thinking=token_count(model, "thinking", usage.thinking),
    )


def _limits(policy: Policy | None) -> str:
    if policy is None:
        return ""
    lines = []
    if policy.limits.max_steps is not None:
        lines.append(f"- at most {policy.limits.max_steps} steps")
    if policy.limits.max_external_calls is not None:
        lines.append(f"- at most {policy.limits.max_external_calls} steps that call outside (external tools)")
    lines += [f"- never: {rule.message or rule.name} (parameters matching {rule.pattern!r})" for rule in policy.deny]
    lines += [
        f"- {', '.join(rule.params)} of {', '.join(rule.tools)}: one read-only SQL statement (a single SELECT)"
        for rule in policy.require
    ]
    if policy.categories is not None:
        lines.append("- the category must be one of these (a step outside its category's envelope is refused):")
        lines += [f"  - {name}: {_envelope(envelope)}" for name, envelope in policy.categories.items()]
    return "\nThe policy's limits:\n" + "\n".join(lines) + "\n" if lines else ""


def _envelope(envelope: Envelope) -> str:
    """What a category's plans may do, in one line of the planning prompt."""
    allows = []
    if envelope.tools is not None:
        allows.append("every tool" if envelope.tools == ("*",) else f"tools {', '.join(envelope.tools)}")
    if envelope.effects is not None:
        allows.append(f"{' or '.join(envelope.effects)} tools only")
    if not envelope.external:
        allows.append("no external tools")
    said = "; ".join(allows)
    return f"{envelope.description} ({said})" if envelope.description else said


# -- lenient parsing (the helpers live in plangate._lenient) ----------------------------------


def parse_answer(response: ModelResponse) -> Plan:
    """The plan in a model's answer; :class:`PlanError` says exactly what is wrong."""
    text = response.text.strip().lstrip("\ufeff")
    if not text:
        raise PlanError("the answer was empty" + (" (cut off at max_tokens)" if _cut(response) else ""))
    candidate = _json_text(text)
    if candidate is None:
        raise PlanError("the answer holds no JSON object" + (" (cut off at max_tokens)" if _cut(response) else ""))
    try:
        data = _answer_json(candidate)
    except RefusedInputError as exc:
        if exc.rule != "not-json":
            where = f"{exc.location}: " if exc.location else ""
            raise PlanError(f"{where}{exc.rule}: {exc.detail}") from None
        cut = " (the answer was cut off at max_tokens)" if _cut(response) else ""
        raise PlanError(f"not JSON: {exc.detail}{cut}") from None
    if isinstance(data, dict) and set(data) == {"plan"} and isinstance(data["plan"], dict):
        data = data["plan"]
    return Plan.parse(data)


def _cut(response: ModelResponse) -> bool:
    return response.stop_reason in ("max_tokens", "length")


def _errors(error: PlanError) -> str:
    """``summary: problem; problem`` on one line (a summary that introduces a list ends in its own colon)."""
    if not error.problems:
        return error.summary
    return f"{error.summary.removesuffix(':')}: {'; '.join(str(p) for p in error.problems)}"
