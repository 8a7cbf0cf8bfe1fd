"""A store outage in the middle of a ReAct run: between a tool's call and the recording of what it answered,
while the model's turn is recorded, as the register is read and as the run's end is recorded. The run
waits for the store, takes itself back under its own lease and records what it knew, once; a store not
back within the lease, or a lease lost meanwhile, is said plainly, naming the action whose outcome was
known and not recorded, and the next resume stops the run for a person.

The connections are cut from inside a tool's call or a model's turn (:mod:`tests.outage`).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest
from click.testing import CliRunner

from plangate import Catalogue, Policy, RunContext, ledger, lifecycle, tool
from plangate._clock import SystemClock, iso
from plangate.cli import main
from plangate.errors import LeaseLostError, StoreLostError
from plangate.models import ModelRequest
from plangate.models.test import FunctionModel, ScriptedModel
from plangate.react import ReActAgent
from plangate.register import Register
from plangate.runtime import Runtime
from plangate.store import Store, open_store
from tests import outage
from tests.helpers import until
from tests.outage import CALLS, cut_armed_commits, cut_every_connection, store_stays_away, tools

GIVEN: list[tuple[ReActAgent, Store]] = []  # the agents made, and the stores they were given


@pytest.fixture(autouse=True)
def quick_retries(pg_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from outage.quick_retries(pg_db, monkeypatch)
    for react, given in GIVEN:
        react.close()  # the connection it made again after the cut
        given.close()
    GIVEN.clear()


def agent(db: str, model: Any, **options: Any) -> ReActAgent:
    given = open_store(db)
    react = ReActAgent(model, Catalogue([*tools(), pay_and_be_stopped]), given, user="ann", **options)
    GIVEN.append((react, given))
    return react


def approved(db: str, tool: str, **options: Any) -> tuple[ReActAgent, str]:
    """A run paused before ``tool`` (a write), approved by a person: the agent to resume it, and its id."""
    react = agent(db, ScriptedModel([f'Action: {tool} {{"amount": 5}}', "Final Answer: paid"]), **options)
    paused = react.run("Pay 5")
    assert paused.status == "paused", paused
    rt = Runtime(react.catalogue, db=db)
    rt.approve(paused.run_id, "ben", paused.pending_hash or "")
    rt.close()
    return react, paused.run_id


def observed_once_and_verifies(db: str, run_id: str) -> list[str]:
    """Each action's tool was called once and its observation recorded once; the log verifies; the run ended
    with its lease given back. Its events' kinds."""
    assert all(n == 1 for n in collections.Counter(CALLS).values()), CALLS
    with closing(open_store(db)) as store:
        events = list(store.events(run_id))
        observed = collections.Counter(e.step_id for e in events if e.kind == "react.observation")
        assert all(n == 1 for n in observed.values()), observed
        report = ledger.verify(store)
        assert report.ok, str(report)
        row = store.get_plan(run_id)
        assert row is not None and row.status == "succeeded" and row.lease_owner is None, row
    return [e.kind for e in events]


def test_a_payment_answered_as_the_store_went_away_is_recorded_once_and_the_run_goes_on(pg_db: str) -> None:
    """The payment succeeded as the store went away: the observation was never recorded, the run raised a
    driver's error and stayed running until its lease ran out, and the next resume stopped it as an action
    that "may or may not have happened". Now the run takes itself back, records the payment and answers."""
    react, run_id = approved(pg_db, "pay")
    result = react.resume(run_id)
    assert result.status == "answered" and result.answer == "paid", result
    assert [s.observation for s in result.steps if s.kind == "action"] == ["paid 5"]
    assert [(run_id, 1)] == CALLS
    story = observed_once_and_verifies(pg_db, run_id)
    assert story[-3:] == ["react.resumed", "react.observation", "react.answered"], story


def test_an_observation_whose_commit_went_through_as_the_connection_broke_is_not_recorded_twice(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cut_armed_commits(monkeypatch)
    react, run_id = approved(pg_db, "pay_then_cut_the_commit")
    result = react.resume(run_id)
    assert result.status == "answered", result
    assert [(run_id, 1)] == CALLS
    observed_once_and_verifies(pg_db, run_id)


def test_a_store_not_back_within_the_lease_names_the_action_whose_outcome_was_known(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run waits only while its lease could hold; then the caller is told which action answered what, not
    recorded. The next resume stops the run for a person, and never calls the payment again."""
    react, run_id = approved(pg_db, "pay", lease_seconds=1.0)
    store_stays_away(monkeypatch)
    with pytest.raises(StoreLostError) as raised:
        react.resume(run_id)
    said = str(raised.value)
    assert f"ReAct run {run_id}" in said and "not back within the run's lease (1 s)" in said, said
    assert "action 1 (pay) answered 'paid 5'" in said and "not recorded" in said, said
    monkeypatch.undo()
    model = ("--model", "openai-compatible:never-asked", "--base-url", "http://127.0.0.1:9/v1")
    code, out, err = plangate("react", "--resume", run_id, "--tools", outage.TOOLS, *model)
    assert code == 3, (out, err)
    assert "stopped: the run stopped without finishing" in out, out
    assert "action 1 (pay) started and no outcome of it is on record: it may or may not have happened" in out, out
    assert [(run_id, 1)] == CALLS
    with closing(open_store(pg_db)) as store:
        row = store.get_plan(run_id)
        assert row is not None and row.status == "halted"


def plangate(*args: str) -> tuple[int, str, str]:
    done = CliRunner().invoke(main, [*args, "--db", outage.DB["url"]])
    return done.exit_code, done.stdout, done.stderr


def cutting(*answers: str, at: int) -> FunctionModel:
    """A model that answers in turn, and cuts the store's connections while it writes answer ``at`` (from 1)."""
    left = list(answers)

    def answer(request: ModelRequest) -> str:
        if len(left) == len(answers) - at + 1:
            cut_every_connection()
        return left.pop(0)

    return FunctionModel(answer)


def test_a_cut_while_the_models_turn_is_recorded_loses_nothing(pg_db: str) -> None:
    """The store went away while the model wrote its turn: the turn's cost and its action were not recorded,
    and the run stayed running with nothing called. Now it takes itself back and goes on to the pause."""
    model = cutting('Action: note {"n": 1}', "Final Answer: noted", at=1)
    react = agent(pg_db, model)
    result = react.run("Note 1")
    assert result.status == "paused" and CALLS == [], result
    with closing(open_store(pg_db)) as store:
        events = list(store.events(result.run_id))
        paused = ["react.started", "react.action", "react.approval_needed", "plan.pending_approval"]
        assert [e.kind for e in events] == paused
        assert len(store.calls(plan_id=result.run_id)) == 1  # the turn's cost, once
        assert ledger.verify(store).ok


def test_a_cut_as_the_answer_is_recorded_ends_the_run_once(pg_db: str) -> None:
    model = cutting("Final Answer: nothing to do", at=1)
    react = agent(pg_db, model)
    result = react.run("Anything?")
    assert result.status == "answered" and result.answer == "nothing to do", result
    story = observed_once_and_verifies(pg_db, result.run_id)
    assert story.count("react.answered") == 1, story


def test_an_end_whose_commit_went_through_as_the_connection_broke_is_not_recorded_twice(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cut_armed_commits(monkeypatch)
    real = ReActAgent._end

    def end_cut_in_flight(self: ReActAgent, *args: Any, **kwargs: Any) -> None:
        outage.ARMED["thread"] = threading.get_ident()
        real(self, *args, **kwargs)

    monkeypatch.setattr(ReActAgent, "_end", end_cut_in_flight)
    react = agent(pg_db, ScriptedModel(["Final Answer: nothing to do"]))
    result = react.run("Anything?")
    assert result.status == "answered", result
    story = observed_once_and_verifies(pg_db, result.run_id)
    assert story.count("react.answered") == 1, story


@tool(effect="irreversible")
def pay_and_be_stopped(amount: int, ctx: RunContext) -> str:
    """Pay; the store goes away, the run's lease runs out meanwhile, and a resume stops the run as dead."""
    CALLS.append((ctx.plan_id, ctx.step_id))
    cut_every_connection()
    with closing(open_store(outage.DB["url"])) as store:
        until(
            "the lease ran out",
            lambda: not lifecycle.lease_is_live(store.get_plan(ctx.plan_id), iso(SystemClock().now())),  # type: ignore[arg-type]
            limit=20,
        )
        stopped: list[Any] = []
        other = ReActAgent(ScriptedModel([]), Catalogue(tools()), store, user="ann")
        thread = threading.Thread(target=lambda: stopped.append(other.resume(ctx.plan_id)))
        thread.start()  # on a thread of its own, as another process would
        thread.join(30)
    assert stopped[0].status == "stopped", stopped
    return f"paid {amount}"


def test_a_late_observation_is_not_recorded_once_the_run_was_stopped_as_dead(pg_db: str) -> None:
    """The store was back after the lease ran out, and a resume had stopped the run meanwhile: the observation
    is not recorded by the run that lost it, which says what it knew; the stop names the action to settle."""
    react, run_id = approved(pg_db, "pay_and_be_stopped", lease_seconds=1.0)
    with pytest.raises(LeaseLostError) as raised:
        react.resume(run_id)
    said = str(raised.value)
    assert "no longer holds it: action 1 (pay_and_be_stopped) answered 'paid 5', and that is not recorded" in said
    assert [(run_id, 1)] == CALLS
    with closing(open_store(pg_db)) as store:
        events = list(store.events(run_id))
        assert "react.observation" not in [e.kind for e in events]
        assert events[-1].kind == "react.stopped", events[-1]
        assert "action 1 (pay_and_be_stopped) started and no outcome of it is on record" in events[-1].data["reason"]
        assert ledger.verify(store).ok


CLEARED = Policy.from_yaml(
    "version: 1\nname: outage\ncategories:\n  react: {tools: [note]}\napproval:\n  auto: [react]\n"
)


def test_a_cut_as_the_register_is_read_is_waited_out_and_the_cleared_action_runs_once(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store went away as the run read whether the register holds its category for people: the run stayed
    running with its action recorded and never called. Now it reads the register again and goes on."""
    real, reads = Register.holding, []

    def cut_first(self: Register, category: str) -> str | None:
        reads.append(category)
        if len(reads) == 1:
            cut_every_connection()
        return real(self, category)

    monkeypatch.setattr(Register, "holding", cut_first)
    react = agent(pg_db, ScriptedModel(['Action: note {"n": 1}', "Final Answer: noted"]), policy=CLEARED)
    result = react.run("Note 1")
    assert result.status == "answered" and reads == ["react", "react"], result
    assert [(result.run_id, 1)] == CALLS
    observed_once_and_verifies(pg_db, result.run_id)
