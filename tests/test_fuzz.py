"""Random and mutated input never crashes the checker or the policy, and every rejection names its rule."""

from __future__ import annotations

import contextlib
import copy
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plangate import POLICY_RULES, RULES, Catalogue, ConditionError, Policy, PolicyError, RefError, check, expr
from plangate.references import resolve, scan
from tests.conftest import EXAMPLES, load_plan

CATALOGUE = Catalogue.from_module(EXAMPLES / "business.py")
POLICY = Policy.load(EXAMPLES / "policy.yaml")
BASE = [load_plan(name) for name in ("refund", "cleanup", "broken")]
KNOWN = set(RULES) | {name for name in POLICY_RULES if ":" not in name}
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

text = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        [
            "${1}",
            "${1.total}",
            "${2.email}",
            "${9}",
            "${0.x}",
            "${",
            "${1.",
            "$${1}",
            "${1.lines.0}",
            "DELETE FROM t",
            "get_invoice",
            "send_email",
            "object",
            "string|null",
            "${1.total} > 1",
        ]
    ),
    st.text(alphabet="\u00e9\u4e2d\U0001f600\x00\u202e ${}.", max_size=20),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
    max_leaves=20,
)


def assert_well_formed(result: Any) -> None:
    for violation in result.violations:
        assert violation.rule in KNOWN or violation.rule.split(":")[0] in ("deny", "require", "sequence"), violation
        assert violation.message
    assert result.ok == (not result.violations)


@SETTINGS
@given(json_values)
def test_random_json_never_crashes(value: Any) -> None:
    assert_well_formed(check(value, CATALOGUE, POLICY, user="alice"))
    assert_well_formed(check(json.dumps(value), CATALOGUE, POLICY))


@st.composite
def mutated_plans(draw: st.DrawFn) -> Any:
    plan = copy.deepcopy(draw(st.sampled_from(BASE)))
    for _ in range(draw(st.integers(1, 6))):
        steps = plan["steps"]
        step = steps[draw(st.integers(0, len(steps) - 1))]
        action = draw(st.sampled_from(["set", "drop", "param", "dup", "swap", "deep", "huge", "tool", "cond"]))
        if action == "set":
            step[draw(st.sampled_from(sorted(step)))] = draw(json_values)
        elif action == "drop":
            step.pop(draw(st.sampled_from(sorted(step))))
        elif action == "param" and isinstance(step.get("params"), dict):
            step["params"][draw(text)] = draw(json_values)
        elif action == "dup":
            steps.append(copy.deepcopy(step))
        elif action == "swap" and len(steps) > 1:
            steps.reverse()
        elif action == "deep":
            deep: Any = draw(json_values)
            for _ in range(draw(st.integers(1, 60))):
                deep = [deep]
            step["params"] = {"x": deep}
        elif action == "huge":
            step["rationale"] = "x" * draw(st.sampled_from([10, 65_536, 65_537, 200_000]))
        elif action == "tool":
            step["tool"] = draw(st.sampled_from([*CATALOGUE.names, "nope", "", "get invoice"]))
        elif action == "cond":
            step["condition"] = draw(text)
    return plan


@SETTINGS
@given(mutated_plans(), st.sampled_from([None, "alice", "bob", "mallory"]), st.sampled_from([None, "operator", "x"]))
def test_mutated_plans_never_crash(plan: Any, user: str | None, role: str | None) -> None:
    assert_well_formed(check(plan, CATALOGUE, POLICY, user=user, role=role))
    assert_well_formed(check(plan, CATALOGUE))


@SETTINGS
@given(
    st.text(max_size=200)
    | st.lists(st.sampled_from(["${1.a}", "(", ")", "and", "not", "==", "'x'", "1", "["]), max_size=40).map(" ".join)
)
def test_conditions_parse_or_say_why(source: str) -> None:
    try:
        parsed = expr.parse(source)
    except ConditionError as exc:
        assert str(exc)
        return
    with contextlib.suppress(ConditionError, RefError):
        parsed.evaluate(lambda ref: {"a": 1})


@SETTINGS
@given(st.text(max_size=100), json_values)
def test_references_scan_and_resolve_or_say_why(source: str, output: Any) -> None:
    try:
        scan(source)
        resolve({"v": source}, {1: output})
    except RefError as exc:
        assert str(exc)


@SETTINGS
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "version",
                "name",
                "limits",
                "roles",
                "users",
                "deny",
                "sequences",
                "approval",
                "default_role",
                "resources",
                "extra",
            ]
        ),
        json_values,
        max_size=6,
    )
)
def test_random_policies_load_or_say_why(data: dict[str, Any]) -> None:
    try:
        Policy.from_data(data)
    except PolicyError as exc:
        assert str(exc).startswith("policy: ")
