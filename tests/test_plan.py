from __future__ import annotations

import json
from typing import Any

import pytest

from plangate import LIMITS, SCHEMA_VERSION, Plan, PlanError, plan_json_schema


def test_the_design_brief_example_parses(refund_plan: dict[str, Any]) -> None:
    plan = Plan.parse(json.dumps(refund_plan))
    assert plan.schema_version == SCHEMA_VERSION
    assert [s.id for s in plan.steps] == [1, 2, 3, 4]
    assert plan.step(3).condition == '${1.status} == "paid"'
    assert plan.step(1).params == {"invoice_id": "42"}


def test_hash_ignores_layout_and_key_order_but_not_content(refund_plan: dict[str, Any]) -> None:
    plan = Plan.parse(refund_plan)
    reordered = json.loads(json.dumps(refund_plan, sort_keys=True, indent=7))
    reordered["steps"][0] = dict(reversed(list(reordered["steps"][0].items())))
    assert Plan.parse(reordered).hash == plan.hash
    assert len(plan.hash) == 64 and int(plan.hash, 16) >= 0

    explicit_defaults = json.loads(json.dumps(refund_plan))
    explicit_defaults["schema_version"] = 1
    explicit_defaults["steps"][1]["condition"] = None
    assert Plan.parse(explicit_defaults).hash == plan.hash, "a default spelled out is the same plan"

    edited = json.loads(json.dumps(refund_plan))
    edited["steps"][2]["params"]["invoice_id"] = "43"
    assert Plan.parse(edited).hash != plan.hash


def test_canonical_json_is_sorted_compact_utf8(refund_plan: dict[str, Any]) -> None:
    refund_plan["task"] = "Rembourser la facture n° 42"
    plan = Plan.parse(refund_plan)
    canonical = plan.canonical_json()
    assert canonical.startswith('{"category":"refunds","schema_version":1,"steps":[{"condition":null,')
    assert "n° 42" in canonical
    assert canonical == json.dumps(json.loads(canonical), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def test_json_schema_is_exported_with_its_version() -> None:
    schema = plan_json_schema()
    assert schema["$id"] == "urn:plangate:plan:1"
    assert schema["required"] == ["task", "category", "steps"]
    step = schema["$defs"]["Step"]
    assert set(step["required"]) == {"id", "tool", "rationale"}
    assert step["additionalProperties"] is False
    assert "${N.field.sub}" in step["properties"]["params"]["description"]


@pytest.mark.parametrize(
    ("mutate", "location"),
    [
        (lambda p: p.pop("category"), "category"),
        (lambda p: p["steps"][0].update(id="1"), "steps[0].id"),
        (lambda p: p["steps"][1].update(extra=True), "steps[1].extra"),
        (lambda p: p["steps"][2].pop("rationale"), "steps[2].rationale"),
        (lambda p: p["steps"][0].update(expected_output="objekt"), "steps[0].expected_output"),
        (lambda p: p["steps"][0].update(tool="rm -rf"), "steps[0].tool"),
        (lambda p: p.update(steps=[]), "steps"),
        (lambda p: p.update(schema_version=2), "schema_version"),
    ],
)
def test_shape_errors_name_where(refund_plan: dict[str, Any], mutate: Any, location: str) -> None:
    mutate(refund_plan)
    with pytest.raises(PlanError) as err:
        Plan.parse(refund_plan)
    assert location in [p.location for p in err.value.problems]


def test_all_shape_errors_are_reported_at_once_with_step_ids(refund_plan: dict[str, Any]) -> None:
    refund_plan["steps"][1].pop("tool")
    refund_plan["steps"][3]["expected_output"] = 5
    with pytest.raises(PlanError) as err:
        Plan.parse(refund_plan)
    assert [(p.location, p.step) for p in err.value.problems] == [("steps[1].tool", 2), ("steps[3].expected_output", 4)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not-json: line 1 column 2"),
        ('{"task": NaN}', "task: non-finite-number: NaN is not a JSON number"),
        ("[" * 100_000 + "]" * 100_000, r"too-deep: nested deeper than 32 levels"),
        (b"\xff\xfe", "not-utf8: not UTF-8 text"),
        ("x" * (LIMITS.max_bytes + 1), "too-large: .* is over the limit of"),
    ],
)
def test_unreadable_text_gives_a_plain_error(text: str | bytes, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        Plan.parse(text)


def test_limits_are_enforced(refund_plan: dict[str, Any]) -> None:
    deep: Any = "x"
    for _ in range(LIMITS.max_depth + 1):
        deep = [deep]
    refund_plan["steps"][0]["params"]["deep"] = deep
    with pytest.raises(PlanError, match="nested deeper than 32"):
        Plan.parse(refund_plan)
    refund_plan["steps"][0]["params"] = {"huge": "x" * (LIMITS.max_string + 1)}
    with pytest.raises(PlanError, match="over the limit of 65536"):
        Plan.parse(refund_plan)
    step = refund_plan["steps"][1]
    refund_plan["steps"] = [{**step, "id": i} for i in range(1, LIMITS.max_steps + 2)]
    with pytest.raises(PlanError, match="at most 500 items"):
        Plan.parse(refund_plan)


def test_plans_are_immutable(refund_plan: dict[str, Any]) -> None:
    plan = Plan.parse(refund_plan)
    with pytest.raises(ValueError, match="frozen"):
        plan.task = "other"  # type: ignore[misc]


def test_a_copy_with_changes_gets_a_new_hash(refund_plan: dict[str, Any]) -> None:
    plan = Plan.parse(refund_plan)
    original = plan.hash
    changed = plan.model_copy(update={"task": "something else"})
    assert changed.hash != original
    assert changed.hash == Plan.parse({**refund_plan, "task": "something else"}).hash


def test_later_fields_at_their_default_leave_the_hash_as_it_was() -> None:
    """A plan written before `order`, `after` and `on_failure` existed keeps its hash; using them changes it."""
    base = {"task": "t", "category": "c", "steps": [{"id": 1, "tool": "ping", "rationale": "r"}]}
    before = "23c25fdc0be948e926aa592680e6344b9e3a7925a668f34e3c9dd15a33471765"  # its hash before they existed
    plain = Plan.parse(base)
    spelled = Plan.parse(
        {**base, "order": "listed", "steps": [{**base["steps"][0], "after": [], "on_failure": "halt"}]}  # type: ignore[dict-item]
    )
    assert spelled.hash == plain.hash
    assert "after" not in plain.canonical_json() and "order" not in plain.canonical_json()
    assert plain.hash == before
    for changed in (
        {**base, "order": "dataflow"},
        {**base, "steps": [{**base["steps"][0], "on_failure": "continue"}]},  # type: ignore[dict-item]
    ):
        assert Plan.parse(changed).hash != plain.hash
