"""The provider adapters against recorded responses of the real APIs' shape.

The official SDKs run for real; only their HTTP transport is replaced by one that answers
from tests/recordings and keeps the requests for inspection. Nothing leaves the machine.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import openai
import pytest

from plangate.models import Message, ModelError, ModelRequest, ToolSpec
from plangate.models.anthropic import AnthropicModel
from plangate.models.openai import OpenAIModel
from plangate.planner import parse_answer

RECORDINGS = Path(__file__).with_name("recordings")
REQUEST = ModelRequest(
    system="You plan.",
    messages=(Message(role="user", content="Refund invoice 42"),),
    max_tokens=4096,
    thinking_budget=2048,
    effort="medium",
    json_schema={"type": "object"},
)


class Recorder:
    """An httpx transport that answers every request with one recorded response (or raises)."""

    def __init__(self, recording: str | None, status: int = 200, error: Exception | None = None) -> None:
        self.body = (RECORDINGS / recording).read_text() if recording else "{}"
        self.status, self.error = status, error
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.host in ("api.test", "127.0.0.1"), "no request may leave the machine"
        self.requests.append(json.loads(request.content))
        if self.error is not None:
            raise self.error
        return httpx.Response(self.status, content=self.body, headers={"content-type": "application/json"})


def claude(recorder: Recorder) -> AnthropicModel:
    client = anthropic.Anthropic(
        api_key="test-key",
        base_url="https://api.test",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(recorder)),
    )
    return AnthropicModel("claude-sonnet-4-6", client=client)


def gpt(recorder: Recorder, **options: Any) -> OpenAIModel:
    client = openai.OpenAI(
        api_key="test-key",
        base_url="https://api.test/v1",
        max_retries=0,
        http_client=httpx.Client(transport=httpx.MockTransport(recorder)),
    )
    return OpenAIModel("o4-mini", client=client, **options)


def test_anthropic_extended_thinking_round_trip() -> None:
    recorder = Recorder("anthropic_thinking.json")
    response = claude(recorder).complete(REQUEST)
    sent = recorder.requests[0]
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 2048}
    assert sent["max_tokens"] == 4096 and sent["system"] == "You plan." and "temperature" not in sent
    assert sent["messages"] == [{"role": "user", "content": "Refund invoice 42"}]
    assert response.thinking.startswith("The user wants invoice 42 refunded.")
    assert (response.usage.input, response.usage.output, response.usage.thinking) == (2184, 412, 187)
    assert response.model == "claude-sonnet-4-6" and response.stop_reason == "end_turn"
    plan = parse_answer(response)
    assert [s.tool for s in plan.steps] == ["get_invoice", "issue_refund"]


def test_anthropic_thinking_budget_has_the_api_minimum() -> None:
    recorder = Recorder("anthropic_thinking.json")
    claude(recorder).complete(ModelRequest(**{**REQUEST.__dict__, "thinking_budget": 100, "max_tokens": 512}))
    sent = recorder.requests[0]
    assert sent["thinking"]["budget_tokens"] == 1024 and sent["max_tokens"] > 1024


def test_anthropic_native_tool_calls() -> None:
    recorder = Recorder("anthropic_tool_use.json")
    request = ModelRequest(
        system="s",
        messages=(Message(role="user", content="q"),),
        tools=(ToolSpec(name="get_invoice", description="Fetch one invoice.", parameters={"type": "object"}),),
    )
    response = claude(recorder).complete(request)
    assert recorder.requests[0]["tools"][0]["input_schema"] == {"type": "object"}
    assert response.tool_calls[0].name == "get_invoice" and response.tool_calls[0].arguments == {"invoice_id": "42"}
    assert response.text == "I'll look up the invoice first." and response.stop_reason == "tool_use"


@pytest.mark.parametrize(
    ("recorder", "message", "retryable"),
    [
        (lambda: Recorder("anthropic_refusal.json"), "refused to answer", False),
        (lambda: Recorder("anthropic_overloaded.json", status=529), "HTTP 529: Overloaded", True),
        (lambda: Recorder("anthropic_overloaded.json", status=400), "HTTP 400", False),
        (lambda: Recorder(None, error=httpx.ReadTimeout("slow")), "timed out", True),
        (lambda: Recorder(None, error=httpx.ConnectError("refused")), "cannot reach", True),
    ],
)
def test_anthropic_failures_are_clear(recorder: Callable[[], Recorder], message: str, retryable: bool) -> None:
    with pytest.raises(ModelError, match=message) as err:
        claude(recorder()).complete(REQUEST)
    assert err.value.retryable is retryable


def test_openai_reasoning_and_structured_output_round_trip() -> None:
    recorder = Recorder("openai_reasoning.json")
    response = gpt(recorder).complete(REQUEST)
    sent = recorder.requests[0]
    assert sent["reasoning_effort"] == "medium" and sent["max_completion_tokens"] == 4096
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "plan", "schema": {"type": "object"}, "strict": False},
    }
    assert sent["messages"][0] == {"role": "system", "content": "You plan."}
    assert (response.usage.input, response.usage.output, response.usage.thinking) == (2051, 1363, 1216)
    assert parse_answer(response).steps[1].params == {"invoice_id": "42", "amount": "${1.total}"}


def test_openai_compatible_servers_get_json_object_and_no_reasoning_effort() -> None:
    recorder = Recorder("openai_reasoning.json")
    gpt(recorder, provider="openai-compatible", structured="json_object", reasoning=False).complete(REQUEST)
    sent = recorder.requests[0]
    assert "reasoning_effort" not in sent
    assert sent["max_tokens"] == 4096 and "max_completion_tokens" not in sent
    assert sent["response_format"] == {"type": "json_object", "schema": {"type": "object"}}


def test_openai_native_tool_calls() -> None:
    recorder = Recorder("openai_tool_calls.json")
    request = ModelRequest(
        system="s",
        messages=(Message(role="user", content="q"),),
        tools=(ToolSpec(name="get_invoice", description="Fetch one invoice.", parameters={"type": "object"}),),
    )
    response = gpt(recorder).complete(request)
    assert recorder.requests[0]["tools"][0]["function"]["name"] == "get_invoice"
    assert response.tool_calls[0].arguments == {"invoice_id": "42"} and response.stop_reason == "tool_calls"


@pytest.mark.parametrize(
    ("recorder", "message", "retryable"),
    [
        (lambda: Recorder("openai_refusal.json"), "refused to answer: I'm sorry", False),
        (lambda: Recorder("openai_server_error.json", status=500), "HTTP 500: The server had an error", True),
        (lambda: Recorder("openai_server_error.json", status=401), "HTTP 401", False),
        (lambda: Recorder(None, error=httpx.ReadTimeout("slow")), "timed out", True),
    ],
)
def test_openai_failures_are_clear(recorder: Callable[[], Recorder], message: str, retryable: bool) -> None:
    with pytest.raises(ModelError, match=message) as err:
        gpt(recorder()).complete(REQUEST)
    assert err.value.retryable is retryable
