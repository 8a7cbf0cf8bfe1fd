"""The provider adapters against recorded responses of the real APIs' shape.

The official SDKs run for real; only their HTTP transport is replaced by one that answers
from tests/recordings and keeps the requests for inspection. Nothing leaves the machine.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anthropic
import httpx2 as httpx
import openai
import pytest

from plangate import Catalogue, tool
from plangate._bounded import BoundedTransport
from plangate.models import Message, ModelError, ModelRequest, ToolCall, ToolSpec
from plangate.models.anthropic import AnthropicModel
from plangate.models.openai import OpenAIModel
from plangate.planner import parse_answer
from plangate.react import ReActAgent
from plangate.runtime import Runtime
from plangate.store import open_store
from tests.helpers import FixedClock

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
    """An httpx transport that answers with recorded responses, in order, the last one again and again
    (or raises)."""

    def __init__(
        self, recording: str | Sequence[str] | None, status: int = 200, error: Exception | None = None
    ) -> None:
        names = [recording] if isinstance(recording, str) else list(recording or [])
        self.bodies = [(RECORDINGS / name).read_text() for name in names] or ["{}"]
        self.status, self.error = status, error
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        assert request.url.host in ("api.test", "127.0.0.1"), "no request may leave the machine"
        self.requests.append(json.loads(request.content))
        if self.error is not None:
            raise self.error
        body = self.bodies[min(len(self.requests), len(self.bodies)) - 1]
        return httpx.Response(self.status, content=body, headers={"content-type": "application/json"})


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


@pytest.mark.parametrize(
    ("sdk", "adapter", "recording", "url"),
    [
        (anthropic.Anthropic, AnthropicModel, "anthropic_answer.json", "https://api.test"),
        (openai.OpenAI, OpenAIModel, "openai_answer.json", "https://api.test/v1"),
    ],
)
def test_a_reply_cut_off_for_its_size_is_not_asked_for_again(sdk: Any, adapter: Any, recording: str, url: str) -> None:
    """The SDKs retry a read that failed, twice by default: a reply cut off past ``max_response_bytes`` is no
    passing failure (the same endpoint sends the same reply), so it is downloaded once, not three times."""
    recorder = Recorder(recording)

    def streamed(request: httpx.Request) -> httpx.Response:  # as a server sends it: a body still to be read
        answer = recorder(request)
        return httpx.Response(answer.status_code, headers=answer.headers, stream=httpx.ByteStream(answer.content))

    bounded = BoundedTransport(100, what="the model", inner=httpx.MockTransport(streamed))
    client = sdk(api_key="test-key", base_url=url, max_retries=2, http_client=httpx.Client(transport=bounded))
    with pytest.raises(ModelError, match=r"too-large: the answer is over the limit of 100 bytes.*max_response_bytes"):
        adapter("m", client=client).complete(REQUEST)
    assert len(recorder.requests) == 1


class _Stalls(httpx.SyncByteStream):
    def __iter__(self) -> Any:
        yield b'{"id": "msg_1", '
        raise httpx.ReadTimeout("slow")


def test_anthropic_reply_that_stalls_while_read_is_a_timeout() -> None:
    """The reply's body is read after the SDK's retries (see above): a read that stalls there is still a timeout."""
    client = anthropic.Anthropic(
        api_key="test-key",
        base_url="https://api.test",
        http_client=httpx.Client(transport=httpx.MockTransport(lambda _: httpx.Response(200, stream=_Stalls()))),
    )
    with pytest.raises(ModelError, match="timed out") as err:
        AnthropicModel("m", client=client).complete(REQUEST)
    assert err.value.retryable


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


# -- several tool calls in one turn: one reply per call id, in the message the API expects --------
TURN = (
    Message(role="user", content="q"),
    Message(
        role="assistant",
        content="Looking both up.",
        tool_calls=(
            ToolCall(id="a", name="get_invoice", arguments={"invoice_id": "42"}),
            ToolCall(id="b", name="get_invoice", arguments={"invoice_id": "43"}),
        ),
    ),
    Message(role="tool", content="980 EUR", tool_call_id="a"),
    Message(role="tool", content="120 EUR", tool_call_id="b"),
)


def test_openai_answers_each_tool_call_with_its_own_tool_message() -> None:
    recorder = Recorder("openai_parallel_tool_calls.json")
    response = gpt(recorder).complete(ModelRequest(system="s", messages=TURN))
    assert recorder.requests[0]["messages"][1:] == [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "Looking both up.",
            "tool_calls": [
                {
                    "id": "a",
                    "type": "function",
                    "function": {"name": "get_invoice", "arguments": '{"invoice_id": "42"}'},
                },
                {
                    "id": "b",
                    "type": "function",
                    "function": {"name": "get_invoice", "arguments": '{"invoice_id": "43"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": "980 EUR"},
        {"role": "tool", "tool_call_id": "b", "content": "120 EUR"},
    ]
    assert [(c.name, c.arguments) for c in response.tool_calls] == [
        ("get_invoice", {"invoice_id": "42"}),
        ("flag_invoice", {"invoice_id": "42"}),
        ("get_invoice", {"invoice_id": "43"}),
    ]


def test_anthropic_answers_all_tool_uses_of_a_turn_in_one_user_message() -> None:
    recorder = Recorder("anthropic_parallel_tool_use.json")
    response = claude(recorder).complete(
        ModelRequest(system="s", messages=(*TURN, Message(role="user", content="more")))
    )
    assert recorder.requests[0]["messages"] == [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking both up."},
                {"type": "tool_use", "id": "a", "name": "get_invoice", "input": {"invoice_id": "42"}},
                {"type": "tool_use", "id": "b", "name": "get_invoice", "input": {"invoice_id": "43"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "a", "content": "980 EUR"},
                {"type": "tool_result", "tool_use_id": "b", "content": "120 EUR"},
            ],
        },
        {"role": "user", "content": "more"},
    ]
    assert [c.id for c in response.tool_calls] == [
        "toolu_01Kq8sW3mTfZ6yNcV2hRb7Xp",
        "toolu_01Bn4dJ9wLe5uQaG7tYk1MzC",
        "toolu_01Pv6xH2cRg8oWsE3jFn9LaT",
    ]
    assert response.text == "I'll fetch both invoices and flag 42." and response.stop_reason == "tool_use"


FLAGGED: list[str] = []


@tool()
def get_invoice(invoice_id: str) -> str:
    """Fetch one invoice."""
    return f"invoice {invoice_id}: {980 if invoice_id == '42' else 120} EUR"


@tool(effect="write")
def flag_invoice(invoice_id: str) -> str:
    """Flag an invoice for review."""
    FLAGGED.append(invoice_id)
    return "flagged"


INVOICES = Catalogue([get_invoice, flag_invoice])


def openai_replies(sent: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(the call ids the assistant asked for, the tool_call_id of each tool message), in order."""
    messages = sent["messages"]
    asked = [c["id"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or ()]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool", "tool"]
    return asked, [m["tool_call_id"] for m in messages if m["role"] == "tool"]


def anthropic_replies(sent: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The same for Claude: tool_use blocks, and the tool_result blocks of the user message right after them."""
    messages = sent["messages"]
    turn = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    asked = [b["id"] for b in messages[turn]["content"] if b["type"] == "tool_use"]
    assert messages[turn + 1]["role"] == "user" and turn + 2 == len(messages), "one user message answers the turn"
    return asked, [b["tool_use_id"] for b in messages[turn + 1]["content"] if b["type"] == "tool_result"]


@pytest.mark.parametrize(
    ("build", "recordings", "read"),
    [
        (gpt, ["openai_parallel_tool_calls.json", "openai_answer.json"], openai_replies),
        (claude, ["anthropic_parallel_tool_use.json", "anthropic_answer.json"], anthropic_replies),
    ],
    ids=["openai", "anthropic"],
)
def test_a_react_turn_of_several_calls_paused_for_approval_answers_each_call_id_once(
    tmp_path: Path,
    build: Callable[[Recorder], Any],
    recordings: list[str],
    read: Callable[[dict[str, Any]], tuple[list[str], list[str]]],
) -> None:
    FLAGGED.clear()
    recorder = Recorder(recordings)
    store = open_store(f"sqlite:///{tmp_path}/r.db")
    react = ReActAgent(build(recorder), INVOICES, store, mode="native", clock=FixedClock(), user="ann")
    paused = react.run("Check invoices 42 and 43, and flag 42")
    assert paused.status == "paused" and FLAGGED == [] and len(recorder.requests) == 1
    Runtime(INVOICES, None, db=store, clock=FixedClock()).approve(paused.run_id, "ben", paused.pending_hash or "")
    result = react.resume(paused.run_id)
    assert result.status == "answered" and result.answer == "Invoice 42 (980 EUR) is flagged; invoice 43 is 120 EUR."
    assert FLAGGED == ["42"] and len(recorder.requests) == 2
    asked, answered = read(recorder.requests[1])
    assert len(asked) == 3 and answered == asked, "each call id answered once, in order"


def test_every_spec_the_models_docstring_names_is_one_from_spec_accepts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The table in ``plangate.models`` lists exactly the providers ``from_spec`` builds, and no other."""
    import plangate.models
    from plangate.errors import UsageError

    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    doc = plangate.models.__doc__ or ""
    specs = [line.split("``")[1] for line in doc.splitlines() if line.startswith("| ``")]
    assert {spec.partition(":")[0] for spec in specs} == set(plangate.models.PROVIDERS)
    for spec in specs:
        provider = spec.partition(":")[0]
        try:
            model = plangate.models.from_spec(f"{provider}:{tmp_path / 'm.gguf'}", base_url="http://127.0.0.1:9/v1")
        except ModelError as exc:  # recognised, then refused for a missing file: never an unknown provider
            assert provider == "llamacpp" and "no GGUF model at" in str(exc)
        else:
            assert model.name.startswith(f"{provider}:")
    for unknown in ("scripted:x", "function:x"):
        with pytest.raises(UsageError, match=r"unknown model provider .*: use one of anthropic, openai, "):
            plangate.models.from_spec(unknown)
