"""What the checker and the policy keep between checks: never a stale answer, never more than a bound.

The checker skips the parameter validator for steps whose parameters are all plain and of
their types; the policy keeps what it says of a step by its tool, role, category (and
resource, where a rule reads it). Both must give exactly the answers worked out afresh.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import pickle
from typing import Annotated, Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import AfterValidator, Field

from plangate import Catalogue, Plan, Policy, check, tool
from plangate.policy import FACTS_KEPT
from plangate.tools import extract


@tool
def plain(name: str, amount: float, count: int = 0, flag: bool = False) -> str:
    return name


def _short(text: str) -> str:
    if text.startswith("x"):
        raise ValueError("no x here")
    return text


@tool
def guarded(name: Annotated[str, AfterValidator(_short)]) -> str:
    return name


@tool
def bounded(name: Annotated[str, Field(max_length=3)], count: Annotated[int, Field(ge=0)] = 0) -> str:
    return name


@tool
def choice(kind: Literal["a", "b"], note: str | None = None) -> str:
    return kind


def test_only_plain_parameters_are_checked_without_the_validator() -> None:
    assert plain.plain_params is not None
    assert dict(plain.plain_params.types) == {
        "name": "string",
        "amount": "number",
        "count": "integer",
        "flag": "boolean",
    }
    assert plain.plain_params.required == {"name", "amount"}
    for other in (guarded, bounded, choice):  # a function, a constraint, a literal, a union: the validator decides
        assert other.plain_params is None
        assert not other.params_plainly_valid({"name": "ok"})
    assert not guarded.params_plainly_valid({"name": "xy"})
    assert guarded.param_errors({"name": "xy"})  # which the validator refuses


values = st.one_of(
    st.text(max_size=6),
    st.sampled_from(["${1}", "${1.total}", "a ${2.name}", "é", "x"]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)
params = st.dictionaries(st.sampled_from(["name", "amount", "count", "flag", "kind", "other"]), values, max_size=5)


@settings(max_examples=400, deadline=None)
@given(params, st.sampled_from([plain, guarded, bounded, choice]))
def test_parameters_said_plainly_valid_are_valid_to_the_validator(given: dict[str, Any], which: Any) -> None:
    if which.params_plainly_valid(given):
        errors = which.param_errors(given)
        assert all(isinstance(e.get("input"), str) and "${" in e["input"] for e in errors), errors


def _plan(invoice: str = "42", *, category: str = "lookups", tool_name: str = "get_invoice") -> Plan:
    step = {"id": 1, "tool": tool_name, "params": {"invoice_id": invoice}, "rationale": "needed"}
    return Plan.parse({"task": "Look", "category": category, "steps": [step]})


def _rules(result: Any) -> list[str]:
    return [v.rule for v in result.violations]


def test_a_changed_policy_is_not_answered_from_the_first_ones_facts(catalogue: Catalogue, policy: Policy) -> None:
    assert check(_plan(), catalogue, policy, user="alice").ok  # support may use get_invoice
    roles = dict(policy.roles)
    roles["support"] = roles["support"].model_copy(update={"tools": ("lookup_*",)})
    changed = policy.model_copy(update={"roles": roles})
    assert _rules(check(_plan(), catalogue, changed, user="alice")) == ["tool-not-allowed"]
    assert check(_plan(), catalogue, policy, user="alice").ok  # the first policy still says what it said
    reloaded = Policy.from_yaml(policy.canonical_json().replace('"get_*"', '"lookup_*"'))
    assert _rules(check(_plan(), catalogue, reloaded, user="alice")) == ["tool-not-allowed"]


def test_a_changed_tool_is_not_answered_from_the_first_ones_facts(catalogue: Catalogue, policy: Policy) -> None:
    first = check(_plan(), catalogue, policy, user="bob")
    assert first.ok
    assert first.decision is not None and first.decision.approval == "auto"
    writing = dataclasses.replace(catalogue["get_invoice"], effect="write", idempotent=True)
    other = Catalogue([writing if t.name == "get_invoice" else t for t in catalogue])
    second = check(_plan(), other, policy, user="bob")
    assert _rules(second) == ["category-envelope"]  # lookups may only read
    assert second.decision is not None and second.decision.approval == "human"
    assert check(_plan(), catalogue, policy, user="bob").ok  # the first catalogue's tool is still a read
    overriding = Policy.from_data({**policy.model_dump(mode="json"), "tools": {"get_invoice": {"effect": "write"}}})
    assert _rules(check(_plan(), catalogue, overriding, user="bob")) == ["category-envelope"]


DENY_NINES = {
    "name": "no-nines",
    "tools": ["get_invoice"],
    "resources": ["invoice:9*"],
    "params": ["invoice_id"],
    "pattern": "9",
}


def test_a_rule_that_reads_the_resource_is_held_to_each_steps_own(catalogue: Catalogue, policy: Policy) -> None:
    nines = Policy.from_data({**policy.model_dump(mode="json"), "deny": [DENY_NINES]})
    for invoice, rules in [("42", []), ("97", ["deny:no-nines"]), ("49", []), ("97", ["deny:no-nines"])]:
        assert _rules(check(_plan(invoice), catalogue, nines, user="bob")) == rules, invoice


def test_the_facts_a_policy_keeps_are_bounded(catalogue: Catalogue, policy: Policy) -> None:
    nines = Policy.from_data({**policy.model_dump(mode="json"), "deny": [DENY_NINES]})
    tool_ = catalogue["get_invoice"]
    for number in range(FACTS_KEPT + 50):
        step = _plan(str(number)).steps[0]
        nines.step_facts("operator", "lookups", step, tool_)
    assert len(nines.facts_kept) <= FACTS_KEPT
    assert _rules(check(_plan("97"), catalogue, nines, user="bob")) == ["deny:no-nines"]  # past the bound: worked out


@tool
def fetch(name: str) -> dict[str, int]:
    return {name: 1}


@tool
def shaped(schema: dict[str, Any]) -> Any:
    return schema


declaring = dataclasses.replace(shaped, output_schema_for=extract.output_schema_for)
"""A tool whose output's shape each step declares, as ``extract``'s does."""


def _chars(key: Any) -> int:
    """The text a remembered key holds (its strings, through tuples)."""
    if isinstance(key, str):
        return len(key)
    return sum(_chars(part) for part in key) if isinstance(key, tuple) else 0


def _kept_text(*tools: Any) -> int:
    return sum(_chars(key) for found in tools for key in [*found._located, *found._kept])


def test_long_references_and_parameter_names_are_not_kept(catalogue: Catalogue) -> None:
    tools = Catalogue([fetch, plain])
    for number in range(20):
        path = f"k{number}" + "x" * 5_000
        step = {"id": 2, "tool": "plain", "params": {"name": f"${{1.{path}}}", "amount": 1}, "rationale": "r"}
        step["params"]["y" * 5_000 + str(number)] = "${1.total}"  # type: ignore[index]
        first = {"id": 1, "tool": "fetch", "params": {"name": "a"}, "rationale": "r"}
        plan = Plan.parse({"task": "t", "category": "c", "steps": [first, step]})
        found = _rules(check(plan, tools))
        assert found == ["ref-type", "unknown-param"], found  # worked out each time, as at first
    assert _kept_text(fetch, plain) < 1_000  # a plan's long text is not held between checks


def test_a_shape_a_step_declares_is_not_kept() -> None:
    tools = Catalogue([declaring, plain])
    for number in range(20):
        schema = {"type": "object", "properties": {f"p{number}": {"type": "integer"}}, "description": "d" * 5_000}
        first = {"id": 1, "tool": "shaped", "params": {"schema": schema}, "rationale": "r"}
        second = {"id": 2, "tool": "plain", "params": {"name": f"${{1.p{number}}}", "amount": 1}, "rationale": "r"}
        plan = Plan.parse({"task": "t", "category": "c", "steps": [first, second]})
        result = check(plan, tools)
        assert _rules(result) == ["ref-type"]
        assert "integer" in result.violations[0].message
    assert not declaring._kept and not plain._kept  # neither the shape nor what follows from it stays


@tool(untrusted_output=True)
def web(url: str) -> str:
    return url


def test_long_parameter_names_are_not_kept_by_the_sink_rules() -> None:
    sink = {"name": "mail", "tools": ["plain"], "control": True}
    guarding = Policy.from_data({"version": 1, "name": "sinks", "sinks": [sink]})
    tools = Catalogue([web, plain])
    for number in range(20):
        params = {"name": "a", "amount": 1, "z" * 5_000 + str(number): 1}
        second = {"id": 2, "tool": "plain", "params": params, "rationale": "r", "condition": '${1} == "go"'}
        first = {"id": 1, "tool": "web", "params": {"url": "u"}, "rationale": "r"}
        plan = Plan.parse({"task": "t", "category": "c", "steps": [first, second]})
        assert _rules(check(plan, tools, guarding)).count("sink:mail") == 3
    assert sum(_chars(key[1]) for key in guarding.sinks_kept) < 1_000


def test_a_checked_plan_cannot_be_changed_in_place(catalogue: Catalogue, policy: Policy) -> None:
    plan = Plan.parse(
        {
            "task": "t",
            "category": "lookups",
            "steps": [
                {"id": 1, "tool": "get_invoice", "params": {"invoice_id": "42", "tags": {"a": [1]}}, "rationale": "r"},
                {"id": 2, "tool": "get_invoice", "params": {"invoice_id": "43"}, "rationale": "r", "after": [1]},
            ],
        }
    )
    assert _rules(check(plan, catalogue)) == ["unknown-param"]  # the analysis and the hash are kept now
    first, approved = plan.steps[0], plan.hash
    edits = [
        lambda: first.params.__setitem__("invoice_id", "${7.id}"),  # a reference the kept analysis never saw
        lambda: first.params.pop("tags"),
        lambda: first.params["tags"].update(b=2),  # type: ignore[union-attr]
        lambda: first.params["tags"]["a"].append("${9}"),  # type: ignore[index,union-attr]
        lambda: plan.steps.append(first),
        lambda: plan.steps.__setitem__(1, first),
        lambda: plan.steps[1].after.append(2),
        lambda: first.after.append(2),  # a default, as well as a value given
        lambda: (
            Plan.parse({**plan.data(), "steps": [{"id": 1, "tool": "t", "rationale": "r"}]}).steps[0].params.update(a=1)
        ),
    ]
    for edit in edits:
        with pytest.raises(TypeError, match="immutable"):
            edit()
    assert plan.hash == approved == hashlib.sha256(plan.canonical_json().encode()).hexdigest()
    changed = Plan.parse({**plan.data(), "steps": [{**first.model_dump(), "params": {"invoice_id": "${7.id}"}}]})
    assert _rules(check(changed, catalogue)) == ["ref-missing-step"]  # a change is a new plan, checked afresh
    assert changed.hash != approved
    copied = pickle.loads(pickle.dumps(plan))
    assert copied.hash == approved and copy.deepcopy(plan).hash == approved
