"""What the checker and the policy keep, and the shortcuts they take, against the answer worked out afresh.

A tool copied with ``dataclasses.replace`` is another tool: nothing the first one remembered of its
schemas may answer for the copy. A ``$${`` escape is literal text, known before the run: it is no
reference, so a value made only of such text is held to the parameter's type, to the resource a
deny rule is scoped to and to a require rule's check, as plainly as any other text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from pydantic import Field, ValidationError
from typing_extensions import TypedDict

from plangate import Catalogue, Plan, Policy, check, tool
from plangate.references import resolve
from plangate.tools import Tool

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


class Totals(TypedDict):
    total: float


@tool
def get_totals(invoice_id: str) -> Totals:
    return {"total": 1.0}


@tool(effect="write")
def pay(amount: float, note: str = "") -> str:
    return "paid"


def _plan(*steps: dict[str, Any], category: str = "c") -> Plan:
    return Plan.parse({"task": "t", "category": category, "steps": [{"rationale": "needed", **step} for step in steps]})


def _rules(result: Any) -> list[str]:
    return [v.rule for v in result.violations]


READ_THEN_PAY = (
    {"id": 1, "tool": "get_totals", "params": {"invoice_id": "1"}},
    {"id": 2, "tool": "pay", "params": {"amount": "${1.total}"}},
)


def test_a_tool_copied_with_another_output_schema_types_references_by_its_own() -> None:
    plan = _plan(*READ_THEN_PAY)
    assert check(plan, Catalogue([get_totals, pay])).ok  # the first tool's answers are now remembered
    text = {"type": "object", "properties": {"total": {"type": "string"}}, "required": ["total"]}
    copied = dataclasses.replace(get_totals, output_schema=text)
    assert _rules(check(plan, Catalogue([copied, pay]))) == ["ref-type"]
    assert _rules(check(plan, Catalogue([_fresh(get_totals, output_schema=text), pay]))) == ["ref-type"]
    assert check(plan, Catalogue([get_totals, pay])).ok  # the first tool still says what it said


def test_a_tool_copied_with_another_parameter_schema_types_references_by_its_own() -> None:
    plan = _plan(*READ_THEN_PAY)
    assert check(plan, Catalogue([get_totals, pay])).ok
    flags = {**pay.params_schema, "properties": {**pay.params_schema["properties"], "amount": {"type": "boolean"}}}
    copied = dataclasses.replace(pay, params_schema=flags)
    assert _rules(check(plan, Catalogue([get_totals, copied]))) == ["ref-type"]


def _fresh(original: Tool, **changes: Any) -> Tool:
    """The tool made again from its function, then changed: nothing remembered."""
    return dataclasses.replace(tool(original.fn, name=original.name, effect=original.effect), **changes)


def test_an_escaped_reference_is_text_and_does_not_fit_a_number_parameter() -> None:
    catalogue = Catalogue([get_totals, pay])
    for value in ("$${1}", "total $${1.total}"):
        plan = _plan({"id": 1, "tool": "pay", "params": {"amount": value}})
        assert _rules(check(plan, catalogue)) == ["param-type"], value
        assert pay.param_errors(resolve(plan.steps[0].params, {}))  # the call would be refused
    taking = _plan(*READ_THEN_PAY[:1], {"id": 2, "tool": "pay", "params": {"amount": "$${1} ${1.total}"}})
    assert _rules(check(taking, catalogue)) == ["param-type"]  # text with a reference inside, as before


NINES = {
    "name": "no-nines",
    "tools": ["get_invoice"],
    "resources": ["invoice:9*"],
    "params": ["invoice_id"],
    "pattern": "9",
}


def _nines(policy: Policy) -> Policy:
    return Policy.from_data({**policy.model_dump(mode="json"), "deny": [NINES]})


def test_a_resource_scoped_deny_rule_holds_for_a_value_with_an_escape(catalogue: Catalogue, policy: Policy) -> None:
    nines = _nines(policy)
    for invoice in ("97", "97$${", "97 $${x}"):
        plan = _plan({"id": 1, "tool": "get_invoice", "params": {"invoice_id": invoice}}, category="lookups")
        assert _rules(check(plan, catalogue, nines, user="bob")) == ["deny:no-nines"], invoice
        called = resolve(plan.steps[0].params, {})
        violations = nines.call_violations(plan.steps[0], catalogue["get_invoice"], called)
        assert [v.rule for v in violations] == ["deny:no-nines"], invoice


def test_a_resource_scoped_deny_rule_holds_for_a_referenced_value_with_dollar_brace(
    catalogue: Catalogue, policy: Policy
) -> None:
    nines = _nines(policy)
    plan = _plan(
        {"id": 1, "tool": "lookup_customer", "params": {"customer_id": "c1"}},
        {"id": 2, "tool": "get_invoice", "params": {"invoice_id": "${1.name}"}},
        category="lookups",
    )
    assert check(plan, catalogue, nines, user="bob").ok  # not known before the run
    step = plan.steps[1]
    for name in ("97", "97${", "97${x}"):  # what step 1 gave, resolved for the call
        called = resolve(step.params, {1: {"name": name}})
        violations = nines.call_violations(step, catalogue["get_invoice"], called)
        assert [v.rule for v in violations] == ["deny:no-nines"], name


def test_a_require_rule_checks_a_statement_with_only_escapes_before_the_run() -> None:
    @tool(effect="write")
    def sql(query: str) -> str:
        return ""

    rules = Policy.from_data(
        {
            "version": 1,
            "name": "p",
            "require": [
                {
                    "name": "reads-only",
                    "tools": ["sql"],
                    "params": ["query"],
                    "sql": "read-only",
                    "tables": "CREATE TABLE invoices (id TEXT PRIMARY KEY, total REAL);",
                }
            ],
        }
    )
    catalogue = Catalogue([sql])
    writes = _plan({"id": 1, "tool": "sql", "params": {"query": "DELETE FROM invoices -- $${x}"}})
    assert _rules(check(writes, catalogue, rules)) == ["require:reads-only"]
    reads = _plan({"id": 1, "tool": "sql", "params": {"query": "SELECT '$${x}' FROM invoices"}})
    assert check(reads, catalogue, rules).ok
    later = _plan({"id": 1, "tool": "sql", "params": {"query": "DELETE FROM invoices -- ${1}"}})
    assert _rules(check(later, catalogue, rules)) == ["ref-self"]  # a reference: checked at the call


def test_a_policy_cannot_be_changed_in_place_behind_its_hash_and_caches(catalogue: Catalogue) -> None:
    """A loaded policy's rules are fixed: what it remembered (its hash, its matchers' answers) stays true."""
    policy = Policy.load(EXAMPLES / "policy.yaml")
    plan = _plan({"id": 1, "tool": "run_sql", "params": {"query": "SELECT 1"}}, category="maintenance")
    before, policy_hash = check(plan, catalogue, policy, user="alice"), policy.hash
    assert _rules(before) == ["tool-not-allowed"]  # and the policy remembers it
    widen = {"tools": ["*"], "scopes": ["*"]}
    edits: dict[str, Callable[[Any], object]] = {
        "a deny rule added": lambda p: p.deny.append(NINES),
        "a require rule dropped": lambda p: p.require.clear(),
        "a sequence rule dropped": lambda p: p.sequences.pop(),
        "a role widened": lambda p: p.roles.__setitem__("support", p.roles["operator"]),
        "a role's tools edited": lambda p: p.roles["support"].tools.append("run_sql"),
        "a user given a role": lambda p: p.users.update({"mallory": "operator"}),
        "a role removed": lambda p: p.roles.pop("auditor"),
        "a category added": lambda p: p.categories.setdefault("anything", widen),
        "a user removed": lambda p: p.users.__delitem__("alice"),
    }
    for what, edit in edits.items():
        with pytest.raises((TypeError, AttributeError), match=r"immutable|has no attribute"):
            edit(policy)
            raise AssertionError(f"{what}: the policy took an edit in place")
    assert policy.hash == policy_hash == Policy.load(EXAMPLES / "policy.yaml").hash
    assert _rules(check(plan, catalogue, policy, user="alice")) == _rules(before)


def test_a_copy_of_a_policy_with_changes_is_validated_and_as_immutable(policy: Policy) -> None:
    roles = {**policy.roles, "support": policy.roles["operator"]}
    changed = policy.model_copy(update={"roles": roles, "deny": [NINES]})
    assert changed.roles["support"] == policy.roles["operator"] and changed.deny[0].name == "no-nines"
    with pytest.raises(TypeError, match="immutable"):
        changed.roles["auditor"] = policy.roles["operator"]
    with pytest.raises(ValidationError, match="mallory"):
        policy.model_copy(update={"users": {"mallory": "root"}})  # no such role: refused as a loaded policy is


@tool
def tag(label: Annotated[str, Field(min_length=3, max_length=4)], kind: Literal["${x}", "plain"] = "plain") -> str:
    return label


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"label": "$${"}, ["param-type"]),  # the tool is given "${": two characters, under min_length
        ({"label": "ab$${"}, []),  # the tool is given "ab${": four, within max_length
        ({"label": "abc", "kind": "$${x}"}, []),  # the tool is given "${x}", one of its literals
        ({"label": "abc", "kind": "${x}"}, ["ref-syntax"]),  # a reference, and a malformed one
        ({"label": "$${1}"}, []),  # "${1}": text of three characters, no reference
    ],
)
def test_a_parameters_constraints_are_held_to_the_value_the_tool_is_given(
    params: dict[str, Any], expected: list[str]
) -> None:
    plan = _plan({"id": 1, "tool": "tag", "params": params})
    assert _rules(check(plan, Catalogue([tag]))) == expected, params
    called = resolve(plan.steps[0].params, {}) if not expected or expected == ["param-type"] else None
    if called is not None:  # what the engine makes of it agrees
        assert bool(tag.param_errors(called)) == bool(expected), called
