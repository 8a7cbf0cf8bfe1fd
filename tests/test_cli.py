from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from plangate import plan_json_schema
from plangate.cli import main
from plangate.cli._errors import PlainErrors
from plangate.errors import PolicyError, StaleHashError
from tests.conftest import EXAMPLES, ROOT

TOOLS = str(EXAMPLES / "business.py")
POLICY = str(EXAMPLES / "policy.yaml")
PLANS = EXAMPLES / "plans"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_clean_plan_exits_0_with_a_one_line_summary() -> None:
    code, out, err = run("check", str(PLANS / "refund.json"), "--tools", TOOLS)
    assert code == 0 and err == ""
    assert out.count("\n") == 1 and out.startswith("ok: plan ")
    assert "passes the check (no policy given)" in out


def test_violations_exit_1_one_line_each() -> None:
    code, out, err = run("check", str(PLANS / "broken.json"), "--tools", TOOLS)
    assert code == 1
    lines = out.splitlines()
    assert len(lines) == 9 and all(line.startswith("step ") for line in lines)
    assert lines[0].startswith("step 1: unknown-tool: ")
    assert err.startswith("rejected: 9 violations")


def test_role_comes_from_the_user_or_the_flag() -> None:
    cleanup = str(PLANS / "cleanup.json")
    code, out, _ = run("check", cleanup, "--tools", TOOLS, "--policy", POLICY, "--as", "alice")
    assert code == 1 and "tool-not-allowed" in out
    code, out, _ = run("check", cleanup, "--tools", TOOLS, "--policy", POLICY, "--as", "alice", "--role", "operator")
    assert code == 1 and "tool-not-allowed" not in out
    code, out, _ = run("check", cleanup, "--tools", TOOLS, "--policy", POLICY)
    assert "plan: unknown-role: the requester has no role" in out


def test_json_output() -> None:
    code, out, _ = run(
        "check", str(PLANS / "refund.json"), "--tools", TOOLS, "--policy", POLICY, "--as", "alice", "--json"
    )
    data = json.loads(out)
    assert code == 0 and data["ok"] is True
    assert data["policy"]["approval"] == "human"
    assert data["policy"]["required_approvals"] == ["privacy-officer"]
    assert len(data["plan_hash"]) == 64 and data["summary"].startswith("ok:")
    code, out, _ = run("check", str(PLANS / "broken.json"), "--tools", TOOLS, "--json")
    data = json.loads(out)
    assert code == 1 and data["violations"][0] == {
        "rule": "unknown-tool",
        "step": 1,
        "source": "check",
        "message": "no tool named 'get_invoce' in the catalogue; did you mean 'get_invoice'?",
    }


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        (None, [], "cannot read"),
        ('{"task": ', [], "not-json: line 1 column 10"),
        ('{"task": "t", "category": "c", "steps": [{"id": 1}]}', [], "not a valid plan:\n  steps[0].tool: required"),
        ("[]", [], "not a valid plan"),
        (
            '{"task": "t", "category": "c", "steps": [{"id": 1, "tool": "x", "rationale": "r"}]}',
            ["--policy", "nope.yaml"],
            "cannot read policy 'nope.yaml'",
        ),
    ],
)
def test_unreadable_input_exits_2_with_a_plain_message(
    tmp_path: Path, content: str | None, args: list[str], message: str
) -> None:
    plan = tmp_path / "plan.json"
    if content is not None:
        plan.write_text(content)
    code, out, err = run("check", str(plan), "--tools", TOOLS, *args)
    assert code == 2 and out == ""
    assert err.startswith("plangate: ") and message in err
    assert "Traceback" not in err


def test_files_that_cannot_be_read_or_decoded_exit_2(tmp_path: Path) -> None:
    """Tasks and a price table that are not UTF-8, a tools path too long to look at: one plain line, exit 2."""
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("tasks: [{question: caf\xe9}]\n".encode("latin-1"))
    too_long = str(tmp_path / ("t" * 300 + ".py"))
    db = f"sqlite:///{tmp_path}/plangate.db"
    for args, message in (
        (["compare", str(latin1), "--tools", TOOLS, "--model", "anthropic:any"], ("tasks", "not-utf8")),
        (["plan", "refund invoice 42", "--tools", TOOLS, "--prices", str(latin1)], ("price table", "not-utf8")),
        (["tools", "--tools", too_long], ("cannot read tools file", "")),
    ):
        code, out, err = run(*args, *(["--db", db] if args[0] != "tools" else []))
        what, rule = message
        assert (code, out) == (2, "") and err.startswith(f"plangate: {what} ") and rule in err, err
        assert "Traceback" not in err


def test_bad_policy_and_bad_tools_exit_2(tmp_path: Path) -> None:
    bad_policy = tmp_path / "policy.yaml"
    bad_policy.write_text("version: 1\nname: x\nlimits: {max_steps: many}\n")
    code, _, err = run("check", str(PLANS / "refund.json"), "--tools", TOOLS, "--policy", str(bad_policy))
    assert code == 2 and "limits.max_steps: Input should be a valid integer" in err
    code, _, err = run("check", str(PLANS / "refund.json"), "--tools", "no.such.module")
    assert code == 2 and "cannot import tools module 'no.such.module'" in err


def test_schema_tools_and_rules() -> None:
    code, out, _ = run("schema")
    assert code == 0 and json.loads(out) == plan_json_schema()
    code, out, _ = run("tools", "--tools", TOOLS)
    header = ["TOOL", "EFFECT", "IDEMPOTENT", "EXTERNAL", "TIMEOUT", "RETRIES", "SCOPES", "SOURCE", "PARAMS"]
    assert code == 0 and out.splitlines()[0].split() == header
    assert any(line.startswith("send_email       irreversible") for line in out.splitlines())
    code, out, _ = run("tools", "--tools", TOOLS, "--json")
    assert code == 0 and json.loads(out)[0]["name"] == "get_invoice"
    code, out, _ = run("rules")
    assert code == 0 and "unknown-tool" in out and "resource-conflict" in out


def commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command and subcommand below ``group``, as the words that invoke it."""
    for name, command in sorted(group.commands.items()):
        yield (*path, name)
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))


COMMANDS = [(), *commands(main)]


def test_the_walk_finds_every_group_and_its_subcommands() -> None:
    assert len(COMMANDS) == 58
    assert {
        ("edit",),
        ("diff",),
        ("replay",),
        ("close",),
        ("demo",),
        ("init",),
        ("eval", "planner"),
        ("governance", "export"),
    } <= set(COMMANDS)
    assert {("audit", "verify"), ("library", "remove"), ("users", "token"), ("approvals", "report")} <= set(COMMANDS)
    assert {("users", "revoke"), ("users", "disable"), ("login",), ("logout",)} <= set(COMMANDS)
    assert ("retention", "purge") in COMMANDS
    assert ("mcp", "serve") in COMMANDS


@pytest.mark.parametrize("command", COMMANDS, ids=lambda words: " ".join(words) or "plangate")
def test_every_command_has_help(command: tuple[str, ...]) -> None:
    code, out, _ = run(*command, "--help")
    assert code == 0 and out.startswith("Usage: ")
    description = out.split("\n\n")[1]
    assert description.strip() and not description.startswith("Options:"), f"{command} has no description"


def test_each_command_s_help_speaks_of_that_command() -> None:
    """Shared options say what they do for the command they are on, not for the one they were written for."""
    helps = {" ".join(command): run(*command, "--help")[1] for command in COMMANDS}
    planning = {"plan", "run", "library"}
    for name, text in helps.items():
        flat = " ".join(text.split())
        if name.split(" ")[0] not in planning:
            assert "plan library is used" not in flat, name
    react = " ".join(helps["react"].split())
    assert "Required: the model that thinks and chooses each action." in react
    assert "Policy YAML file to hold each action against." in react
    assert "Required: the model both modes use." in " ".join(helps["compare"].split())
    worker = " ".join(helps["worker"].split())
    assert "the one recorded" not in worker and "(required)" in worker


def test_plangate_errors_end_plainly_wherever_they_are_raised() -> None:
    """No command has to catch plangate's errors: the top group turns each into one line and its exit code."""
    assert isinstance(main, PlainErrors)
    top, sub = PlainErrors("top"), click.Group("sub")
    top.add_command(sub)
    for name, error in (
        ("refused", StaleHashError("approval for a version that is no longer current")),
        ("bad", PolicyError("cannot read policy 'p.yaml'")),
        ("bug", ValueError("a bug")),
    ):
        sub.add_command(click.Command(name, callback=partial(raise_, error)))
    result = CliRunner().invoke(top, ["sub", "refused"])
    assert (result.exit_code, result.stdout) == (4, "")
    assert result.stderr == "plangate: refused: approval for a version that is no longer current\n"
    result = CliRunner().invoke(top, ["sub", "bad"])
    assert (result.exit_code, result.stderr) == (2, "plangate: cannot read policy 'p.yaml'\n")
    result = CliRunner().invoke(top, ["sub", "bug"])
    assert isinstance(result.exception, ValueError), "anything else is a bug and keeps its traceback"


def raise_(error: Exception) -> None:
    raise error


def test_the_installed_entry_point_runs(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["plangate", "--version"], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0 and done.stdout.startswith("plangate, version ")
    done = subprocess.run(
        [sys.executable, "-m", "plangate", "check", str(PLANS / "broken.json"), "--tools", TOOLS],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 1 and done.stdout.startswith("step 1: unknown-tool")


def test_the_demo_walks_the_whole_story(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PLANGATE_DEMO_DIR": str(tmp_path / "demo"),
    }
    done = subprocess.run(["bash", "examples/demo.sh"], cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.count("(exit 4)") == 5, (
        "self-approval, unapproved execution, a stale hash, resuming a closed plan, a changed text: refused"
    )
    refusals = done.stderr
    assert "closed by dave" in refusals and "the customer withdrew the request" in refusals
    assert "may not approve it" in refusals and "is pending_approval, not approved" in refusals
    assert "is not plan" in refusals
    assert "may not run: v1: the stored plan text hashes to" in refusals
    assert "audit log intact, but 1 stored row(s) disagree with it" in out
    assert "rejected (4 violations)" in out and out.count("(exit 1)") == 2
    assert "halted at step 2 (issue_refund)" in out and out.count("(exit 3)") == 1
    assert "succeeded: 4 steps done, 0 skipped, 0 run now" in out, "executing a finished plan repeats nothing"
    assert "planned from the library: template 'refund-and-tell', slots {'invoice_id': '44'}" in out
    assert "run SUCCEEDED (4 steps)" in out and "audit log intact:" in out
    assert out.rstrip().endswith("{'refund': 2, 'email': 2}")


def test_a_store_that_goes_away_mid_command_ends_it_plainly(pg_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The PostgreSQL connection cut while a command reads (a server restart, a network cut): one plain line
    and exit 2, where the driver's error ended the command with a traceback."""
    from plangate.runtime import Runtime
    from tests import outage

    outage.DB["url"] = pg_db
    listed = Runtime.list_plans

    def cut_first(self: Runtime, *args: Any, **kwargs: Any) -> Any:
        outage.cut_every_connection()
        return listed(self, *args, **kwargs)

    monkeypatch.setattr(Runtime, "list_plans", cut_first)
    code, out, err = run("list", "--db", pg_db)
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    assert err.startswith("plangate: the store could not be used (") and err.count("\n") == 1, err
    assert "the command can be run again once the store answers" in err, err
