"""MCP servers as a catalogue, against real servers: the reference time and git servers over stdio,
and a small server of the tests' own (tests/mcpserver.py) over streamable HTTP and stdio."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from mcp.types import ToolAnnotations

from plangate import Runtime, check
from plangate.cli import main
from plangate.errors import CatalogueError, GovernanceError, PolicyError
from plangate.policy import Policy
from plangate.tools import Catalogue
from plangate.tools._mcp import hints
from tests.conftest import EXAMPLES
from tests.helpers import FixedClock, plan

PY = shlex.quote(sys.executable)
TIME = f"mcp:stdio:{PY} -m mcp_server_time --local-timezone UTC"
SERVER = Path(__file__).with_name("mcpserver.py")
POLICY = """
version: 1
name: mcp-example
roles: {dev: {tools: ["*"], scopes: ["*"]}}
default_role: dev
approval: {default: human, auto: [ops]}
categories:
  ops: {description: "Reads at once; anything else waits for a person.", tools: ["*"]}
"""


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def time_tools() -> Iterator[Catalogue]:
    with Catalogue.from_mcp(TIME) as catalogue:
        yield catalogue


@pytest.fixture(scope="module")
def recorder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The tests' server over streamable HTTP on a free loopback port: its URL and its call log."""
    log, port = tmp_path_factory.mktemp("recorder") / "calls.jsonl", free_port()
    with serving(port, log):
        yield f"mcp:http://127.0.0.1:{port}/mcp", log


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def serving(port: int, log: Path) -> Iterator[None]:
    """The tests' server over streamable HTTP on ``port``, once it listens, until the block ends."""
    log.touch()
    process = subprocess.Popen([sys.executable, str(SERVER), "http", str(port), str(log)], stderr=subprocess.DEVNULL)
    try:
        while True:  # until it listens (or died: then the connection below says why)
            with socket.socket() as attempt:
                if attempt.connect_ex(("127.0.0.1", port)) == 0 or process.poll() is not None:
                    break
        yield
    finally:
        process.terminate()
        process.wait(timeout=30)


def calls(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


# -- annotations are hints ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        (None, ("write", False, True)),
        (ToolAnnotations(), ("write", False, True)),
        (ToolAnnotations(readOnlyHint=True), ("read", True, True)),
        (ToolAnnotations(readOnlyHint=True, idempotentHint=False, openWorldHint=False), ("read", False, False)),
        (ToolAnnotations(destructiveHint=True), ("irreversible", False, True)),
        (ToolAnnotations(destructiveHint=False), ("write", False, True)),
        (ToolAnnotations(destructiveHint=False, idempotentHint=True, openWorldHint=False), ("write", True, False)),
        (ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=True), ("irreversible", True, True)),
    ],
)
def test_annotations_map_to_effects_with_the_safe_answer_where_one_is_missing(
    annotations: ToolAnnotations | None, expected: tuple[str, bool, bool]
) -> None:
    assert hints(annotations) == expected


# -- the time server over stdio ------------------------------------------------------------------


def test_time_tools_have_the_servers_schemas_and_are_untrusted(time_tools: Catalogue) -> None:
    get = time_tools["get_current_time"]
    assert (get.effect, get.idempotent, get.external, get.untrusted_output) == ("read", True, False, True)
    assert get.param_names == ("timezone",) and get.output_schema["required"][0] == "timezone"
    assert get.origin is not None and get.origin["server"] == "mcp-time" and get.origin["tool"] == "get_current_time"
    assert get.param_errors({"timezone": "UTC"}) == []
    kinds = {(e["type"], e["loc"]) for e in get.param_errors({"timezone": 3, "zone": "UTC"})}
    assert kinds == {("type", ("timezone",)), ("extra_forbidden", ("zone",))}
    assert [e["type"] for e in get.param_errors({})] == ["missing"]


def test_a_plan_over_mcp_tools_is_checked_approved_and_run_and_its_trace_names_the_server(
    time_tools: Catalogue, tmp_path: Path
) -> None:
    steps = plan(
        {"id": 1, "tool": "get_current_time", "params": {"timezone": "Europe/Paris"}, "expected_output": "object"},
        {
            "id": 2,
            "tool": "convert_time",
            "params": {"source_timezone": "${1.timezone}", "time": "10:00", "target_timezone": "Asia/Tokyo"},
        },
    )
    bad = plan({"id": 1, "tool": "convert_time", "params": {"source_timezone": "UTC", "time": 10}})
    problems = check(bad, time_tools).violations
    assert {v.rule for v in problems} == {"missing-param", "param-type"}
    db = f"sqlite:///{tmp_path}/p.db"
    runtime = Runtime(time_tools, db=db, clock=FixedClock(), tools=TIME)
    record = runtime.submit(steps, requested_by="alice")
    runtime.approve(record.id, "bob", record.hash)
    result = runtime.execute(record.id, actor="bob")
    assert result.status == "succeeded"
    assert result.outputs[2]["target"]["datetime"].startswith(result.outputs[2]["source"]["datetime"][:10])
    started = [e.data for e in runtime.trace(record.id) if e.kind == "step.started"]
    assert started[1]["server"].startswith("mcp-time ") and started[1]["server_tool"] == "convert_time"
    assert started[1]["source"] == TIME
    code, out, _ = run("trace", record.id, "--db", db)
    assert code == 0 and "step 2 convert_time (convert_time on MCP server mcp-time " in out
    code, out, _ = run("audit", "verify", "--db", db, "--plan", record.id[:8])
    assert code == 0, out
    proven = out.splitlines()
    assert proven[1].startswith(f"plan {record.id}: ") and "verified as its own chain" in proven[1]
    assert proven[3].startswith("  v1 step 2: convert_time = convert_time on MCP server mcp-time ")
    assert f"({TIME}), attempt 1, key {record.id}:2, at " in proven[3]


def test_a_connection_that_was_closed_opens_again_on_the_next_call() -> None:
    catalogue = Catalogue.from_mcp(TIME)
    try:
        catalogue.close()
        assert catalogue["get_current_time"](timezone="UTC")["timezone"] == "UTC"
        assert catalogue._holds[0].opened == 2  # type: ignore[attr-defined]
    finally:
        catalogue.close()


# -- the git server over stdio, on a repository of the test's --------------------------------------


def test_git_reads_run_at_once_and_commits_and_resets_need_a_person(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "a.txt").write_text("a\n")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first"], check=True)
    policy = Policy.from_yaml(POLICY)
    spec = f"mcp:stdio:{PY} -m mcp_server_git --repository {shlex.quote(str(repo))}"
    with Catalogue.from_mcp(spec) as tools:
        assert (tools["git_commit"].effect, tools["git_reset"].effect) == ("write", "irreversible")
        runtime = Runtime(tools, policy, db=f"sqlite:///{tmp_path}/p.db", clock=FixedClock())
        reads = plan({"id": 1, "tool": "git_log", "params": {"repo_path": str(repo), "max_count": 1}})
        record = runtime.submit(reads, requested_by="alice")
        assert record.status == "approved"  # the category is cleared for plans that only read
        result = runtime.execute(record.id, actor="alice")
        assert result.status == "succeeded" and "first" in result.outputs[1]
        for tool, params in (("git_commit", {"message": "x"}), ("git_reset", {})):
            writes = plan({"id": 1, "tool": tool, "params": {"repo_path": str(repo), **params}})
            record = runtime.submit(writes, requested_by="alice")
            assert record.status == "pending_approval" and "a person" in record.needs


# -- streamable HTTP: the idempotency key in _meta; a completed plan is not called again -----------


def test_http_server_gets_the_idempotency_key_and_a_finished_plan_calls_nothing_again(
    recorder: tuple[str, Path], tmp_path: Path
) -> None:
    url, log = recorder
    before = len(calls(log))
    with Catalogue.from_spec(url) as tools:
        record_tool = tools["record"]
        assert (record_tool.effect, record_tool.idempotent, record_tool.external) == ("write", False, True)
        runtime = Runtime(tools, db=f"sqlite:///{tmp_path}/p.db", clock=FixedClock(), tools=url)
        record = runtime.submit(plan({"id": 1, "tool": "record", "params": {"note": "n1"}}), requested_by="alice")
        assert record.needs == ("a person",)
        runtime.approve(record.id, "bob", record.hash)
        assert runtime.execute(record.id, actor="bob").outputs == {1: "recorded n1"}
        again = runtime.execute(record.id, actor="bob")
        assert again.status == "succeeded"
        made = calls(log)[before:]
        assert len(made) == 1 and made[0]["note"] == "n1"
        assert made[0]["meta"]["plangate/idempotency_key"] == f"{record.id}:1"
        assert made[0]["meta"]["plangate/plan_id"] == record.id and made[0]["meta"]["plangate/step_id"] == 1
        failing = runtime.submit(plan({"id": 1, "tool": "broken", "params": {"why": "x"}}), requested_by="alice")
        runtime.approve(failing.id, "bob", failing.hash)
        halted = runtime.execute(failing.id, actor="bob")
        assert (
            halted.status == "halted"
            and "McpToolError" in (halted.error or "")
            and "Error executing tool broken" in halted.error
        )


def test_over_http_calls_of_two_plans_in_flight_at_once_each_get_their_own_answer(
    recorder: tuple[str, Path], tmp_path: Path
) -> None:
    url, _ = recorder
    with Catalogue.from_spec(url) as tools:  # one session, two plans' runtimes, as in a worker
        runtime = Runtime(tools, db=f"sqlite:///{tmp_path}/p.db", tools=url)
        records = [
            runtime.submit(plan({"id": 1, "tool": "pair", "params": {"note": n}}), requested_by="a") for n in "ab"
        ]
        for record in records:
            runtime.approve(record.id, "bob", record.hash)
        runtimes = [Runtime(tools, db=f"sqlite:///{tmp_path}/p.db", tools=url) for _ in records]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:  # the server answers neither until both are in
            done = list(pool.map(lambda r, p: r.execute(p.id, actor="bob"), runtimes, records))
    assert [d.outputs for d in done] == [{1: f"{n} {p.id}:1"} for n, p in zip("ab", records, strict=True)]


def test_over_http_a_server_that_restarted_is_given_a_new_session_by_the_next_call(tmp_path: Path) -> None:
    log, port = tmp_path / "calls.jsonl", free_port()
    url = f"mcp:http://127.0.0.1:{port}/mcp"
    with serving(port, log):
        tools = Catalogue.from_spec(url)
    with tools, serving(port, log):  # the server restarted: it knows the session no more
        runtime = Runtime(tools, db=f"sqlite:///{tmp_path}/p.db", tools=url)
        ids = []
        for note in "ab":
            record = runtime.submit(plan({"id": 1, "tool": "record", "params": {"note": note}}), requested_by="a")
            runtime.approve(record.id, "bob", record.hash)
            ids.append(record.id)
        refused = runtime.execute(ids[0], actor="bob")  # the server said no: nothing was done
        assert refused.status == "halted" and "Session not found" in (refused.error or ""), refused.error
        assert runtime.execute(ids[1], actor="bob").outputs == {1: "recorded b"}  # in a new session
        assert runtime.resume(ids[0], actor="bob").outputs == {1: "recorded a"}
    assert [c["note"] for c in calls(log)] == ["b", "a"]


@pytest.mark.parametrize(
    ("size", "said"),
    [
        (4_000, "answered with 40"),  # over the limit: read, and refused
        (10_000, "SSE stream failed: Server-sent event exceeded the 6000 byte limit"),  # far over: never read whole
    ],
)
def test_over_http_a_result_over_the_limit_is_refused_and_one_far_over_it_is_never_read_whole(
    recorder: tuple[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int, said: str
) -> None:
    monkeypatch.setattr("plangate.tools._mcpconn._ENVELOPE", 0)  # the bound on the wire: 6 bytes a byte of text
    url, _ = recorder
    with Catalogue.from_mcp(url, max_result_bytes=1_000) as tools:
        runtime = Runtime(tools, db=f"sqlite:///{tmp_path}/p.db", clock=FixedClock(), tools=url)
        record = runtime.submit(plan({"id": 1, "tool": "record", "params": {"note": "n" * size}}), "alice")
        runtime.approve(record.id, "bob", record.hash)
        halted = runtime.execute(record.id, actor="bob")
    assert halted.status == "halted" and said in (halted.error or "") and "outcome unknown" in halted.error


# -- drift: the server's schema changed after the approval ---------------------------------------------


def test_a_schema_that_changed_after_the_approval_is_drift_and_the_run_is_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.write_text("v1")
    spec = f"mcp:stdio:{PY} {shlex.quote(str(SERVER))} stdio {shlex.quote(str(state))}"
    db = f"sqlite:///{tmp_path}/p.db"
    with Catalogue.from_spec(spec) as tools:
        runtime = Runtime(tools, db=db, clock=FixedClock(), tools=spec)
        record = runtime.submit(plan({"id": 1, "tool": "greet", "params": {"name": "Ada"}}), requested_by="alice")
        runtime.approve(record.id, "bob", record.hash)
    state.write_text("v2")
    with Catalogue.from_spec(spec) as changed:
        runtime = Runtime(changed, db=db, clock=FixedClock(), tools=spec)
        with pytest.raises(GovernanceError) as refused:
            runtime.execute(record.id, actor="bob")
    assert "the tools changed since v1 was checked, and it no longer passes" in str(refused.value)
    assert "'title' is required by 'greet'" in str(refused.value)


# -- the policy overrides what a server says -----------------------------------------------------------


def test_the_policy_sets_effect_idempotency_scopes_resource_and_trust(time_tools: Catalogue, tmp_path: Path) -> None:
    text = POLICY + (
        "tools:\n"
        '  "*_time": {effect: write, idempotent: false, scopes: ["clock:use"], untrusted_output: false}\n'
        '  convert_time: {resource: "tz:{target_timezone}", external: true}\n'
    )
    policy = Policy.from_yaml(text)
    runtime = Runtime(time_tools, policy, db=f"sqlite:///{tmp_path}/p.db", clock=FixedClock())
    assert runtime.catalogue is not None
    convert = runtime.catalogue["convert_time"]
    assert (convert.effect, convert.idempotent, convert.external, convert.scopes) == (
        "write",
        False,
        True,
        ("clock:use",),
    )
    assert convert.untrusted_output is False and convert.resource_for({"target_timezone": "UTC"}) == "tz:UTC"
    assert convert.overridden == ("effect", "idempotent", "external", "scopes", "resource", "untrusted_output")
    assert time_tools["convert_time"].effect == "read"  # the catalogue itself is as the server says
    steps = plan({"id": 1, "tool": "get_current_time", "params": {"timezone": "UTC"}})
    assert runtime.submit(steps, requested_by="alice").status == "pending_approval"  # a write now
    assert Policy.from_yaml(POLICY).hash != policy.hash and "tools" not in json.loads(
        Policy.from_yaml(POLICY).canonical_json()
    )
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(text)
    code, out, _ = run("tools", "--tools", TIME, "--policy", str(policy_file))
    row = next(line for line in out.splitlines() if line.startswith("convert_time"))
    assert code == 0 and row.split()[1:4] == ["write*", "no*", "yes*"] and out.endswith("tools section\n")
    bad = Policy.from_yaml(POLICY + 'tools: {convert_time: {resource: "tz:{nope}"}}\n')
    with pytest.raises(PolicyError, match="names unknown parameter"):
        check(steps, time_tools, bad)


# -- a tools file: Python modules and MCP servers, with prefixes ---------------------------------------


def test_a_tools_file_combines_a_module_and_a_server_with_prefixes(tmp_path: Path) -> None:
    tools_file = tmp_path / "tools.yaml"
    tools_file.write_text(
        f"sources:\n  - module: {EXAMPLES / 'business.py'}\n    prefix: biz_\n"
        f"  - mcp: {json.dumps(TIME.removeprefix('mcp:'))}\n    prefix: time_\n"
    )
    with Catalogue.from_file(tools_file) as tools:
        assert {"biz_issue_refund", "time_get_current_time", "time_convert_time"} <= set(tools.names)
        assert tools["biz_issue_refund"].compensate == "biz_void_refund"
        assert tools["time_get_current_time"].origin["tool"] == "get_current_time"  # type: ignore[index]
    clash = tmp_path / "clash.yaml"
    clash.write_text(f"sources:\n  - mcp: {json.dumps(TIME)}\n  - mcp: {json.dumps(TIME)}\n")
    with pytest.raises(CatalogueError, match="two sources have a tool named 'convert_time': give one of them"):
        Catalogue.from_file(clash)
    (tmp_path / "plan.json").write_text(
        json.dumps(plan({"id": 1, "tool": "time_get_current_time", "params": {"timezone": "UTC"}}))
    )
    db = f"sqlite:///{tmp_path}/p.db"
    code, out, err = run(
        "submit", str(tmp_path / "plan.json"), "--tools", str(tools_file), "--as", "alice", "--db", db, "--json"
    )
    assert code == 0, err
    submitted = json.loads(out)
    assert run("approve", submitted["id"], "--as", "bob", "--hash", submitted["hash"], "--db", db)[0] == 0
    code, out, err = run("execute", submitted["id"], "--db", db)  # the tools file on record, opened again
    assert code == 0 and "succeeded" in out, err


# -- the command line ----------------------------------------------------------------------------------


def test_mcp_tools_on_the_command_line(tmp_path: Path) -> None:
    code, out, _ = run("tools", "--tools", TIME)
    assert code == 0 and "get_current_time" in out and TIME.removeprefix("mcp:") in out
    (tmp_path / "plan.json").write_text(
        json.dumps(plan({"id": 1, "tool": "get_current_time", "params": {"timezone": 5}}))
    )
    code, out, _ = run("check", str(tmp_path / "plan.json"), "--tools", TIME)
    assert code == 1 and "param-type" in out


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("mcp:ftp://host/x", "expected mcp:stdio:COMMAND ARGS... or mcp:http://HOST:PORT/PATH"),
        ("mcp:stdio:", "give the command that starts the server"),
        ('mcp:stdio:python "unclosed', "cannot be split into words"),
        ("mcp:http://host:port/mcp", "not a valid URL"),
        ("mcp:stdio:/no/such/server --flag", "MCP server command '/no/such/server --flag' did not start"),
        (f"mcp:stdio:{PY} -c 'import sys; sys.exit(3)'", "did not start"),
    ],
)
def test_a_malformed_spec_or_a_server_that_does_not_start_is_one_line(spec: str, said: str) -> None:
    code, out, err = run("tools", "--tools", spec)
    assert code == 2 and out == "" and said in err and err.count("\n") == 1
