"""Governance held against its side doors: the register, retention, and the comparison of modes."""

from __future__ import annotations

from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path

from click.testing import CliRunner

from plangate import Catalogue, Policy, ledger, retention, tool
from plangate.accounts import Accounts
from plangate.cli import main
from plangate.models.test import ScriptedModel
from plangate.notify import SlackNotifier
from plangate.react import ReActAgent
from plangate.register import Register
from plangate.runtime import Runtime
from plangate.server import create_app
from plangate.store import open_store
from plangate.tools.basic import calculate
from tests.conftest import EXAMPLES, load_plan
from tests.helpers import FixedClock, plan
from tests.test_notify import SECRET, click

OLD = datetime(2020, 1, 1, 9, 0, tzinfo=UTC)
NOTES: list[str] = []


@tool(effect="write")
def note(text: str) -> str:
    """Write a note to the team's board."""
    NOTES.append(text)
    return "noted"


def test_a_react_write_in_a_category_the_register_holds_waits_for_a_person(tmp_path: Path) -> None:
    """The policy clears 'react' and its envelope names note, so a write goes alone; once governance holds
    the category in the register, the write waits for a person, as a plan's automatic approval does."""
    policy = Policy.from_yaml("version: 1\nname: r\ncategories: {react: {tools: [note]}}\napproval: {auto: [react]}\n")
    url, clock = f"sqlite:///{tmp_path}/r.db", FixedClock()
    replies = ['Thought: note it.\nAction: note {"text": "hi"}', "Thought: done.\nFinal Answer: done"]
    with closing(Runtime(Catalogue([note]), policy, db=url, clock=clock)) as rt:
        Accounts(rt.store).add("gina", "governance")

        def agent(*turns: str) -> ReActAgent:
            model = ScriptedModel(list(turns or replies))
            return ReActAgent(model, rt.catalogue, rt.store, policy=policy, clock=clock)

        NOTES.clear()
        assert agent().run("Note hi").status == "answered" and NOTES == ["hi"], "cleared: the write goes alone"
        Register(rt.store, clock).set("react", False, by="gina", reason="until the audit")
        NOTES.clear()
        held = agent().run("Note hi")
        assert NOTES == [], "a write ran in a category the register holds for people"
        assert held.status == "paused" and held.reason == (
            "paused: note (write) needs approval by a person; "
            "the auto-approval register holds category 'react' for people (until the audit)"
        )
        rt.approve(held.run_id, "dave", held.pending_hash or "")
        resumed = agent(replies[1]).resume(held.run_id)
        assert resumed.status == "answered" and NOTES == ["hi"], "a person's approval lets it go"


def test_a_rejected_plan_edited_while_a_purge_runs_is_left_whole(
    tmp_path: Path, catalogue: Catalogue, policy: Policy
) -> None:
    """A purge lists old finished plans, then takes them batch by batch. A rejected plan listed at the start and
    edited (so alive again) before its batch is not purged: its new text and its run's evidence stay."""
    url = f"sqlite:///{tmp_path}/r.db"
    with closing(Runtime(catalogue, policy, db=url, clock=FixedClock(OLD))) as old:
        ids = []
        for _ in range(2):
            record = old.submit(load_plan("refund"), "alice")
            old.reject(record.id, "ben", "not today")
            ids.append(record.id)
    rt = Runtime(catalogue, policy, db=url)
    revived = sorted(ids)[1]  # in the second batch
    edited = dict(load_plan("refund"), task="Refund invoice 42, again")

    def edit_during_the_purge(done: int, total: int) -> None:
        if done == 1:
            rt.edit(revived, edited, "alice")

    purged = retention.purge(
        rt.store, days=365, policy=policy, now=datetime.now(UTC), actor="gina", batch=1, progress=edit_during_the_purge
    )
    assert purged.plans == (sorted(ids)[0],), "a plan edited back to life was purged"
    assert [why.split(":")[0] for why in purged.refused] == [f"plan {revived}"]
    assert "pending_approval" in purged.refused[0]
    record = rt.get(revived)
    assert record.purged is None and record.plan is not None and record.plan.task == "Refund invoice 42, again"
    assert ledger.verify(rt.store).ok


def test_compare_refuses_a_store_with_accounts(tmp_path: Path) -> None:
    """The comparison approves every plan and ReAct action itself, as 'compare-approver', a name no account
    proves: on a store with accounts it would run plans no person approved, with no token asked for."""
    url = f"sqlite:///{tmp_path}/c.db"
    with closing(open_store(url)) as store:
        Accounts(store).add("gina", "governance")
    tasks, tools = str(EXAMPLES / "compare" / "tasks.yaml"), str(EXAMPLES / "compare" / "tools.py")
    result = CliRunner().invoke(main, ["compare", tasks, "--tools", tools, "--model", "scripted", "--db", url])
    assert result.exit_code == 4, result.output
    assert "compare-approver" in result.stderr and "store of its own" in result.stderr
    with closing(open_store(url)) as store:
        assert store.query("SELECT COUNT(*) FROM plans") == [(0,)], "nothing was submitted"


def test_a_task_cannot_put_a_link_or_a_mention_in_the_chat_notice(
    tmp_path: Path, catalogue: Catalogue, policy: Policy
) -> None:
    """The task is the requester's text: the notice shows it as text, never as a link labelled as a button
    (to another plan's page, or anywhere) or a mention that pages the whole channel."""
    task = "Refund invoice 42 <!channel> <https://evil.example/plans/other|Approve here> & done"
    with closing(Runtime(catalogue, policy, db=f"sqlite:///{tmp_path}/n.db")) as rt:
        record = rt.submit(dict(load_plan("refund"), task=task), "alice")
    message = SlackNotifier(webhook_url="http://127.0.0.1:9/none", base_url="https://plangate.example").message(record)
    shown = "Refund invoice 42 &lt;!channel&gt; &lt;https://evil.example/plans/other|Approve here&gt; &amp; done"
    assert message["text"] == (
        f"Plan waiting for approval: {shown} (refunds) https://plangate.example/plans/{record.id}"
    )
    assert shown in message["blocks"][0]["text"]["text"]


def test_a_react_run_has_no_plan_text_to_keep_as_a_template(tmp_path: Path) -> None:
    """A finished ReAct run (like a purged plan) has no plan text: the library refuses it in one line."""
    url = f"sqlite:///{tmp_path}/r.db"
    replies = ["Thought: add.\nAction: calculate[40+2]", "Thought: done.\nFinal Answer: 42"]
    with closing(open_store(url)) as store:
        run = ReActAgent(ScriptedModel(replies), Catalogue([calculate]), store, clock=FixedClock())
        run_id = run.run("What is 40+2?").run_id
    result = CliRunner().invoke(main, ["library", "add", run_id, "--db", url])
    assert result.exit_code == 2 and result.stderr.strip().endswith(
        f"plan {run_id} is a ReAct run: it has no plan text to keep as a template"
    ), result.output


@tool
def look(key: str) -> str:
    """Look a record up."""
    return key


def test_replacing_a_template_needs_the_right_to_remove_it(tmp_path: Path) -> None:
    """Removing a template is for approvers of its plan's category; adding another under its name replaces it,
    so that is for them too, not for an approver of some other category."""
    url = f"sqlite:///{tmp_path}/lib.db"
    policy = Policy.from_yaml("version: 1\nname: lib\napproval: {auto: [lookups, refunds]}\n")
    with closing(Runtime(Catalogue([look]), policy, db=url, clock=FixedClock())) as rt:
        accounts = Accounts(rt.store)
        accounts.add("dave", "approver", categories=("lookups",))
        accounts.add("erin", "approver", categories=("refunds",))
        tokens = {name: accounts.issue_token(name) for name in ("dave", "erin")}
        ids = {
            category: rt.submit(
                plan({"id": 1, "tool": "look", "params": {"key": "INV-1"}}, category=category, task="Look up INV-1"),
                "ann",
            ).id
            for category in ("lookups", "refunds")
        }

    def add(category: str, who: str) -> tuple[int, str]:
        result = CliRunner().invoke(
            main, ["library", "add", ids[category], "--name", "look-up", "--token", tokens[who], "--db", url]
        )
        return result.exit_code, result.output

    assert add("refunds", "erin")[0] == 0
    code, out = add("lookups", "dave")
    assert code == 4 and "dave (approver) may not decide on plans of category 'refunds'" in out, out
    with closing(open_store(url)) as store:
        assert [(t.name, t.source_plan) for t in store.templates()] == [("look-up", ids["refunds"])]


def test_the_chat_reply_to_a_click_shows_the_task_as_text(tmp_path: Path, catalogue: Catalogue, policy: Policy) -> None:
    """The reply to an approve click names the plan by its task: as text, as the notice does."""
    db = f"sqlite:///{tmp_path}/cb.db"
    with closing(open_store(db)) as store:
        Accounts(store).add("dave", "approver", categories=("refunds",), slack_id="U0DAVE")
    app = create_app(catalogue, policy, db=db, secure_cookies=False, slack_signing_secret=SECRET)
    with closing(Runtime(catalogue, policy, db=db)) as rt:
        record = rt.submit(dict(load_plan("refund"), task="Refund invoice 42 <!channel>"), "alice")
    reply = click(app, record, "U0DAVE", "plangate_approve")
    assert reply.json()["text"] == "dave: Refund invoice 42 &lt;!channel&gt; is now pending_approval."
