"""Bad input refused at the edge: each test is an attack or a bad input, and the refusal it gets.

Every refusal names its rule and where (a JSON path or a line); nothing is read that is
not a regular file, nothing blocks, and nothing is recorded.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
from collections.abc import Iterator
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from plangate import Catalogue, Plan, PlanError, Policy, PolicyError, RefusedInputError, check, tool
from plangate._input import check_text, check_value, load_yaml, loads_strict, read_bytes
from plangate._patterns import Meter, glob, star_match
from plangate._regex import Regex
from plangate.cli import main
from plangate.compare import load_tasks
from plangate.costs import PriceTable
from plangate.errors import UsageError
from plangate.runtime import Runtime
from tests.conftest import EXAMPLES, load_plan
from tests.helpers import FixedClock

TOOLS = str(EXAMPLES / "business.py")
POLICY = str(EXAMPLES / "policy.yaml")
REFUND = str(EXAMPLES / "plans" / "refund.json")


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


# -- files that are not regular files ---------------------------------------------------------


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    """A named pipe nobody writes to; a reader that opened it would wait forever.

    Should a reader open it anyway, a writer opens and closes it at once, so a regression
    fails on the assertion instead of hanging the suite.
    """
    path = tmp_path / "pipe"
    os.mkfifo(path)
    opened: list[bool] = []
    done = threading.Event()

    def unblock() -> None:
        while not done.wait(0.05):
            try:
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
                opened.append(True)
            except OSError:  # ENXIO: no reader, as it should be
                continue

    thread = threading.Thread(target=unblock, daemon=True)
    thread.start()
    yield path
    done.set()
    thread.join()
    assert not opened, "something opened the FIFO for reading"


@pytest.fixture
def unix_socket(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    yield path
    server.close()


def special(kind: str, tmp_path: Path, fifo: Path, unix_socket: Path) -> Path:
    return {"fifo": fifo, "directory": tmp_path, "device": Path("/dev/zero"), "socket": unix_socket}[kind]


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("fifo", "it is a named pipe (FIFO)"),
        ("directory", "it is a directory"),
        ("device", "it is a character device"),
        ("socket", "it is a socket"),
    ],
)
def test_only_regular_files_are_read_and_nothing_blocks(
    kind: str, words: str, tmp_path: Path, fifo: Path, unix_socket: Path
) -> None:
    path = special(kind, tmp_path, fifo, unix_socket)
    expected = f"cannot read plan '{path}': not-a-regular-file: {words}; only regular files are read"
    with pytest.raises(PlanError) as plan_error:
        Plan.load(path)
    assert str(plan_error.value) == expected
    with pytest.raises(PolicyError, match=r"^cannot read policy .*: not-a-regular-file: "):
        Policy.load(path)
    with pytest.raises(UsageError, match=r"^cannot read tasks .*: not-a-regular-file: "):
        load_tasks(path)
    with pytest.raises(UsageError, match=r"^cannot read price table .*: not-a-regular-file: "):
        PriceTable.load(path)


def test_files_are_read_up_to_their_limit_and_as_utf8(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    with big.open("wb") as out:
        out.truncate(1_048_577)  # a sparse file: the size is refused before anything is read
    with pytest.raises(PlanError, match=r"big.json': too-large: it is over the limit of 1048576 bytes$"):
        Plan.load(big)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(PolicyError, match=r"latin.yaml': not-utf8: not UTF-8 text: invalid .* at byte 9$"):
        Policy.load(latin)
    with pytest.raises(RefusedInputError, match="too-large") as error:
        read_bytes("/proc/self/status", what="status", limit=10)  # a size the kernel says is 0
    assert error.value.rule == "too-large"


@pytest.mark.parametrize("kind", ["fifo", "device", "socket"])
def test_the_command_line_exits_2_on_a_policy_that_is_not_a_file(
    kind: str, tmp_path: Path, fifo: Path, unix_socket: Path
) -> None:
    path = special(kind, tmp_path, fifo, unix_socket)
    code, out, err = run("check", REFUND, "--tools", TOOLS, "--policy", str(path))
    assert (code, out) == (2, "")
    assert err.startswith(f"plangate: cannot read policy '{path}': not-a-regular-file: it is ")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_nothing_is_submitted_with_a_policy_that_is_not_a_file(
    fifo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PLANGATE_DB", f"sqlite:///{tmp_path}/plangate.db")
    code, _, err = run("submit", REFUND, "--tools", TOOLS, "--policy", str(fifo), "--as", "alice")
    assert code == 2 and "not-a-regular-file" in err
    code, out, _ = run("list", "--json")
    assert code == 0 and json.loads(out) == []


# -- strict JSON ------------------------------------------------------------------------------


def plan_text(note: str = '"ok"', params: str | None = None) -> str:
    params = params or f'{{"invoice_id": "42", "note": {note}}}'
    return (
        '{"task": "Refund", "category": "refunds", "steps": ['
        '{"id": 1, "tool": "get_invoice", "params": {"invoice_id": "42"}, "rationale": "look"},'
        '{"id": 2, "tool": "get_invoice", "params": {"invoice_id": "43"}, "rationale": "look"},'
        f'{{"id": 7, "tool": "issue_refund", "params": {params}, "rationale": "pay"}}]}}'
    )


@pytest.mark.parametrize(
    ("note", "problem"),
    [
        ("NaN", "steps[2].params.note: non-finite-number: NaN is not a JSON number"),
        ("Infinity", "steps[2].params.note: non-finite-number: Infinity is not a JSON number"),
        ("-Infinity", "steps[2].params.note: non-finite-number: -Infinity is not a JSON number"),
        ("1e999", "steps[2].params.note: non-finite-number: an infinite number is not a JSON number"),
        ("1" * 1001, "steps[2].params.note: number-too-large: an integer of more than 1000 digits"),
        (
            '"pay \u202eti"',
            "steps[2].params.note: bidi-control: U+202E RIGHT-TO-LEFT OVERRIDE at character 4 of the text: "
            "it can make text display differently from what it says; remove it",
        ),
        ('"a\\u2067b"', "steps[2].params.note: bidi-control: U+2067 RIGHT-TO-LEFT ISOLATE at character 1"),
        ('"a\\u200fb"', "steps[2].params.note: bidi-control: U+200F RIGHT-TO-LEFT MARK at character 1"),
        ('"a\\u061cb"', "steps[2].params.note: bidi-control: U+061C ARABIC LETTER MARK at character 1"),
        (
            '"a\\u0007b"',
            "steps[2].params.note: control-character: U+0007 at character 1 of the text is a control character; "
            "only tab, line feed and carriage return are allowed",
        ),
        ('"a\\u007fb"', "steps[2].params.note: control-character: U+007F at character 1"),
        ('"a\\u009bb"', "steps[2].params.note: control-character: U+009B at character 1"),
        ('{"x": {"y": "\\u0000"}}', "steps[2].params.note.x.y: control-character: U+0000"),
    ],
)
def test_a_plan_text_with_a_value_no_reader_agrees_on_is_refused(note: str, problem: str) -> None:
    with pytest.raises(PlanError) as error:
        Plan.parse(plan_text(note))
    assert error.value.summary == "not a valid plan:"
    assert str(error.value.problems[0]).startswith(problem)
    assert error.value.problems[0].step == 7


def test_a_duplicate_key_is_refused_with_its_path() -> None:
    text = plan_text(params='{"invoice_id": "42", "amount": 1, "amount": 980}')
    with pytest.raises(PlanError) as error:
        Plan.parse(text)
    assert str(error.value.problems[0]) == (
        "steps[2].params.amount: duplicate-key: the key is given more than once in its object; "
        "readers disagree on which value counts"
    )
    assert error.value.problems[0].step == 7
    with pytest.raises(PlanError, match=r"^not a valid plan:\n  task: duplicate-key"):
        Plan.parse('{"task": "a", "task": "b", "category": "c", "steps": []}')


def test_hostile_nesting_is_refused_clearly_without_recursing() -> None:
    with pytest.raises(PlanError) as error:
        Plan.parse("[" * 100_000 + "]" * 100_000)
    assert str(error.value) == "not a valid plan:\n  " + "[0]" * 32 + ": too-deep: nested deeper than 32 levels"
    deep = plan_text(params='{"invoice_id": "42", "x": ' + "[" * 5000 + "]" * 5000 + "}")
    with pytest.raises(PlanError, match=r"steps\[2\]\.params\.x(\[0\]){28}: too-deep"):
        Plan.parse(deep)


def test_a_plan_given_as_a_dict_is_held_to_the_same_rules(refund_plan: dict[str, Any]) -> None:
    cases: list[tuple[Any, str]] = [
        (float("nan"), "non-finite-number: NaN is not a JSON number"),
        (float("inf"), "non-finite-number: an infinite number is not a JSON number"),
        (10**1001, "number-too-large"),
        ("\u202epay", "bidi-control: U+202E"),
        ("line\x1bbreak", "control-character: U+001B"),
    ]
    for value, message in cases:
        refund_plan["steps"][1]["params"]["amount"] = value
        with pytest.raises(PlanError) as error:
            Plan.parse(refund_plan)
        assert str(error.value.problems[0]).startswith(f"steps[1].params.amount: {message}")
    refund_plan["steps"][1]["params"]["amount"] = 980
    refund_plan["steps"][0]["rationale"] = "Fetch\u2066 the invoice"
    with pytest.raises(PlanError, match=r"steps\[0\]\.rationale: bidi-control: U\+2066 LEFT-TO-RIGHT ISOLATE"):
        Plan.parse(refund_plan)
    refund_plan["steps"][0]["rationale"] = "Fetch"
    refund_plan["steps"][0]["params"] = {"invoice\u200e_id": "42"}
    with pytest.raises(PlanError, match=r'steps\[0\]\.params\["invoice\\u200e_id"\]: bidi-control: .* of the key'):
        Plan.parse(refund_plan)
    deep: Any = "x"
    for _ in range(100_000):
        deep = [deep]
    refund_plan["steps"][0]["params"] = {"invoice_id": "42", "deep": deep}
    with pytest.raises(PlanError, match="too-deep: nested deeper than 32 levels"):
        Plan.parse(refund_plan)


def test_the_checker_reports_a_refusal_as_a_plan_schema_violation(catalogue: Catalogue) -> None:
    result = check(plan_text('"\u202e"'), catalogue)
    assert not result.ok and result.plan is None
    assert [(v.rule, v.step) for v in result.violations] == [("plan-schema", 7)]
    assert result.violations[0].message.startswith("steps[2].params.note: bidi-control: ")


def test_the_strict_loader_and_the_value_check_are_there_for_other_layers() -> None:
    body = loads_strict(b'{"plan": {"ok": [1, 2.5, "text\\ttab"]}}', what="request body")
    assert body == {"plan": {"ok": [1, 2.5, "text\ttab"]}}
    with pytest.raises(RefusedInputError) as error:
        loads_strict('{"a": 1, "a": 2}', what="request body")
    assert (error.value.rule, error.value.location) == ("duplicate-key", "a")
    assert str(error.value).startswith("request body: a: duplicate-key: the key is given more than once")
    with pytest.raises(RefusedInputError) as error:
        check_value({"steps": [{"note": "\u202e"}]}, "plan", what="request body")
    assert (error.value.rule, error.value.location) == ("bidi-control", "plan.steps[0].note")
    with pytest.raises(RefusedInputError, match=r"^approval: comment: not-text: expected text, got dict$"):
        check_text({"a": 1}, "comment", what="approval")
    with pytest.raises(RefusedInputError, match=r"^body: not-json: line 1 column 2"):
        loads_strict("{", what="body")


def test_a_comment_of_the_wrong_kind_is_refused_and_nothing_is_recorded(tmp_path: Path, catalogue: Catalogue) -> None:
    policy = Policy.load(EXAMPLES / "policy.yaml")
    rt = Runtime(catalogue, policy, db=f"sqlite:///{tmp_path}/plangate.db", clock=FixedClock())
    record = rt.submit(load_plan("refund"), "alice")
    before = len(rt.trace(record.id))
    with pytest.raises(RefusedInputError, match=r"^rejection: comment: not-text: expected text, got dict$"):
        rt.reject(record.id, "dave", {"why": "no"}, record.hash)  # type: ignore[arg-type]
    with pytest.raises(RefusedInputError, match=r"^approval: comment: bidi-control: U\+202E"):
        rt.approve(record.id, "dave", record.hash, comment="looks \u202eok")
    assert len(rt.trace(record.id)) == before and rt.get(record.id).status == "pending_approval"


# -- YAML ---------------------------------------------------------------------------------------

LAUGHS = 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(9)
)


def test_a_billion_laughs_is_refused_at_its_first_anchor() -> None:
    with pytest.raises(PolicyError) as error:
        Policy.from_yaml(LAUGHS, source="laughs.yaml")
    assert str(error.value) == (
        "laughs.yaml: line 1: yaml-alias: anchors and aliases (&name, *name) are not allowed; write each value out"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("version: 1\nname: x\nroles:\n  a: {}\n  b: *a\n", "line 5: yaml-alias: anchors and aliases"),
        (
            "version: 1\nname: x\ndeny: []\nname: y\n",
            "line 4: duplicate-key: the key 'name' is given again (first at line 2)",
        ),
        ("version: 1\nname: x\nroles: {a: {}, a: {}}\n", "line 3: duplicate-key: the key 'a' is given again"),
        ("version: 1\nname: x\nrevision: " + "[" * 10_000, "line 3: too-deep: nested deeper than 64 levels"),
        ("version: 1\nname: x\ndescription: .nan\n", "description: non-finite-number: NaN is not a JSON number"),
        ('version: 1\nname: "x\\u202e"\n', "name: bidi-control: U+202E RIGHT-TO-LEFT OVERRIDE"),
    ],
)
def test_yaml_a_person_reads_is_held_to_the_input_rules(text: str, message: str) -> None:
    with pytest.raises(PolicyError) as error:
        Policy.from_yaml(text, source="p.yaml")
    assert str(error.value).startswith(f"p.yaml: {message}")
    with pytest.raises(RefusedInputError) as refused:
        load_yaml(text, what="p.yaml")
    assert str(refused.value).startswith(f"p.yaml: {message}")


def test_tasks_and_price_tables_refuse_aliases_too(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text("tasks:\n  - &q {question: 'what is 2+2?', expect: '4'}\n  - *q\n")
    with pytest.raises(UsageError, match=r"^tasks '.*tasks.yaml': line 2: yaml-alias: "):
        load_tasks(tasks)
    prices = tmp_path / "prices.yaml"
    prices.write_text("gpt-*: {input: 1, output: 2}\ngpt-*: {input: 0, output: 0}\n")
    with pytest.raises(UsageError, match=r"^price table '.*prices.yaml': line 2: duplicate-key: "):
        PriceTable.load(prices)


# -- a policy's patterns, against text the plan's author chooses --------------------------------


@settings(max_examples=400, deadline=None)
@given(st.text("ab*?[]!-", max_size=8), st.text("ab*?[]!-\n", max_size=8))
def test_globs_answer_as_fnmatch_does(pattern: str, text: str) -> None:
    assert glob(pattern).match(text) == fnmatchcase(text, pattern)


def test_a_hostile_glob_reads_each_piece_once() -> None:
    value = "a" * 10_000
    pattern = "*a" * 2_000 + "*b"
    meter = Meter()
    assert not glob(pattern).match(value, meter)
    assert meter.steps <= 2_000  # one search per piece between two '*', never a second try
    stars = "invoice:" + "*a" * 5_000
    meter = Meter()
    assert star_match(stars, "invoice:" + "a" * 10_000, meter) and meter.steps <= 5_000
    meter = Meter()
    assert not star_match(stars + "?", "invoice:" + "a" * 10_000 + "b", meter) and meter.steps <= 5_000


def test_a_check_with_resources_full_of_stars_stays_fast() -> None:
    @tool(effect="write", resource="row:{key}")
    def put(key: str) -> str:
        """Write a row."""
        return key

    steps = [
        {"id": i, "tool": "put", "params": {"key": "a*" * 2_500 + "x" * i}, "rationale": "r"} for i in range(1, 41)
    ]
    policy = Policy.from_yaml(
        "version: 1\nname: p\nsequences:\n  - {name: s, after: {resources: ['row:*b*a*']}, "
        "forbid: {resources: ['row:*a*b*']}}\n"
    )
    result = check({"task": "t", "category": "c", "order": "dataflow", "steps": steps}, Catalogue([put]), policy)
    assert [v.rule for v in result.violations].count("resource-conflict") == 39  # one per step that clashes


@settings(max_examples=300, deadline=None)
@given(
    st.recursive(
        st.sampled_from(["a", "b", ".", "[ab]", "[^a]", r"\d", r"\w", r"\s", r"\b", r"\B", "^", "$", r"\Z", "1", " "]),
        lambda inner: st.one_of(
            st.tuples(inner, inner).map("".join),
            st.tuples(inner, inner).map(lambda p: f"(?:{p[0]}|{p[1]})"),
            st.tuples(inner, st.sampled_from(["*", "+", "?", "{2}", "{1,3}", "{2,}", "*?"])).map(
                lambda p: f"(?:{p[0]}){p[1]}"
            ),
            inner.map(lambda p: f"(?i:{p})"),
        ),
        max_leaves=6,
    ),
    st.lists(st.text("ab1 _\nAB", max_size=7), min_size=1, max_size=5),
)
def test_deny_patterns_answer_as_re_search_does(pattern: str, texts: list[str]) -> None:
    regex, python = Regex(pattern), re.compile(pattern, re.DOTALL)  # '.' matches a line break, on purpose
    for text in texts:
        assert regex.search(text) == (python.search(text) is not None), (pattern, text)


@pytest.mark.parametrize(
    "pattern", [r"(a+)+$", r"a*a*a*a*a*a*x", r"(a|aa)*b", r"(.*)*x", r"(\w+\s?)*!$", r"(?i)(a|A)*y"]
)
def test_a_hostile_deny_pattern_reads_each_character_once(pattern: str) -> None:
    regex = Regex(pattern)
    value = "a" * 10_000 + "!"
    meter = Meter()
    regex.search(value, meter)
    assert meter.steps <= (len(value) + 1) * (regex.size + 1)  # the bound, whatever the pattern and the text
    assert meter.steps <= 3 * len(value)  # and in practice: each character once, states built once


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        (r"(a)\1", r"a back-reference at position 4 is not supported"),
        (r"(?P<x>a)(?P=x)", r"a back-reference \(\?P=...\) at position 10 is not supported"),
        (r"secret(?!s)", r"negative look-ahead \(\?!...\) at position 8 is not supported"),
        (r"(?<=pass)word", r"look-behind .* at position 2 is not supported"),
        (r"(?>a+)b", r"an atomic group \(\?>...\) at position 2 is not supported"),
        (r"a++", r"a possessive quantifier at position 2 is not supported"),
        (r"(?m)^drop", r"the MULTILINE flag \(m\) at position 2 is not supported"),
        ("(a{100}){200}", r"the pattern needs more than 10000 states"),
        ("(", r"not a valid regular expression: missing \)"),
    ],
)
def test_a_pattern_only_backtracking_could_match_is_refused_at_load(pattern: str, message: str) -> None:
    with pytest.raises(PolicyError, match=r"deny\[0\]\.pattern: .*" + message):
        Policy.from_data({"version": 1, "name": "p", "deny": [{"name": "d", "pattern": pattern}]})


@settings(max_examples=300, deadline=None)
@given(st.text("ab*?[", max_size=8), st.text("ab*?[", max_size=8))
def test_a_resource_pattern_has_only_one_wildcard(pattern: str, text: str) -> None:
    only_stars = ".*".join(re.escape(part) for part in pattern.split("*"))
    assert star_match(pattern, text) == (re.fullmatch(only_stars, text, re.DOTALL) is not None)


@pytest.mark.parametrize("kind", ["fifo", "device", "socket"])  # a folder: click's own usage error, exit 2
def test_the_command_line_exits_2_on_a_plan_that_is_not_a_file(
    kind: str, tmp_path: Path, fifo: Path, unix_socket: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A FIFO used to hang `plangate check`, and /dev/zero ran it out of memory."""
    path = special(kind, tmp_path, fifo, unix_socket)
    monkeypatch.setenv("PLANGATE_DB", f"sqlite:///{tmp_path}/plangate.db")
    for command in (("check", str(path), "--tools", TOOLS), ("submit", str(path), "--tools", TOOLS, "--as", "al")):
        code, out, err = run(*command)
        assert (code, out) == (2, "")
        assert err.startswith(f"plangate: cannot read plan '{path}': not-a-regular-file: it is ")
        assert err.count("\n") == 1 and "Traceback" not in err
    assert json.loads(run("list", "--json")[1]) == []


@pytest.mark.parametrize(
    ("text", "rule"),
    [("refu\u200bnds", "invisible-character"), ("a\u2028b", "invisible-character"), ("x\ud800", "lone-surrogate")],
)
def test_text_that_shows_other_than_it_is_refused(text: str, rule: str) -> None:
    with pytest.raises(RefusedInputError, match=rf"^comment: note: {rule}: U\+") as error:
        check_value({"note": text}, what="comment")
    assert error.value.rule == rule


def test_a_price_that_is_not_a_number_is_a_plain_error(tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    for value in ("cheap", "-1", "true", "[1]"):
        prices.write_text(f"m: {{input: {value}, output: 1}}\n")
        with pytest.raises(UsageError, match=r"^price for 'm': .* is not a number of USD per million tokens$"):
            PriceTable.load(prices)
