from __future__ import annotations

import textwrap
from typing import Any

import pytest

from plangate import POLICY_RULES, Catalogue, Plan, Policy, PolicyError, tool
from tests.conftest import EXAMPLES


@tool(tags=["pii"], scopes=["crm:read"])
def read_person(person_id: str) -> dict[str, str]:
    return {}


@tool(effect="irreversible", external=True, scopes=["mail:send"])
def mail(to: str, body: str) -> str:
    return ""


@tool(effect="write", resource="row:{key}", scopes=["db:write"])
def put(key: str, value: str) -> None:
    return None


@tool(effect="write", resource="db:prod", scopes=["db:admin"])
def sql(query: str, options: dict[str, str] = {}) -> None:  # noqa: B006 - a JSON default, never mutated
    return None


@tool
def ping() -> bool:
    return True


CAT = Catalogue([read_person, mail, put, sql, ping])


def policy(body: str = "") -> Policy:
    return Policy.from_yaml("version: 1\nname: test\n" + textwrap.dedent(body))


def plan(*steps: dict[str, Any], category: str = "c", order: str = "listed") -> Plan:
    return Plan.parse(
        {"task": "t", "category": category, "order": order, "steps": [{"rationale": "r", **s} for s in steps]}
    )


def hits(decision: Any) -> list[tuple[int | None, str]]:
    return [(v.step, v.rule) for v in decision.violations]


def test_limits() -> None:
    p = policy("limits: {max_steps: 2, max_external_calls: 1}\n")
    decision = p.evaluate(
        plan(
            {"id": 1, "tool": "mail", "params": {"to": "a", "body": "b"}},
            {"id": 2, "tool": "mail", "params": {"to": "a", "body": "${1}"}},
            {"id": 3, "tool": "ping"},
        ),
        CAT,
    )
    assert hits(decision) == [(None, "max-steps"), (None, "max-external-calls")]
    assert "2 steps call outside (steps 1, 2); the limit is 1" in decision.violations[1].message


def test_roles_allow_tools_and_scopes() -> None:
    p = policy("""
        roles:
          support: {tools: ["read_*", "mail", "ping"], scopes: ["crm:*"]}
          admin: {tools: ["*"], scopes: ["*"]}
        users: {alice: support}
        """)
    steps = (
        {"id": 1, "tool": "read_person", "params": {"person_id": "p"}},
        {"id": 2, "tool": "mail", "params": {"to": "a", "body": "b"}},
        {"id": 3, "tool": "sql", "params": {"query": "select 1"}},
    )
    alice = p.evaluate(plan(*steps), CAT, user="alice")
    assert hits(alice) == [(2, "missing-scope"), (3, "tool-not-allowed")]
    assert alice.role == "support"
    assert "needs scope mail:send, which role 'support' does not hold" in alice.violations[0].message
    assert hits(p.evaluate(plan(*steps), CAT, user="alice", role="admin")) == []
    assert hits(p.evaluate(plan(*steps), CAT, user="mallory")) == [(None, "unknown-role")]
    assert hits(p.evaluate(plan(*steps), CAT, role="root")) == [(None, "unknown-role")]


def test_default_role_and_no_roles_at_all() -> None:
    p = policy("roles: {viewer: {tools: [ping]}}\ndefault_role: viewer\n")
    assert hits(p.evaluate(plan({"id": 1, "tool": "mail", "params": {"to": "a", "body": "b"}}), CAT)) == [
        (1, "tool-not-allowed")
    ]
    assert hits(policy().evaluate(plan({"id": 1, "tool": "mail", "params": {"to": "a", "body": "b"}}), CAT)) == []


def test_deny_patterns_look_into_nested_values_and_match_resources() -> None:
    p = policy(r"""
        deny:
          - name: no-delete
            tools: [sql]
            resources: ["db:prod*"]
            params: [query, options]
            pattern: "(?i)\\bdelete\\b"
        """)
    decision = p.evaluate(
        plan(
            {"id": 1, "tool": "sql", "params": {"query": "DELETE FROM t"}},
            {
                "id": 2,
                "tool": "sql",
                "params": {"query": "select 1", "options": {"after": "delete from x"}},
                "condition": "${1} == null",
            },
            {"id": 3, "tool": "sql", "params": {"query": "select 'deleted'"}, "condition": "${2} == null"},
        ),
        CAT,
    )
    assert hits(decision) == [(1, "deny:no-delete"), (2, "deny:no-delete")]
    assert "param 'options.after': matches the denied pattern" in decision.violations[1].message


def test_a_deny_rule_s_message_is_set_apart_from_the_parameter_it_names() -> None:
    p = Policy.from_yaml(
        "version: 1\nname: p\ndeny:\n"
        "  - {name: no-key, tools: [mail], pattern: 'key', message: Keys must never be sent by mail}\n"
        "  - {name: no-secret, tools: [mail], pattern: secret}\n"
    )
    decision = p.evaluate(plan({"id": 1, "tool": "mail", "params": {"to": "a@b.c", "body": "secret key"}}), CAT)
    assert [str(v) for v in decision.violations] == [
        "step 1: deny:no-key: param 'body': Keys must never be sent by mail (value 'secret key')",
        "step 1: deny:no-secret: param 'body': matches the denied pattern 'secret' (value 'secret key')",
    ]


def test_resource_conflicts_need_an_order_in_dataflow_plans() -> None:
    p = policy()
    writes = (
        {"id": 1, "tool": "put", "params": {"key": "a", "value": "1"}},
        {"id": 2, "tool": "put", "params": {"key": "a", "value": "2"}},
        {"id": 3, "tool": "put", "params": {"key": "b", "value": "3"}},
        {"id": 4, "tool": "put", "params": {"key": "${9.k}", "value": "4"}},
        {"id": 9, "tool": "ping"},
    )
    clash = p.evaluate(plan(*writes, order="dataflow"), CAT)
    assert hits(clash) == [(2, "resource-conflict"), (4, "resource-conflict")]  # one per step, however many clashes
    assert "steps 1 (and 2 more) and 4 both write" in [v.message for v in clash.violations][-1]
    assert hits(p.evaluate(plan(*writes), CAT)) == []  # listed order runs every write after the steps before it
    for second in ({"value": "after ${1}"}, {"after": [1]}):  # a reference, or an explicit order
        step = {"id": 2, "tool": "put", "params": {"key": "a", "value": "2"}}
        step = {**step, "params": {**step["params"], **second}} if "value" in second else {**step, **second}
        ordered = p.evaluate(
            plan({"id": 1, "tool": "put", "params": {"key": "a", "value": "1"}}, step, order="dataflow"), CAT
        )
        assert hits(ordered) == [], second
    assert (
        hits(
            policy("resources: {exclusive_writes: false}").evaluate(
                plan(
                    {"id": 1, "tool": "put", "params": {"key": "a", "value": "1"}},
                    {"id": 2, "tool": "put", "params": {"key": "a", "value": "2"}},
                    order="dataflow",
                ),
                CAT,
            )
        )
        == []
    )


SEQUENCE = """
sequences:
  - name: pii-out
    after: {tags: [pii]}
    forbid: {external: true}
    scope: %s
"""


def test_sequence_rules_by_order_or_by_data_flow() -> None:
    steps = (
        {"id": 1, "tool": "read_person", "params": {"person_id": "p"}},
        {"id": 2, "tool": "mail", "params": {"to": "boss", "body": "hello"}},
        {"id": 3, "tool": "mail", "params": {"to": "${1.email}", "body": "hi"}},
        {"id": 4, "tool": "mail", "params": {"to": "x", "body": "y"}},
    )
    by_order = policy(SEQUENCE % "order").evaluate(plan(*steps), CAT)
    assert hits(by_order) == [(2, "sequence:pii-out"), (3, "sequence:pii-out"), (4, "sequence:pii-out")]
    by_flow = policy(SEQUENCE % "dataflow").evaluate(plan(*steps), CAT)
    assert hits(by_flow) == [(3, "sequence:pii-out")]
    assert by_flow.violations[0].message == "step 3 (mail) uses the output of step(s) 1"


def test_sequence_rules_can_require_a_named_approval() -> None:
    p = policy(SEQUENCE % "dataflow" + "    unless_approved_by: privacy\n")
    decision = p.evaluate(
        plan(
            {"id": 1, "tool": "read_person", "params": {"person_id": "p"}},
            {"id": 2, "tool": "mail", "params": {"to": "${1.email}", "body": "hi"}},
        ),
        CAT,
    )
    assert hits(decision) == []
    assert decision.required_approvals == ("privacy",) and decision.approval == "human"
    assert any("needs approval by 'privacy'" in r for r in decision.reasons)


@pytest.mark.parametrize(
    ("rules", "category", "steps", "approval"),
    [
        ("approval: {auto: [lookups]}", "lookups", [{"id": 1, "tool": "ping"}], "auto"),
        ("approval: {auto: ['look*']}", "lookups", [{"id": 1, "tool": "ping"}], "auto"),
        ("approval: {auto: [lookups]}", "refunds", [{"id": 1, "tool": "ping"}], "human"),
        ("approval: {auto: ['*'], human: [refunds]}", "refunds", [{"id": 1, "tool": "ping"}], "human"),
        ("approval: {default: auto}", "anything", [{"id": 1, "tool": "ping"}], "auto"),
        ("approval: {default: auto}", "x", [{"id": 1, "tool": "mail", "params": {"to": "a", "body": "b"}}], "human"),
        (
            "approval: {default: auto, escalate: []}",
            "x",
            [{"id": 1, "tool": "mail", "params": {"to": "a", "body": "b"}}],
            "human",  # no escalation, but a cleared category is read-only unless its envelope names the tool
        ),
        (
            "approval: {default: auto, escalate: []}\ncategories: {x: {tools: [mail]}}",
            "x",
            [{"id": 1, "tool": "mail", "params": {"to": "a", "body": "b"}}],
            "auto",
        ),
        (
            "approval: {default: auto, escalate: []}\ncategories: {x: {tools: ['*']}}",
            "x",
            [{"id": 1, "tool": "mail", "params": {"to": "a", "body": "b"}}],
            "human",
        ),
    ],
)
def test_approval_decision(rules: str, category: str, steps: list[dict[str, Any]], approval: str) -> None:
    decision = policy(rules).evaluate(plan(*steps, category=category), CAT)
    assert decision.approval == approval
    assert decision.reasons, "every decision says why"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: 1\nname: x\nlimits: {max_step: 3}\n", "limits.max_step: not a known field"),
        ("version: 2\nname: x\n", "version: Input should be 1"),
        ("name: x\n", "version: required, but missing"),
        ("version: 1\nname: x\nroles: {a: {}}\nusers: {bob: b}\n", "user 'bob' has role 'b'"),
        ("version: 1\nname: x\ndefault_role: z\n", "default_role 'z'"),
        ("version: 1\nname: x\ndeny: [{name: a, pattern: '('}]\n", "not a valid regular expression"),
        ("version: 1\nname: x\ndeny: [{name: a, pattern: x}, {name: a, pattern: y}]\n", "repeated: a"),
        ("version: 1\nname: x\napproval: {escalate: [explode]}\n", "approval.escalate[0]"),
        ("[1, 2]", "a policy is a mapping"),
        ("version: 1\n  name: : x", "line 2 column 7: not-yaml: mapping values are not allowed here"),
    ],
)
def test_bad_policies_fail_clearly(text: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Policy.from_yaml(text)


def test_policy_files(tmp_path: Any) -> None:
    loaded = Policy.load(EXAMPLES / "policy.yaml")
    assert loaded.name == "example-business" and loaded.revision == "2026-11-29"
    assert len(loaded.hash) == 64
    with pytest.raises(PolicyError, match="cannot read policy"):
        Policy.load(tmp_path / "missing.yaml")
    changed = loaded.model_copy(update={"revision": "next"})
    assert changed.hash != loaded.hash


def test_policy_rule_names_are_documented() -> None:
    doc = (EXAMPLES.parent / "docs" / "policy.md").read_text()
    for name in POLICY_RULES:
        assert f"`{name}`" in doc, name


READ_ONLY = """
require:
  - name: reads-only
    tools: [sql]
    params: [query]
    sql: read-only
    tables: "CREATE TABLE invoices (id TEXT PRIMARY KEY, total REAL);"
"""


def test_a_require_rule_checks_literal_values_now_and_referenced_ones_at_the_call() -> None:
    rules = policy(READ_ONLY)
    checked = rules.evaluate(
        plan(
            {"id": 1, "tool": "sql", "params": {"query": "SELECT total FROM invoices"}},
            {"id": 2, "tool": "sql", "params": {"query": "DELETE FROM invoices"}},
            {"id": 3, "tool": "sql", "params": {"query": "${1.0.total}"}},
        ),
        CAT,
    )
    assert [hit for hit in hits(checked) if hit[1] != "resource-conflict"] == [(2, "require:reads-only")]
    assert checked.violations[0].message == (
        "param 'query': must be one read-only SQL statement; it is not a read-only statement: "
        "SQLite reports DELETE on invoices (value 'DELETE FROM invoices')"
    )
    step = plan({"id": 3, "tool": "sql", "params": {"query": "${1}"}}).steps[0]
    resolved = rules.call_violations(step, CAT["sql"], {"query": "SELECT 1; DROP TABLE invoices"})
    assert [(v.rule, v.message) for v in resolved] == [
        (
            "require:reads-only",
            "param 'query': must be one read-only SQL statement; it is more than one statement "
            "(value 'SELECT 1; DROP TABLE invoices')",
        )
    ]
    looks_like_a_reference = rules.call_violations(step, CAT["sql"], {"query": "DELETE FROM invoices -- ${1}"})
    assert [v.rule for v in looks_like_a_reference] == ["require:reads-only"], "resolved text is always checked"
    assert rules.call_violations(step, CAT["sql"], {"query": 42}) != []


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ("CREATE TABLE t (x", "require.0.tables: Value error, cannot create the tables: incomplete input"),
        ("ATTACH 'elsewhere.db' AS e;", "cannot create the tables: SQLite reports ATTACH elsewhere.db"),
        ("CREATE TABLE t (x); VACUUM INTO 'copy.db';", "cannot create the tables: SQLite reports ATTACH copy.db"),
        ("CREATE TABLE t (x); INSERT INTO t VALUES (1);", "tables may only hold CREATE TABLE, INDEX and VIEW"),
        ("PRAGMA writable_schema = 1;", "cannot create the tables: SQLite reports PRAGMA writable_schema 1"),
    ],
)
def test_a_require_rules_tables_are_checked_at_load(tables: str, message: str, tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.chdir(tmp_path)
    data = {"version": 1, "name": "p", "require": [{"name": "r", "sql": "read-only", "tables": tables}]}
    with pytest.raises(PolicyError) as error:
        Policy.from_data(data)
    assert message.split(": ", 1)[-1] in str(error.value) and "require[0].tables" in str(error.value)
    assert list(tmp_path.iterdir()) == [], "loading a policy writes no file"


def test_a_deny_pattern_is_not_dodged_by_a_line_break() -> None:
    rules = policy('deny:\n  - {name: no-drop, pattern: "(?i)drop.*table"}\n')
    decision = rules.evaluate(plan({"id": 1, "tool": "sql", "params": {"query": "DROP\n  TABLE x"}}), CAT)
    assert hits(decision) == [(1, "deny:no-drop")]


def test_an_order_sequence_rule_holds_in_a_dataflow_plan_where_a_step_listed_first_may_run_last() -> None:
    """In a dataflow plan, listed order is not execution order: a forbidden step listed before the other
    one, with nothing ordering them, may run after it."""
    rule = policy(SEQUENCE % "order")
    mail_first = (
        {"id": 1, "tool": "mail", "params": {"to": "boss", "body": "hello"}},
        {"id": 2, "tool": "read_person", "params": {"person_id": "p"}},
    )
    assert hits(rule.evaluate(plan(*mail_first), CAT)) == [], "listed order: the mail goes first"
    loose = rule.evaluate(plan(*mail_first, order="dataflow"), CAT)
    assert hits(loose) == [(1, "sequence:pii-out")]
    assert loose.violations[0].message == "step 1 (mail) may run after step(s) 2 (the plan's order is dataflow)"
    ordered = ({**mail_first[0]}, {**mail_first[1], "after": [1]})
    assert hits(rule.evaluate(plan(*ordered, order="dataflow"), CAT)) == [], "after: the mail really goes first"


def test_in_a_dataflow_plan_writes_of_tools_that_declare_no_resource_may_clash_with_any() -> None:
    @tool(effect="write")
    def note_down(text: str) -> str:
        """A write that does not say what it touches."""
        return text

    catalogue = Catalogue([read_person, mail, put, sql, ping, note_down])
    both = (
        {"id": 1, "tool": "note_down", "params": {"text": "a"}},
        {"id": 2, "tool": "put", "params": {"key": "b", "value": "2"}},
    )
    clash = policy().evaluate(plan(*both, order="dataflow"), catalogue)
    assert hits(clash) == [(2, "resource-conflict")]
    assert "steps 1 and 2 both write 'row:b'" in clash.violations[0].message
    first = policy().evaluate(plan(*reversed(both), order="dataflow"), catalogue)
    assert "both write a resource (its tool declares none, so it may be any)" in first.violations[0].message
    assert hits(policy().evaluate(plan(*both), catalogue)) == [], "listed order never overlaps writes"
