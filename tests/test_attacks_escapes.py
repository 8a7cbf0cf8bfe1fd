"""Where a value's ``${`` means a reference, where it is literal text, and what each consumer makes of it.

A plan's own text reads ``${N}`` as a reference and ``$${`` as a literal ``${``; the values a
ReAct model writes, and those a step was called with, are literal through and through. Each
consumer (the policy at check time and at the call, a rollback's undo, a correction's and an
edit's comparison with what ran) must agree with what the tool is really given: a JSON value
compared as JSON (1, 1.0 and true are three), and a resource a reference fills taken as any.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from plangate import Catalogue, Plan, Policy, check, tool
from plangate.errors import StateError
from plangate.models.test import ScriptedModel
from plangate.plandiff import compare
from plangate.react import ReActAgent
from plangate.references import resolve
from plangate.runtime import Runtime
from plangate.store import open_store
from tests.helpers import FixedClock, plan

CALLS: list[str] = []


@tool
def sql(query: str) -> str:
    """Run one SQL statement."""
    CALLS.append(f"sql:{query}")
    return "ok"


@tool(resource="invoice:{invoice_id}")
def get_invoice(invoice_id: str) -> str:
    """An invoice."""
    CALLS.append(f"get_invoice:{invoice_id}")
    return "invoice"


@tool
def lookup(name: str) -> dict[str, Any]:
    """An account by its holder's name."""
    return {"account": f"acct-{name}"}


@tool(effect="write", compensate="release")
def hold(account: str) -> str:
    """Put a hold on an account."""
    CALLS.append(f"hold:{account}")
    return "held"


@tool(effect="write")
def release(account: str) -> str:
    """Release a hold."""
    CALLS.append(f"release:{account}")
    return "released"


@tool(effect="write")
def put(key: str, value: Any) -> str:
    """Store a value under a key."""
    CALLS.append(f"put:{key}:{value!r}")
    return "stored"


@tool(effect="write")
def shell(cmd: str) -> str:
    """Run a command."""
    CALLS.append(f"shell:{cmd}")
    if cmd == "fail":
        raise RuntimeError("it failed")
    return ""


@tool
def pay(iban: str, amount: float) -> str:
    """Pay."""
    return "paid"


TABLES = "CREATE TABLE invoices (id TEXT PRIMARY KEY, total REAL);"
RULES = Policy.from_data(
    {
        "version": 1,
        "name": "rules",
        "approval": {"auto": ["react"], "human": ["ops"]},
        "require": [
            {"name": "reads-only", "tools": ["sql"], "params": ["query"], "sql": "read-only", "tables": TABLES}
        ],
        "deny": [
            {
                "name": "no-nines",
                "tools": ["get_invoice"],
                "resources": ["invoice:9*"],
                "params": ["invoice_id"],
                "pattern": "9",
            },
            {"name": "no-home", "tools": ["shell"], "params": ["cmd"], "pattern": r"rm -rf \$\{HOME\}"},
            {"name": "no-pid", "tools": ["shell"], "params": ["cmd"], "pattern": r"\$\$"},
        ],
    }
)
CAT = Catalogue([sql, get_invoice, lookup, hold, release, put, shell, pay])
MODULE = "tests.test_attacks_escapes"


@pytest.fixture(autouse=True)
def _clear() -> None:
    CALLS.clear()


def _react(tmp_path: Path, action: str) -> Any:
    store = open_store(f"sqlite:///{tmp_path}/react.db")
    agent = ReActAgent(ScriptedModel([action, "Final Answer: done"]), CAT, store, policy=RULES, clock=FixedClock())
    return agent.run("q")


def _rules(result: Any) -> list[str]:
    return [v.rule for v in result.violations]


# -- a ReAct model's arguments are literal: the policy holds them as the tool is given them --------------


def test_a_react_statement_with_a_dollar_brace_is_held_to_the_require_rule(tmp_path: Path) -> None:
    result = _react(tmp_path, 'Action: sql {"query": "DELETE FROM invoices -- ${1}"}')
    assert "require:reads-only" in result.steps[0].observation
    assert CALLS == []  # the statement deletes: it never reaches the tool


def test_a_react_value_with_a_dollar_brace_is_held_to_a_resource_scoped_deny_rule(tmp_path: Path) -> None:
    result = _react(tmp_path, 'Action: get_invoice {"invoice_id": "97${x}"}')
    assert "deny:no-nines" in result.steps[0].observation
    assert CALLS == []


def test_a_react_value_with_an_escape_is_held_as_written(tmp_path: Path) -> None:
    result = _react(tmp_path, 'Action: shell {"cmd": "rm -rf $${HOME}"}')
    assert "deny:no-pid" in result.steps[0].observation  # the tool would be given the $$ as written
    assert CALLS == []


# -- a deny rule at check time reads an escape as the tool will be given it ------------------------------


@pytest.mark.parametrize(
    ("cmd", "denied"),
    [
        ("rm -rf $${HOME}", ["deny:no-home"]),
        ("echo ${1}; rm -rf $${HOME}", ["deny:no-home"]),
        ("echo $${x}", []),
        ("echo $$", ["deny:no-pid"]),
    ],
)
def test_a_deny_rule_at_check_time_holds_for_the_text_the_tool_is_given(cmd: str, denied: list[str]) -> None:
    body = Plan.parse(
        plan(
            {"id": 1, "tool": "shell", "params": {"cmd": "true"}},
            {"id": 2, "tool": "shell", "params": {"cmd": cmd}},
        )
    )
    assert _rules(check(body, CAT, RULES)) == denied, cmd
    step = body.steps[1]
    called = resolve(step.params, {1: "out"})
    assert [v.rule for v in RULES.call_violations(step, shell, called)] == denied, called  # the engine agrees


# -- a rollback undoes what the step was called with --------------------------------------------------


def test_a_rollback_undoes_with_the_values_the_step_was_called_with(tmp_path: Path) -> None:
    rt = Runtime(CAT, RULES, db=f"sqlite:///{tmp_path}/undo.db", clock=FixedClock(), tools=MODULE)
    body = plan(
        {"id": 1, "tool": "lookup", "params": {"name": "bob"}},
        {"id": 2, "tool": "hold", "params": {"account": "${1.account}"}},
        {"id": 3, "tool": "hold", "params": {"account": "a$${b}"}},
        {"id": 4, "tool": "shell", "params": {"cmd": "fail"}},
    )
    record = rt.submit(body, "ann")
    rt.approve(record.id, "ben", record.hash)
    assert not rt.execute(record.id).ok
    assert CALLS[:2] == ["hold:acct-bob", "hold:a${b}"]
    assert rt.compensate(record.id, actor="ben", reason="undo it").status == "compensated"
    assert CALLS[3:] == ["release:a${b}", "release:acct-bob"]  # what was held, not the plan's text
    assert rt.replay(record.id).ok


# -- an extract step's schema with an escape in it still types its output ------------------------------


def test_an_extract_schema_with_an_escape_in_its_text_still_types_the_output() -> None:
    catalogue = Catalogue([lookup, pay]).with_extractor(ScriptedModel([]))
    number = {
        "type": "object",
        "properties": {"iban": {"type": "integer", "description": "not a $${template}"}},
        "required": ["iban"],
    }
    steps = (
        {"id": 1, "tool": "lookup", "params": {"name": "bob"}},
        {"id": 2, "tool": "extract", "params": {"text": "${1.account}", "schema": number}},
        {"id": 3, "tool": "pay", "params": {"iban": "${2.iban}", "amount": 1.0}},
    )
    assert _rules(check(plan(*steps), catalogue)) == ["ref-type"]
    keyed = {"type": "object", "properties": {"${iban}": {"type": "string"}}, "required": ["$${iban}"]}
    steps = (steps[0], {**steps[1], "params": {"text": "${1.account}", "schema": keyed}}, steps[2])
    assert _rules(check(plan(*steps), catalogue)) == ["ref-path"]  # a key is never a reference: no field iban


# -- what ran is compared as JSON: 1, 1.0 and true are three values -------------------------------------


def test_a_correction_may_not_change_the_type_of_a_value_a_step_ran_with(tmp_path: Path) -> None:
    rt = Runtime(CAT, RULES, db=f"sqlite:///{tmp_path}/fix.db", clock=FixedClock(), tools=MODULE)
    body = plan(
        {"id": 1, "tool": "put", "params": {"key": "flag", "value": 1}},
        {"id": 2, "tool": "shell", "params": {"cmd": "fail"}},
    )
    record = rt.submit(body, "ann")
    rt.approve(record.id, "ben", record.hash)
    assert not rt.execute(record.id).ok and CALLS[0] == "put:flag:1"
    for ran_as in (True, 1.0):
        corrected = plan(
            {"id": 1, "tool": "put", "params": {"key": "flag", "value": ran_as}},
            {"id": 2, "tool": "shell", "params": {"cmd": "true"}},
        )
        with pytest.raises(StateError, match="already ran"):
            rt.edit(record.id, corrected, "ann")


def test_an_edit_that_changes_only_a_values_type_is_a_change() -> None:
    def one(value: Any) -> Plan:
        return Plan.parse(plan({"id": 1, "tool": "put", "params": {"key": "k", "value": value}}))

    for old, new in ((1, True), (0, False), (1, 1.0), ([1], [True])):
        diff = compare(one(old), one(new), plan_id="p", from_version=1, to_version=2)
        assert diff.changed, (old, new)
        [step] = diff.steps
        assert [c.field for c in step.fields] == ["params.value"], (old, new)


@tool
def count(name: str) -> int:
    """How many there are."""
    return 1


def test_a_stored_output_changed_only_in_its_type_differs_from_the_audit_log(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "rows.db"
    rt = Runtime(Catalogue([count, put]), None, db=f"sqlite:///{db}", clock=FixedClock(), tools=MODULE)
    body = plan(
        {"id": 1, "tool": "count", "params": {"name": "x"}},
        {"id": 2, "tool": "put", "params": {"key": "n", "value": "${1}"}},
    )
    record = rt.submit(body, "ann")
    rt.approve(record.id, "ben", record.hash)
    assert rt.execute(record.id).ok and rt.replay(record.id).ok
    with sqlite3.connect(db) as conn:
        assert conn.execute("UPDATE steps SET output = 'true' WHERE step_id = 1").rowcount == 1
    result = rt.replay(record.id)
    assert not result.ok and "step 1: steps.output differs" in str(result.divergences[0]), result


# -- a resource known only at run time may be any: a sequence rule scoped to resources holds for it -------


@tool(tags=["pii"])
def read_pii(who: str) -> str:
    """Personal data."""
    return "ssn"


@tool(effect="write", resource="outbox:{to}")
def send(to: str, text: str) -> str:
    """Send a message."""
    return "sent"


def test_a_sequence_rule_scoped_to_resources_holds_for_a_resource_known_only_at_run_time() -> None:
    catalogue = Catalogue([read_pii, lookup, send])
    rules = Policy.from_data(
        {
            "version": 1,
            "name": "p",
            "sequences": [{"name": "no-pii-out", "after": {"tags": ["pii"]}, "forbid": {"resources": ["outbox:ext*"]}}],
        }
    )
    for to, forbidden in (
        ("external", True),
        ("${2.account}", True),  # step 2's output may be "external"
        ("e$${${2.account}", True),  # the part a reference fills is unknown as a whole
        ("internal", False),
        ("ext$${x}", True),  # no reference: "outbox:ext${x}"
        ("$${ext}", False),  # no reference: "outbox:${ext}"
    ):
        body = plan(
            {"id": 1, "tool": "read_pii", "params": {"who": "ann"}},
            {"id": 2, "tool": "lookup", "params": {"name": "bob"}},
            {"id": 3, "tool": "send", "params": {"to": to, "text": "hi"}},
        )
        assert _rules(check(body, catalogue, rules)) == (["sequence:no-pii-out"] if forbidden else []), to


def test_a_template_may_match_a_pattern_when_some_text_in_place_of_its_stars_would() -> None:
    from plangate._patterns import may_match_any

    assert may_match_any(("outbox:ext*",), "outbox:e*")
    assert may_match_any(("outbox:ext*",), "outbox:*l")
    assert may_match_any(("row:[ab]?z",), "row:*z")
    assert not may_match_any(("outbox:ext*",), "outbox:x*")
    assert not may_match_any(("row:[ab]?z",), "row:c*")
    assert not may_match_any(("a*b",), "*a")  # whatever fills it, the text ends in "a"
    assert may_match_any(("a*b",), "*a*")
