"""A ReAct model's turn read: in the text protocol its ``Thought:``, its ``Action: tool[input]`` (or a JSON object
of named arguments) or its ``Final Answer:``; in native mode the provider's tool calls. What does not read is a
problem for the model to be told, never an error of the run's."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from plangate import _input
from plangate._reactstate import Mode
from plangate.errors import RefusedInputError
from plangate.models import ModelResponse, ToolCall
from plangate.tools import Catalogue, Tool

_ACTION = re.compile(r"^\s*Action\s*:\s*(?P<tool>[A-Za-z_][\w.\-]*)\s*(?P<rest>.*)$", re.MULTILINE | re.DOTALL)
_ACTION_INPUT = re.compile(r"^\s*Action Input\s*:\s*(?P<input>.*)$", re.MULTILINE | re.DOTALL)
_FINAL = re.compile(r"Final Answer\s*:\s*(?P<answer>.*)", re.DOTALL)
_THOUGHT = re.compile(r"Thought\s*:\s*(?P<thought>.*?)(?=\n\s*(?:Action|Final Answer)\s*:|\Z)", re.DOTALL)


@dataclass(frozen=True, kw_only=True)
class Turn:
    """A model's turn read: its thought, and the calls it asks for, its final answer, or what is wrong."""

    thought: str = ""
    calls: tuple[ToolCall, ...] = ()  # in text mode one call, with no id
    answer: str | None = None
    problem: str | None = None


def read(response: ModelResponse, mode: Mode, catalogue: Catalogue) -> Turn:
    """The model's turn as read: native tool calls, or the text protocol's lines (a problem to tell it, where
    they do not read)."""
    if mode == "native":
        text = response.text.strip()
        if response.tool_calls:
            return Turn(thought=text, calls=response.tool_calls)
        return Turn(answer=text) if text else Turn(problem="an empty answer")
    text = response.text
    thought_match = _THOUGHT.search(text)
    thought = thought_match.group("thought").strip() if thought_match else ""
    final = _FINAL.search(text)
    action = _ACTION.search(text)
    if final and (not action or final.start() < action.start()):
        return Turn(thought=thought, answer=final.group("answer").strip())
    if not action:
        what = "an empty answer" if not text.strip() else "no 'Action:' or 'Final Answer:' line"
        return Turn(thought=thought, problem=what)
    name = action.group("tool")
    rest = action.group("rest").strip()
    given = _ACTION_INPUT.search(text)
    raw = given.group("input").strip() if given and not rest else rest
    try:
        arguments = read_arguments(raw, catalogue.get(name))
    except ValueError as exc:
        return Turn(thought=thought, problem=f"cannot read the input of {name}: {exc}")
    return Turn(thought=thought, calls=(ToolCall(id="", name=name, arguments=arguments),))


def read_arguments(raw: str, tool: Tool | None) -> dict[str, Any]:
    """``tool[input]``, a JSON object of named arguments, or plain text for the single parameter."""
    if raw.startswith("[") and raw.endswith("]"):
        raw = raw[1:-1]
    raw = raw.strip()
    if raw.startswith("{"):
        try:
            value = _input.loads_strict(raw, what="the input")
        except RefusedInputError as exc:
            if exc.rule == "not-json":
                raise ValueError(f"not a JSON object: {exc.detail}") from None
            raise ValueError(str(exc)) from None
        if not isinstance(value, dict):
            raise ValueError("give a JSON object of named arguments")
        return value
    if tool is None:
        return {"input": raw}
    required = tool.params_schema.get("required", [])
    if len(required) != 1:
        raise ValueError(
            f"{tool.name} takes {len(required)} required parameters ({', '.join(required)}): give a JSON object"
        )
    return {required[0]: raw.strip("'\"")}
