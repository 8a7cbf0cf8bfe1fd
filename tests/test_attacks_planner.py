"""Malformed provider responses and model answers: refused plainly, never a traceback or a wrong cost.

The official SDKs run for real over an in-memory transport; nothing leaves the machine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import openai
import pytest

from plangate import Catalogue, Policy
from plangate.costs import Price, PriceTable
from plangate.models import Message, ModelError, ModelRequest, ModelResponse, Usage
from plangate.models.anthropic import AnthropicModel
from plangate.models.openai import OpenAIModel
from plangate.planner import Planner, PlanningError
from plangate.runtime import Runtime
from tests.helpers import FixedClock

RECORDINGS = Path(__file__).with_name("recordings")
REQUEST = ModelRequest(system="s", messages=(Message(role="user", content="q"),))
CLAUDE = json.loads((RECORDINGS / "anthropic_answer.json").read_text())
GPT = json.loads((RECORDINGS / "openai_answer.json").read_text())


def _client(body: Any) -> httpx.Client:
    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.host == "api.test", "no request may leave the machine"
        return httpx.Response(200, content=json.dumps(body), headers={"content-type": "application/json"})

    return httpx.Client(transport=httpx.MockTransport(answer))


def claude(body: Any) -> AnthropicModel:
    client = anthropic.Anthropic(api_key="k", base_url="https://api.test", max_retries=0, http_client=_client(body))
    return AnthropicModel("claude-sonnet-4-6", client=client)


def gpt(body: Any) -> OpenAIModel:
    client = openai.OpenAI(api_key="k", base_url="https://api.test/v1", max_retries=0, http_client=_client(body))
    return OpenAIModel("o4-mini", client=client)


def _gpt_message(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {**GPT, "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}]}


def _tool_call(arguments: Any, name: Any = "get_invoice") -> dict[str, Any]:
    call = {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}
    return _gpt_message({"content": None, "tool_calls": [call]}, "tool_calls")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({k: v for k, v in CLAUDE.items() if k != "usage"}, "no usage"),
        ({**CLAUDE, "usage": {"input_tokens": -5, "output_tokens": -1000}}, "input_tokens is -5"),
        ({**CLAUDE, "usage": {"input_tokens": None, "output_tokens": 3}}, "input_tokens is None"),
        ({**CLAUDE, "usage": {"input_tokens": 1, "output_tokens": 10**40}}, "output_tokens is 1000"),
        ({**CLAUDE, "content": None}, "no list of content blocks"),
        ({"type": "message_start", "message": {}}, "no list of content blocks"),
        ({**CLAUDE, "content": [{"type": "text", "text": None}]}, r"content\[0\].text is NoneType"),
        ({**CLAUDE, "content": [{"type": "tool_use", "id": "t", "name": "x", "input": '"{}"'}]}, "input object"),
    ],
)
def test_anthropic_malformed_responses_are_refused_plainly(body: Any, message: str) -> None:
    with pytest.raises(ModelError, match=message):
        claude(body).complete(REQUEST)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({**GPT, "usage": {"prompt_tokens": -5, "completion_tokens": -10}}, "prompt_tokens is -5"),
        ({**GPT, "usage": {"prompt_tokens": None, "completion_tokens": None}}, "prompt_tokens is None"),
        ({**GPT, "choices": [{"index": 0, "finish_reason": "stop"}]}, "has no message"),
        ({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "x"}}]}, "no message"),
        (_gpt_message({"content": None}, "content_filter"), "content filter"),
        (_gpt_message({"content": [{"type": "text", "text": "x"}]}), "content is list, not text"),
        (_tool_call("{}", name=None), "names no function"),
    ],
)
def test_openai_malformed_responses_are_refused_plainly(body: Any, message: str) -> None:
    with pytest.raises(ModelError, match=message):
        gpt(body).complete(REQUEST)


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (json.dumps(json.dumps({"invoice_id": "42"})), {"__unparsed__": json.dumps(json.dumps({"invoice_id": "42"}))}),
        ("[1, 2]", {"__unparsed__": "[1, 2]"}),
        ({"invoice_id": "42"}, {"invoice_id": "42"}),
        ("", {}),
    ],
)
def test_openai_tool_call_arguments_are_always_an_object(arguments: Any, expected: dict[str, Any]) -> None:
    call = gpt(_tool_call(arguments)).complete(REQUEST).tool_calls[0]
    assert isinstance(call.arguments, dict) and call.arguments == expected


class BadUsageModel:
    name = "scripted:bad"

    def __init__(self, usage: Usage) -> None:
        self.usage = usage

    def complete(self, request: ModelRequest) -> ModelResponse:
        return ModelResponse(text="{}", usage=self.usage)


@pytest.mark.parametrize("usage", [Usage(input=-1_000_000, output=5), Usage(input=5, output=10**400)])
def test_the_ledger_never_records_a_negative_or_overflowing_cost(
    tmp_path: Path, catalogue: Catalogue, policy: Policy, usage: Usage
) -> None:
    runtime = Runtime(catalogue, policy, db=f"sqlite:///{tmp_path}/p.db", clock=FixedClock())
    assert runtime.catalogue is not None
    prices = PriceTable((("scripted:*", Price(input=1.0, output=4.0)),))
    planner = Planner(runtime.catalogue, model=BadUsageModel(usage), store=runtime.store, prices=prices)
    with pytest.raises(PlanningError, match="not a count of tokens") as err:
        planner.plan("Refund invoice 42")
    (row,) = err.value.calls
    assert row.ok is False and row.cost == 0.0 and row.error
    assert [c.cost for c in runtime.store.calls()] == [0.0]
