"""``plangate demo``: the governed path end to end on the bundled example business.

submit -> check -> policy -> approval -> execute -> trace -> audit verify, on embedded
defaults (SQLite, no network, no API key). Every step is a real ``plangate`` command, run
in this process and shown as ``$ plangate ...`` with its exit code, so what you read is
what you would type. ``examples/demo.sh`` (``make demo``) runs this command.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shlex
import shutil
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from plangate._examples_dir import examples_dir


class _Story:
    """The demo's commands, each run through the command line itself."""

    def __init__(self, folder: Path) -> None:
        examples = examples_dir()
        self.folder = folder
        self.tools = _shown(examples / "business.py")
        self.policy = _shown(examples / "policy.yaml")
        self.plans = examples / "plans"

    def say(self, text: str) -> None:
        click.echo(f"\n\033[1m== {text}\033[0m")

    def run(self, *args: str) -> int:
        click.echo(f"$ plangate {shlex.join(args)}")
        code = self.quiet(*args)
        click.echo(f"(exit {code})")
        return code

    def quiet(self, *args: str, stdin: str = "") -> int:
        from plangate.cli import main

        sys.stdout.flush()
        with _stdin(stdin):
            try:
                main.main(list(args), prog_name="plangate")
            except SystemExit as end:
                return end.code if isinstance(end.code, int) else (0 if end.code is None else 1)
        return 0  # pragma: no cover - click always ends with SystemExit

    def output(self, *args: str, stdin: str = "") -> str:
        captured = io.StringIO()
        with contextlib.redirect_stdout(captured):
            self.quiet(*args, stdin=stdin)
        return captured.getvalue()

    def latest(self) -> tuple[str, str]:
        """The id and hash of the plan submitted last."""
        plan = json.loads(self.output("list", "--json", "--limit", "1"))[0]  # newest first
        return plan["id"], plan["hash"]

    def plan(self, name: str) -> str:
        return _shown(self.plans / f"{name}.json")

    def submit(self, name: str, user: str) -> tuple[str, str]:
        self.output("submit", self.plan(name), "--tools", self.tools, "--policy", self.policy, "--as", user)
        return self.latest()


@contextlib.contextmanager
def _stdin(text: str) -> Iterator[None]:
    saved = sys.stdin
    sys.stdin = io.StringIO(text)
    try:
        yield
    finally:
        sys.stdin = saved


def _shown(path: Path) -> str:
    """A path as short as it can be written from here."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


@click.command("demo")
@click.option(
    "--dir",
    "folder",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".plangate/demo"),
    show_default=True,
    help="Where the demo keeps its store and the example business (emptied first).",
)
@click.option(
    "--serve", is_flag=True, help="Then serve the dashboard with the demo's plans in it (needs the server extra)."
)
@click.option("--port", default=8420, show_default=True, help="The dashboard's port, with --serve.")
def demo_command(*, folder: Path, serve: bool, port: int) -> None:
    """Walk the governed path end to end on the bundled example business."""
    if serve:
        from plangate._extras import need

        need("server", "demo --serve")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    os.environ["PLANGATE_DB"] = f"sqlite:///{folder}/plangate.db"
    os.environ["PLANGATE_EXAMPLE_DB"] = str(folder / "business.db")
    story = _Story(folder)
    refund_id = _the_refund(story)
    _planning(story, refund_id)
    _refusals(story)
    _audit(story, refund_id)
    story.say("What the example business saw: two refunds, two emails (counted by the business itself)")
    click.echo(_effect_counts())
    if serve:
        _serve(story, port)


def _the_refund(story: _Story) -> str:
    tools, policy = story.tools, story.policy
    story.say("The catalogue: typed tools with governance metadata")
    story.run("tools", "--tools", tools)
    story.say("alice (support) submits a plan: refund invoice 42 and tell the customer")
    story.run("submit", story.plan("refund"), "--tools", tools, "--policy", policy, "--as", "alice")
    plan_id, plan_hash = story.latest()
    story.run("show", plan_id)
    story.say("Gate: nobody approves their own plan, nor runs an unapproved one")
    story.run("approve", plan_id, "--as", "alice", "--hash", plan_hash)
    story.run("execute", plan_id)
    story.say("Gate: an approval is bound to the exact version reviewed")
    story.run("approve", plan_id, "--as", "dave", "--hash", "0" * 64)
    story.say("dave (approver) and carol (privacy officer) approve the hash they reviewed")
    story.run("approve", plan_id, "--as", "dave", "--hash", plan_hash, "--comment", "amount matches the invoice")
    story.run("approve", plan_id, "--as", "carol", "--hash", plan_hash, "--comment", "email to the customer only")
    story.say("The engine runs it: no model, every step recorded before and after the call")
    story.run("execute", plan_id, "--as", "ops")
    story.say("Executing a finished plan repeats nothing")
    story.run("execute", plan_id)
    return plan_id


def _planning(story: _Story, refund_id: str) -> None:
    tools, policy = story.tools, story.policy
    story.say("The approved plan joins the library: its task's values become typed slots")
    story.run("library", "add", refund_id, "--name", "refund-and-tell", "--as", "dave")
    story.say("Planning offline, with no model: a new task fills the template (then check, policy, approval as ever)")
    task = "Refund invoice 44 and tell the customer"
    story.run("plan", task, "--tools", tools, "--policy", policy, "--as", "alice")
    story.run("run", task, "--tools", tools, "--policy", policy, "--as", "alice")
    plan_id, plan_hash = story.latest()
    story.run("approve", plan_id, "--as", "dave", "--hash", plan_hash)
    story.run("approve", plan_id, "--as", "carol", "--hash", plan_hash)
    story.run("execute", plan_id)


def _refusals(story: _Story) -> None:
    story.say("A plan the policy rejects: SQL that writes, a role without the right, two emails at once")
    story.run("submit", story.plan("cleanup"), "--tools", story.tools, "--policy", story.policy, "--as", "alice")
    story.say("A plan that halts mid-way: the refund is refused, so the email is never sent")
    plan_id, plan_hash = story.submit("halt", "alice")
    story.run("approve", plan_id, "--as", "dave", "--hash", plan_hash)
    story.run("execute", plan_id)
    story.say("Nobody will resume it: dave closes it for good, and the reason is recorded")
    story.run("close", plan_id, "--reason", "the customer withdrew the request", "--as", "dave")
    story.run("resume", plan_id, "--tools", story.tools)


def _audit(story: _Story, refund_id: str) -> None:
    story.say("The story of the refund, rebuilt from the audit log")
    story.run("trace", refund_id)
    story.say("The audit log is intact (any edit, deletion or reordering would be named)")
    # Hash-chained under a key kept outside the database: PLANGATE_AUDIT_KEY, or the key file
    # PLANGATE_AUDIT_KEY_FILE (default ~/.config/plangate/audit.key, made on first use, mode 0600).
    story.run("audit", "verify")
    story.say("Keep the head outside the database: a log cut short (its head row rewritten too) is then caught")
    story.run("audit", "head")
    story.run("audit", "verify", "--head", story.output("audit", "head").strip().replace(" ", ":"))
    story.say("An approved plan changed in the database, outside plangate, does not run; the audit names the row")
    plan_id, plan_hash = story.submit("halt", "alice")
    story.output("approve", plan_id, "--as", "dave", "--hash", plan_hash)
    # Someone with access to the database, not to the audit key:
    with contextlib.closing(sqlite3.connect(story.folder / "plangate.db")) as db, db:
        db.execute("UPDATE plan_versions SET body = replace(body, '\"43\"', '\"44\"') WHERE plan_id = ?", (plan_id,))
    click.echo("(the stored text of the approved plan now refunds invoice 44 instead of 43)")
    story.run("execute", plan_id)
    story.run("audit", "verify")
    story.run("list")


def _effect_counts() -> dict[str, int]:
    spec = importlib.util.spec_from_file_location("plangate_demo_business", examples_dir() / "business.py")
    assert spec is not None and spec.loader is not None
    business = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(business)
    counts: dict[str, int] = business.effect_counts()
    return counts


def _serve(story: _Story, port: int) -> None:
    story.say("The dashboard, with the demo's plans in it (Ctrl-C to stop)")
    waiting, _ = story.submit("refund", "alice")
    click.echo(f"alice's second refund plan {waiting[:8]} waits in the queue for an approver (dave or carol)")
    # The first account needs nothing; after it, accounts change only with a governance account's token.
    password = "demo-password\n"
    story.quiet("users", "add", "gina", "--role", "governance", "--category", "*", "--password-stdin", stdin=password)
    token = story.output("login", "gina", "--password-stdin", "--print", "--expires", "12h", stdin=password).strip()
    os.environ["PLANGATE_TOKEN"] = token
    for name, role, category in [("dave", "approver", "refunds"), ("carol", "approver", "*")]:
        story.quiet("users", "add", name, "--role", role, "--category", category, "--password-stdin", stdin=password)
    for name, role in [("alice", "requester"), ("audrey", "auditor")]:
        story.quiet("users", "add", name, "--role", role, "--password-stdin", stdin=password)
    click.echo(f"log in at http://127.0.0.1:{port} as dave, carol, alice, gina or audrey, password demo-password")
    story.run("serve", "--port", str(port), "--tools", story.tools, "--policy", story.policy)


COMMANDS = (demo_command,)
