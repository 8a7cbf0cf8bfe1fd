"""A store outage in the middle of a run driven by anyone, not only a worker: ``Runtime.execute`` and
``resume`` (and their async twins), the command line, the API. The run waits for the store, takes itself
back under its own lease and records what its tools answered, once; a store not back within the lease
is said plainly, with the steps whose outcomes were known and not recorded.

The connections are cut from inside a step's tool call (:mod:`tests.outage`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import closing
from typing import Any

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from plangate import Catalogue, RunContext, engine, ledger, tool
from plangate.accounts import Accounts
from plangate.cli import main
from plangate.errors import GovernanceError, LeaseLostError, StoreError, StoreLostError
from plangate.policy import Policy
from plangate.register import Register
from plangate.results import Progress
from plangate.runtime import Runtime
from plangate.server import create_app
from plangate.store import open_store
from tests import outage
from tests.helpers import plan, rolled_back_on_halt
from tests.outage import CALLS, ran_once_and_verifies, store_stays_away, submitted, tools


@pytest.fixture(autouse=True)
def quick_retries(pg_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from outage.quick_retries(pg_db, monkeypatch)


def paid_then_noted(db: str) -> str:
    paid, noted = {"id": 1, "tool": "pay", "params": {"amount": 5}}, {"id": 2, "tool": "note", "params": {"n": 1}}
    return submitted(db, paid, noted)


def test_execute_records_a_known_payment_after_the_store_comes_back(pg_db: str) -> None:
    """The payment succeeded as the store went away: ``execute`` raised, the lease was left to expire, and the
    next run read the payment as of unknown outcome and halted for a person. Now the run takes itself back,
    records the payment once and carries on; its progress goes on being told."""
    plan_id = paid_then_noted(pg_db)
    told: list[Progress] = []
    rt = Runtime(Catalogue(tools()), db=pg_db)
    try:
        result = rt.execute(plan_id, progress=told.append)
        assert not rt.store.broken()  # the runtime goes on with the connection it made again
    finally:
        rt.close()
    assert result.status == "succeeded" and result.outputs == {1: "paid 5", 2: 1}, result
    assert [(p.kind, p.step_id) for p in told if p.kind == "succeeded"] == [("succeeded", 1), ("succeeded", 2)]
    ran_once_and_verifies(pg_db, plan_id, 2)


def test_resume_does_not_call_an_idempotent_step_again_after_an_outage(pg_db: str) -> None:
    plan_id = submitted(pg_db, {"id": 1, "tool": "put", "params": {"n": 7}})
    rt = Runtime(Catalogue(tools()), db=pg_db)
    try:
        result = rt.resume(plan_id)
    finally:
        rt.close()
    assert result.status == "succeeded" and result.outputs == {1: 7}, result
    ran_once_and_verifies(pg_db, plan_id, 1)


def test_aexecute_takes_its_run_back_on_its_own_connection(pg_db: str) -> None:
    plan_id = paid_then_noted(pg_db)
    rt = Runtime(Catalogue(tools()), db=pg_db)
    try:
        result = asyncio.run(rt.aexecute(plan_id))
    finally:
        rt.close()
    assert result.status == "succeeded" and result.outputs == {1: "paid 5", 2: 1}, result
    ran_once_and_verifies(pg_db, plan_id, 2)


def executed(db: str, plan_id: str) -> Any:
    """What ``Runtime.execute`` gives back, on a runtime of its own."""
    rt = Runtime(Catalogue(tools()), db=db)
    try:
        return rt.execute(plan_id)
    finally:
        rt.close()


def refused(db: str, plan_id: str, error: type[Exception], lease_seconds: float = 1.0) -> Exception:
    """The error ``Runtime.execute`` ends with, on a runtime of its own whose leases last ``lease_seconds``."""
    rt = Runtime(Catalogue(tools()), db=db, lease_seconds=lease_seconds)
    try:
        with pytest.raises(error) as raised:
            rt.execute(plan_id)
    finally:
        rt.close()
    return raised.value


def test_a_store_not_back_within_the_lease_is_said_with_the_steps_known(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run waits for the store only while its lease could hold; past that, the caller is told which
    outcomes were known and not recorded, and that the next run decides them. Nothing was written."""
    plan_id = submitted(pg_db, {"id": 1, "tool": "pay", "params": {"amount": 5}})

    store_stays_away(monkeypatch)
    said = str(refused(pg_db, plan_id, StoreLostError))
    assert "not back within the run's lease (1 s)" in said and "steps [1]) are not recorded" in said, said
    assert "the next run of the plan decides them" in said, said
    with closing(open_store(pg_db)) as store:
        assert store.steps(plan_id)[1].status == "started"  # for the next run to decide, as before


def test_a_late_outcome_is_not_recorded_once_another_runner_took_the_plan(pg_db: str) -> None:
    plan_id = submitted(pg_db, {"id": 1, "tool": "pay_and_lose_the_lease", "params": {"amount": 5}})
    said = str(refused(pg_db, plan_id, LeaseLostError))
    assert "no longer holds" in said and "steps [1]) are not recorded" in said, said
    assert [(plan_id, 1)] == CALLS
    with closing(open_store(pg_db)) as store:
        assert store.steps(plan_id)[1].status == "outcome_unknown"  # the other run's decision stands


def test_a_take_back_whose_claim_was_cut_in_flight_claims_again(pg_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The claim that takes the run back commits, and its connection breaks before the answer comes: the next
    try finds the plan under the lease that claim took, its own. It claims it again and records the payment,
    where it read the plan as taken by another runner, raised, and left the payment started under a live
    lease, for the next run to halt for a person."""
    outage.cut_armed_commits(monkeypatch)
    start, armed = Runtime.start, []

    def the_take_back_cut(self: Runtime, plan_id: str, **kwargs: Any) -> Any:
        if kwargs.get("leased") and not armed:  # the take-back's first claim (execute's own is not leased)
            armed.append(plan_id)
            outage.ARMED["thread"] = threading.get_ident()
        return start(self, plan_id, **kwargs)

    monkeypatch.setattr(Runtime, "start", the_take_back_cut)
    plan_id = paid_then_noted(pg_db)
    result = executed(pg_db, plan_id)
    assert armed == [plan_id] and "thread" not in outage.ARMED  # the claim's commit was cut
    assert result.status == "succeeded" and result.outputs == {1: "paid 5", 2: 1}, result
    ran_once_and_verifies(pg_db, plan_id, 2)


def test_a_take_back_cut_off_before_its_run_began_still_knows_the_payment(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store goes away again as soon as the run is claimed back, before its run's first transaction: the
    second take-back still records the payment, where the run forgot the outcomes it was given and had not
    yet loaded, and the plan halted for a person to settle a payment plangate knew had been made."""
    start, cuts = Runtime.start, []

    def cut_again(self: Runtime, plan_id: str, **kwargs: Any) -> Any:
        claim = start(self, plan_id, **kwargs)
        if kwargs.get("leased") and not cuts:  # the first take-back: its run has not begun
            cuts.append(plan_id)
            outage.cut_every_connection()
        return claim

    monkeypatch.setattr(Runtime, "start", cut_again)
    plan_id = paid_then_noted(pg_db)
    result = executed(pg_db, plan_id)
    assert cuts == [plan_id]
    assert result.status == "succeeded" and result.outputs == {1: "paid 5", 2: 1}, result
    ran_once_and_verifies(pg_db, plan_id, 2)


def test_a_step_never_called_stays_so_when_its_restart_is_cut_off_too(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit that records the payment and starts the shipment goes through as its answer is lost; the run
    that takes it back starts the shipment again, and the store goes away before that commits. The next
    take-back still knows the shipment was never called, and starts it, where it read the shipment (its
    record still the first start) as of unknown outcome and halted for a person."""
    outage.cut_armed_commits(monkeypatch)
    load, cuts = engine._Run._load, []

    def cut_after_loading(self: engine._Run) -> None:
        load(self)
        if self.uncalled and not cuts:  # the first take-back: it restarts the shipment, uncommitted
            cuts.append(self.plan_id)
            outage.cut_every_connection()

    monkeypatch.setattr(engine._Run, "_load", cut_after_loading)
    plan_id = submitted(
        pg_db,
        {"id": 1, "tool": "pay_then_cut_the_commit", "params": {"amount": 5}},
        {"id": 2, "tool": "ship", "params": {"n": 1}},
    )
    result = executed(pg_db, plan_id)
    assert cuts == [plan_id]
    assert result.status == "succeeded" and result.outputs == {1: "paid 5", 2: 1}, result
    ran_once_and_verifies(pg_db, plan_id, 2, restarted=2)


def test_a_store_back_with_its_records_changed_says_so_at_once(pg_db: str) -> None:
    """The store is back, and the claim to take the run back finds a record changed outside plangate: that is
    said at once, where the take-back read it as the store not back yet, waited out the whole lease and said
    the store was not back."""
    plan_id = submitted(pg_db, {"id": 1, "tool": "pay_then_tamper", "params": {"amount": 5}})
    error = refused(pg_db, plan_id, StoreError, lease_seconds=30.0)
    assert "changed outside plangate" in str(error) and not isinstance(error, StoreLostError), error
    assert [(plan_id, 1)] == CALLS


def test_a_start_known_never_called_is_forgotten_once_the_step_starts_at_that_attempt(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store goes away as the shipment's first start commits, and that commit does not go through; the run
    taken back starts the shipment at that same attempt and calls it (it overruns: it may have happened); the
    store goes away again as that is recorded. The next take-back reads the shipment as of unknown outcome and
    halts for a person: it is never read as the start the first run knew was never called, and shipped again."""
    start_ready, record_call, cuts = engine._Run._start_ready, engine._Run._record_call, []

    def cut_as_it_starts(self: engine._Run) -> list[int]:
        launch = start_ready(self)
        if launch and not cuts:  # the first run's first start: its commit fails
            cuts.append("start")
            outage.cut_every_connection()
        return launch

    def cut_as_it_records(self: engine._Run, outcome: Any) -> None:
        record_call(self, outcome)
        if cuts == ["start"]:  # the shipment the run taken back called, read as of unknown outcome: not committed
            cuts.append("outcome")
            outage.cut_every_connection()

    monkeypatch.setattr(engine._Run, "_start_ready", cut_as_it_starts)
    monkeypatch.setattr(engine._Run, "_record_call", cut_as_it_records)
    plan_id = submitted(pg_db, {"id": 1, "tool": "ship_too_slowly", "params": {"n": 1}})
    result = executed(pg_db, plan_id)
    assert cuts == ["start", "outcome"]
    assert result.status == "halted" and (result.error or "").startswith("outcome unknown"), result
    assert [(plan_id, 1)] == CALLS  # shipped once
    with closing(open_store(pg_db)) as store:
        assert store.steps(plan_id)[1].status == "outcome_unknown"
        assert ledger.verify(store).ok


def plangate(*args: str) -> tuple[int, str, str]:
    done = CliRunner().invoke(main, list(args))
    return done.exit_code, done.stdout, done.stderr


def test_the_command_line_records_a_known_payment_after_the_store_comes_back(pg_db: str) -> None:
    plan_id = paid_then_noted(pg_db)
    code, out, err = plangate("execute", plan_id, "--db", pg_db)
    assert code == 0, (out, err)
    assert "succeeded" in out
    ran_once_and_verifies(pg_db, plan_id, 2)


def store_away_for_a_short_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runtimes made from here on hold leases of a second, and the store they wait for never comes back."""
    init = Runtime.__init__

    def with_a_short_lease(self: Runtime, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("lease_seconds", 1.0)
        init(self, *args, **kwargs)

    monkeypatch.setattr(Runtime, "__init__", with_a_short_lease)
    store_stays_away(monkeypatch)


def test_the_command_line_says_plainly_when_the_store_is_not_back_in_time(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store stays away for the whole lease: the run gives up at the lease's end, and says so."""
    store_away_for_a_short_lease(monkeypatch)
    plan_id = submitted(pg_db, {"id": 1, "tool": "pay", "params": {"amount": 5}})
    code, out, err = plangate("execute", plan_id, "--db", pg_db)
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"plangate: plan {plan_id}'s run lost its store"), err
    assert "steps [1]) are not recorded: the next run of the plan decides them" in line, err


def api_as_the_requester(db: str) -> TestClient:
    accounts = Accounts(open_store(db))
    accounts.add("ann", "requester")  # who asked for the plans
    token = accounts.issue_token("ann")
    accounts.store.close()
    app = create_app(Catalogue(tools()), db=db, secure_cookies=False)
    return TestClient(app, headers={"Authorization": f"Bearer {token}"})


def test_the_api_records_a_known_payment_after_the_store_comes_back(pg_db: str) -> None:
    plan_id = paid_then_noted(pg_db)
    reply = api_as_the_requester(pg_db).post(f"/api/plans/{plan_id}/execute")
    assert reply.status_code == 200, reply.text
    assert reply.json()["status"] == "succeeded" and reply.json()["outputs"] == {"1": "paid 5", "2": 1}
    ran_once_and_verifies(pg_db, plan_id, 2)


def test_the_api_says_what_was_not_recorded_when_the_store_is_not_back_in_time(
    pg_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where it answered an unexpected error (500), with nothing of what the run knew."""
    store_away_for_a_short_lease(monkeypatch)
    plan_id = submitted(pg_db, {"id": 1, "tool": "pay", "params": {"amount": 5}})
    reply = api_as_the_requester(pg_db).post(f"/api/plans/{plan_id}/execute")
    assert reply.status_code == 503, reply.text
    assert "steps [1]) are not recorded: the next run of the plan decides them" in reply.json()["error"]


@tool(effect="write", compensate="refund")
def book(n: int) -> dict[str, str]:
    """A booking, undone by refund."""
    return {"booking": f"b{n}"}


@tool(effect="write", idempotent=True)
def refund(booking: str) -> str:
    CALLS.append((booking, 0))
    return f"refunded {booking}"


@tool(effect="write")
def declined(n: int) -> int:
    raise RuntimeError("declined")


def test_the_policys_rollback_begins_once_the_store_is_back(pg_db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run halts, and the store goes away as the policy's rollback begins: the rollback waits for the store
    and begins then, where the driver's error reached the caller and the halted plan was never rolled back."""
    rt, plan_id = rolled_back_on_halt(pg_db, [book, refund, declined], "book", "declined")
    roll_back, cuts = Runtime._roll_back, []

    def cut_first(self: Runtime, plan_id: str, **kwargs: Any) -> Any:
        if not cuts:
            cuts.append(plan_id)
            outage.cut_every_connection()
        return roll_back(self, plan_id, **kwargs)

    monkeypatch.setattr(Runtime, "_roll_back", cut_first)
    try:
        result = rt.execute(plan_id)
    finally:
        rt.close()
    assert cuts == [plan_id] and result.status == "halted" and result.failed_step == 2, result
    assert CALLS == [("b1", 0)]  # refunded once
    with closing(open_store(pg_db)) as store:
        row = store.get_plan(plan_id)
        assert row is not None and row.status == "compensated" and row.lease_owner is None
        assert store.verify_audit().ok


HOLD: dict[str, Any] = {}  # what changes in governance while the store is away, for the tools below


@tool(effect="irreversible")
def pay_as_governance_changes(amount: int, ctx: RunContext) -> str:
    """Pay; while the store is away, governance changes (``HOLD``: the register holds the plan's category for
    people, or the runtime's tools change), so that the take-back's claim is refused."""
    CALLS.append((ctx.plan_id, ctx.step_id))
    HOLD["change"]()
    outage.cut_every_connection()
    return f"paid {amount}"


@tool(effect="write", idempotent=True)
def filed(n: str, ctx: RunContext) -> str:
    CALLS.append((ctx.plan_id, ctx.step_id))
    return n


@tool(name="filed", effect="write", idempotent=True)
def filed_as_text(n: bool) -> bool:  # its contract changed: what the plan gives it no longer fits
    return n


AUTO = Policy.from_yaml(
    "version: 1\nname: auto-ops\ncategories: {ops: {tools: [pay_as_governance_changes, filed]}}\n"
    "approval: {auto: [ops], escalate: []}\n"
)


def paid_then_filed(db: str) -> str:
    """A payment then a filing, approved automatically (category ``ops``)."""
    rt = Runtime(Catalogue([pay_as_governance_changes, filed]), AUTO, db=db)
    try:
        Accounts(rt.store).add("gina", "governance")
        steps = ({"id": 1, "tool": "pay_as_governance_changes", "params": {"amount": 5}},)
        record = rt.submit(plan(*steps, {"id": 2, "tool": "filed", "params": {"n": "${1}"}}), "ann")
        assert record.status == "approved"
        return record.id
    finally:
        rt.close()


def test_a_take_back_refused_by_the_register_records_what_it_knew(pg_db: str) -> None:
    """The register held the plan's category for people while the store was away: the take-back's claim is
    refused and the plan goes back for approval, as before. The payment plangate knew was made is recorded
    first, where it was dropped: left started, the run after the approval halted it as of unknown outcome,
    for a person to settle a payment plangate had known was made."""
    plan_id = paid_then_filed(pg_db)

    def hold() -> None:
        with closing(open_store(pg_db)) as store:
            Register(store).set("ops", False, by="gina", reason="an audit")

    HOLD["change"] = hold
    rt = Runtime(Catalogue([pay_as_governance_changes, filed]), AUTO, db=pg_db)
    try:
        with pytest.raises(GovernanceError, match="a person") as refused:
            rt.execute(plan_id)
        assert "the outcome of step 1, known from before the store went away, is recorded" in str(refused.value)
        held = rt.get(plan_id)
        assert (held.status, held.needs) == ("pending_approval", ("a person",))
        assert rt.store.steps(plan_id)[1].status == "succeeded" and rt.store.steps(plan_id)[1].output == "paid 5"
        rt.approve(plan_id, "ben", held.hash)
        result = rt.execute(plan_id)
    finally:
        rt.close()
    assert result.status == "succeeded" and result.outputs == {1: "paid 5", 2: "paid 5"}, result
    ran_once_and_verifies(pg_db, plan_id, 2, catalogue=Catalogue([pay_as_governance_changes, filed]))


def test_a_take_back_refused_by_changed_tools_records_what_it_knew_and_halts(pg_db: str) -> None:
    """The tools changed while the store was away, and the plan no longer passes: the run halts where a person
    can end it, as before, with the payment it knew recorded, not left for that person to settle."""
    plan_id = paid_then_filed(pg_db)
    rt = Runtime(Catalogue([pay_as_governance_changes, filed]), AUTO, db=pg_db)
    HOLD["change"] = lambda: setattr(rt, "catalogue", Catalogue([pay_as_governance_changes, filed_as_text]))
    try:
        with pytest.raises(GovernanceError, match="no longer passes") as refused:
            rt.execute(plan_id)
        assert "the outcome of step 1, known from before the store went away, is recorded" in str(refused.value)
        assert rt.get(plan_id).status == "halted"
        steps = rt.store.steps(plan_id)
        assert steps[1].status == "succeeded" and steps[1].output == "paid 5" and 2 not in steps
        assert rt.store.verify_audit().ok
        assert rt.replay(plan_id).ok
    finally:
        rt.close()
    assert [s for _, s in CALLS] == [1]


def test_a_take_back_refused_as_the_tool_that_answered_is_gone_says_its_outcome_is_not_recorded(pg_db: str) -> None:
    """The tool that answered is gone from the tools now in force: its outcome is not recorded (the engine would
    have nothing to record it as), the step is left started for the next run to decide, and the refusal says so."""
    plan_id = paid_then_filed(pg_db)
    rt = Runtime(Catalogue([pay_as_governance_changes, filed]), AUTO, db=pg_db)
    HOLD["change"] = lambda: setattr(rt, "catalogue", Catalogue([filed]))
    try:
        with pytest.raises(GovernanceError, match="no longer passes") as refused:
            rt.execute(plan_id)
        said = str(refused.value)
        assert "the outcome of step 1, known from before the store went away, is not recorded (the tools" in said
        assert "is recorded" not in said, said
        assert rt.get(plan_id).status == "halted" and rt.store.steps(plan_id)[1].status == "started"
        assert rt.store.verify_audit().ok
    finally:
        rt.close()


@tool(effect="write", compensate="refund")
def book_as_governance_changes(n: int, ctx: RunContext) -> dict[str, str]:
    """A booking, undone by refund; while the store is away, governance changes (``HOLD``), as for the payment."""
    CALLS.append((ctx.plan_id, ctx.step_id))
    HOLD["change"]()
    outage.cut_every_connection()
    return {"booking": f"b{n}"}


AUTO_ROLLING = Policy.from_yaml(
    "version: 1\nname: auto-ops\ncategories: {ops: {tools: [book_as_governance_changes, filed]}}\n"
    "approval: {auto: [ops], escalate: []}\ncompensation: {on_halt: auto}\n"
)


@pytest.mark.parametrize(
    ("change", "refusal", "status"),
    [("tools", "no longer passes", "halted"), ("register", "it is back for approval", "pending_approval")],
)
def test_a_refused_take_back_whose_answer_was_lost_is_still_the_refusal(
    pg_db: str, monkeypatch: pytest.MonkeyPatch, change: str, refusal: str, status: str
) -> None:
    """The take-back's claim is refused by the governance now in force, and the refusal's commit goes through as
    its answer is lost. The next try found the plan no longer under its lease, with what its run knew on record:
    a plan halted by the refusal it read as the run's own end, and the caller got a halted result with no word of
    the refusal, and the policy's rollback (which a refused plan never gets: it halts for a person) undid the
    booking; a plan back for approval it read as taken by another runner. Either way it is the refusal now."""
    outage.cut_armed_commits(monkeypatch)
    start, armed = Runtime.start, []

    def the_refusal_cut(self: Runtime, plan_id: str, **kwargs: Any) -> Any:
        if kwargs.get("known") is not None and not armed:  # the take-back's first claim: its commit is cut
            armed.append(plan_id)
            outage.ARMED["thread"] = threading.get_ident()
        return start(self, plan_id, **kwargs)

    monkeypatch.setattr(Runtime, "start", the_refusal_cut)
    rt = Runtime(Catalogue([book_as_governance_changes, refund, filed]), AUTO_ROLLING, db=pg_db)

    def hold() -> None:
        if change == "tools":
            rt.catalogue = Catalogue([book_as_governance_changes, refund, filed_as_text])
        else:
            with closing(open_store(pg_db)) as store:
                Register(store).set("ops", False, by="gina", reason="an audit")

    HOLD["change"] = hold
    try:
        Accounts(rt.store).add("gina", "governance")
        steps = ({"id": 1, "tool": "book_as_governance_changes", "params": {"n": 1}},)
        record = rt.submit(plan(*steps, {"id": 2, "tool": "filed", "params": {"n": "${1.booking}"}}), "ann")
        assert record.status == "approved"
        with pytest.raises(GovernanceError, match=refusal) as refused:
            rt.execute(record.id)
        assert armed == [record.id] and "thread" not in outage.ARMED  # the refusal's commit was cut
        assert "the outcome of step 1, known from before the store went away, is recorded" in str(refused.value)
        assert rt.get(record.id).status == status
        assert rt.store.steps(record.id)[1].status == "succeeded"
        assert rt.store.verify_audit().ok
    finally:
        rt.close()
    assert [s for _, s in CALLS] == [1], "the booking was undone by the policy's rollback"
