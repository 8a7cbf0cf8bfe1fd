"""Governance held against its side doors: the register, retention, and the comparison of modes."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

from plangate import Catalogue, Policy, tool
from plangate.accounts import Accounts
from plangate.models.test import ScriptedModel
from plangate.react import ReActAgent
from plangate.register import Register
from plangate.runtime import Runtime
from tests.helpers import FixedClock

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
