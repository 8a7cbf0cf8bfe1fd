"""A ReAct run's records and state: what callers get back, and a paused run rebuilt from its events."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from plangate import ledger
from plangate.errors import StateError
from plangate.models import Message, ToolCall, Usage
from plangate.plan import canonical
from plangate.store import ApprovalRow, Event, PlanRow, Store

Mode = Literal["text", "native"]


@dataclass(frozen=True, kw_only=True)
class ReActStep:
    """One turn: what the model thought and did, and what it observed."""

    number: int
    kind: Literal["action", "answer", "unparsed", "refused", "paused", "stopped"]
    thought: str = ""
    tool: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    observation: str = ""
    usage: Usage = field(default_factory=Usage)
    call_id: str | None = None
    """The provider's id of a native tool call; the observation went back to the model under it."""


@dataclass(frozen=True, kw_only=True)
class ReActResult:
    """How a run ended: ``answered``, ``stopped`` (with the reason) or ``paused`` for an approval."""

    run_id: str
    status: Literal["answered", "stopped", "paused"]
    answer: str | None = None
    reason: str | None = None
    steps: tuple[ReActStep, ...] = ()
    usage: Usage = field(default_factory=Usage)
    model_calls: int = 0
    tool_calls: int = 0
    violations: int = 0
    approvals: int = 0
    seconds: float = 0.0
    pending_hash: str | None = None


@dataclass(frozen=True, kw_only=True)
class Act:
    """One call to take: the step's number, the thought, the tool and its arguments."""

    number: int
    thought: str
    tool: str
    arguments: dict[str, Any]
    call_id: str | None = None  # native mode: the observation is the reply to this call
    text: str = ""  # text mode: the model's turn as written, to show it again on resume


@dataclass
class RunState:
    """Where a run stands: its transcript, steps, the actions the policy sees, counters, the calls still to take."""

    run_id: str
    question: str
    requested_by: str  # who asked: whose rights the run acts with, however it is carried on
    category: str  # as asked, whoever carries the run on
    owner: str | None = None  # who holds the run's lease
    transcript: list[Message] = field(default_factory=list)
    steps: list[ReActStep] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)
    status: Literal["answered", "stopped", "paused"] | None = None
    answer: str | None = None
    reason: str | None = None
    last_action: tuple[str, str] | None = None
    unparsed: int = 0
    usage: Usage = field(default_factory=Usage)
    model_calls: int = 0
    tool_calls: int = 0
    violations: int = 0
    approvals: int = 0
    seconds: float = 0.0
    pending_hash: str | None = None
    pending: dict[str, Any] | None = None
    pending_call: str | None = None  # the provider's id of the pending action's call, in native mode
    queue: list[Act] = field(default_factory=list)  # the calls of the last turn not taken yet, in order
    approved_by: list[ApprovalRow] = field(default_factory=list)  # the approvals the pending action holds
    mode: Mode | None = None  # as the run started: a run keeps its protocol when it is resumed
    started: float = field(default_factory=time.perf_counter)

    @property
    def turns(self) -> int:
        return len(self.steps)

    def add(self, step: ReActStep) -> None:
        self.steps.append(step)

    def result(self) -> ReActResult:
        """The run as callers see it: every field of :class:`ReActResult` is a field of the state's own."""
        assert self.status is not None
        given = {f.name: getattr(self, f.name) for f in fields(ReActResult)}
        return ReActResult(**{**given, "steps": tuple(self.steps)})

    @classmethod
    def load(cls, store: Store, row: PlanRow) -> RunState:
        """Rebuild a paused run from its events: the transcript, the actions taken, the pending one, and the
        calls of its turn still to take (those with no action event: none is ever taken twice).

        A call is known by its step number, not its id: a provider may give no ids, or ids
        that repeat across turns, and neither may make a call run twice or be left unanswered."""
        version = store.get_version(row.id, row.version)
        if version is None or version.check.action is None:
            raise StateError(f"ReAct run {row.id} has no pending action")
        told = ledger.right_to_resume(store, row)  # the row's category held to the log's, where it records one
        state = cls(run_id=row.id, question=row.task, requested_by=told.requested_by or "react", category=row.category)
        events, state.approved_by = told.events, told.standing()
        state.pending = json.loads(version.body)
        turn: Event | None = None
        taken: set[int | None] = set()
        for event in events:
            if event.kind == "react.tool_calls":
                turn = event
            elif event.kind == "react.action":
                taken.add(event.step_id)
            state.replay(event)
        if turn is not None:
            first = turn.step_id or 0
            state.queue = [
                Act(
                    number=first + index,
                    thought=turn.data["text"].strip(),
                    tool=call.name,
                    arguments=call.arguments,
                    call_id=call.id or None,
                )
                for index, call in enumerate(recorded_calls(turn.data["calls"]))
                if first + index not in taken
            ]
        return state

    def replay(self, event: Event) -> None:
        """One recorded event back into the transcript, the steps and the actions the policy sees."""
        data, number = event.data, event.step_id or 0
        if event.kind == "react.started":
            self.mode = data.get("mode", "text")
        elif event.kind == "react.tool_calls":
            self.transcript.append(
                Message(role="assistant", content=data["text"], tool_calls=recorded_calls(data["calls"]))
            )
        elif event.kind == "react.action":
            self._replay_action(number, data)
        elif event.kind == "react.unparsed":
            self.transcript.append(Message(role="assistant", content=data["text"]))
        elif event.kind == "react.observation":
            call_id, observation = data.get("call_id"), data["observation"]
            self.transcript.append(
                Message(role="tool", content=observation, tool_call_id=call_id)
                if call_id
                else Message(role="user", content=f"Observation: {observation}")
            )
            if data.get("refused"):
                self.actions = [a for a in self.actions if a["number"] != number]
            kind: Literal["action", "refused"] = "refused" if data.get("refused") else "action"
            self.steps.append(ReActStep(number=number, kind=kind, observation=observation, call_id=call_id))

    def _replay_action(self, number: int, data: dict[str, Any]) -> None:
        assert self.pending is not None
        call_id = data.get("call_id")
        if call_id is None:  # text mode: the turn was this action; native turns come from react.tool_calls
            text = data.get("text") or f"Thought: {data['thought']}\nAction: {data['tool']} " + json.dumps(
                data["arguments"]
            )
            self.transcript.append(Message(role="assistant", content=text))
        self.last_action = (data["tool"], canonical(data["arguments"]))
        if number == self.pending["number"]:
            self.pending_call = call_id
        else:
            self.actions.append({**data, "number": number})


def unsettled(events: Iterable[Event]) -> dict[int, str]:
    """The actions a run started whose outcome is not on record (an action event and no observation after it),
    by step number: their tools."""
    started: dict[int, str] = {}
    for event in events:
        if event.kind == "react.action":
            started[event.step_id or 0] = event.data["tool"]
        elif event.kind == "react.observation":
            started.pop(event.step_id or 0, None)
    return started


def recorded_calls(recorded: list[dict[str, Any]]) -> tuple[ToolCall, ...]:
    return tuple(ToolCall(id=c["id"], name=c["name"], arguments=c["arguments"]) for c in recorded)
