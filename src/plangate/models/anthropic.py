"""Claude through the official ``anthropic`` SDK, with extended thinking.

Install with ``pip install 'plangate[anthropic]'``; the key comes from
``ANTHROPIC_API_KEY`` as the SDK reads it. A reply is read to at most ``max_response_bytes``
(8 MiB by default): past it the call fails as a malformed response, once (the body is read after
the SDK's retries, which would otherwise ask for it three times).
"""

from __future__ import annotations

import time
from typing import Any

from plangate.errors import RefusedInputError
from plangate.models._base import (
    MAX_RESPONSE_BYTES,
    Message,
    ModelError,
    ModelRequest,
    ModelResponse,
    ToolCall,
    Usage,
    bounded_http,
    cut_off,
    http_error,
    token_count,
)

try:
    import anthropic
    import httpx2
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the Anthropic adapter needs its SDK: pip install 'plangate[anthropic]'") from exc

MIN_THINKING = 1024  # the API's smallest thinking budget


class AnthropicModel:
    """``anthropic:MODEL``. Extended thinking is on when the request carries a thinking budget."""

    def __init__(
        self,
        model: str,
        *,
        client: Any = None,
        timeout: float = 600.0,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        **client_options: Any,
    ) -> None:
        self.model = model
        self.name = f"anthropic:{model}"
        if client is None and "http_client" not in client_options:
            client_options["http_client"] = bounded_http(anthropic.DefaultHttpxClient, self.name, max_response_bytes)
        try:
            self.client = client or anthropic.Anthropic(timeout=timeout, **client_options)
        except anthropic.AnthropicError as exc:
            raise ModelError(f"cannot set up the Anthropic client: {exc}") from None

    def complete(self, request: ModelRequest) -> ModelResponse:
        params: dict[str, Any] = {
            "model": self.model,
            "max_tokens": request.max_tokens,
            "system": request.system,
            "messages": _messages(request.messages),
        }
        if request.thinking_budget:
            budget = max(MIN_THINKING, request.thinking_budget)
            params["thinking"] = {"type": "enabled", "budget_tokens": budget}
            params["max_tokens"] = max(request.max_tokens, budget + 1024)
        elif request.temperature is not None:
            params["temperature"] = request.temperature
        if request.stop:
            params["stop_sequences"] = list(request.stop)
        if request.tools:
            params["tools"] = [
                {"name": t.name, "description": t.description, "input_schema": t.parameters} for t in request.tools
            ]
        start = time.perf_counter()
        try:  # the body read after the SDK's retries: it would ask three times for a reply cut off for its size
            with self.client.messages.with_streaming_response.create(**params) as reply:
                message = reply.parse()
        except (anthropic.APITimeoutError, httpx2.TimeoutException):
            raise ModelError(f"{self.name}: the request timed out", retryable=True) from None
        except (anthropic.APIConnectionError, httpx2.TransportError, RefusedInputError) as exc:
            raise cut_off(self.name, exc) or ModelError(
                f"{self.name}: cannot reach the API: {exc}", retryable=True
            ) from None
        except anthropic.APIStatusError as exc:
            raise http_error(self.name, exc.status_code, exc) from None
        return _response(self.name, message, time.perf_counter() - start)


def _messages(messages: tuple[Message, ...]) -> list[dict[str, Any]]:
    """The API's turns. The replies to one turn's tool calls are one user message of tool_result
    blocks, one per tool_use id: the API refuses tool_use ids left unanswered in the next message."""
    turns: list[dict[str, Any]] = []
    for previous, message in zip((None, *messages), messages, strict=False):
        if message.role == "tool" and previous is not None and previous.role == "tool":
            turns[-1]["content"] += _message(message)["content"]
        else:
            turns.append(_message(message))
    return turns


def _message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        return {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": message.tool_call_id, "content": message.content}],
        }
    if message.tool_calls:
        blocks: list[dict[str, Any]] = [{"type": "text", "text": message.content}] if message.content else []
        blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in message.tool_calls]
        return {"role": "assistant", "content": blocks}
    return {"role": message.role, "content": message.content}


def _response(name: str, message: Any, seconds: float) -> ModelResponse:
    content = getattr(message, "content", None)
    if not isinstance(content, list):
        raise ModelError(f"{name}: malformed response: no list of content blocks")
    texts, thoughts, calls = [], [], []
    for index, block in enumerate(content):
        kind = getattr(block, "type", None)
        if kind == "text":
            texts.append(_text(name, index, "text", getattr(block, "text", None)))
        elif kind == "thinking":
            thoughts.append(_text(name, index, "thinking", getattr(block, "thinking", None)))
        elif kind == "redacted_thinking":
            thoughts.append("[redacted thinking]")
        elif kind == "tool_use":
            arguments, tool = getattr(block, "input", None), getattr(block, "name", None)
            if not isinstance(tool, str) or not isinstance(arguments, dict):
                raise ModelError(
                    f"{name}: malformed response: content[{index}] is a tool_use without a name and an input object"
                )
            calls.append(ToolCall(id=str(getattr(block, "id", "")), name=tool, arguments=dict(arguments)))
    if message.stop_reason == "refusal":
        raise ModelError(f"{name} refused to answer", retryable=False)
    usage = getattr(message, "usage", None)
    if usage is None:
        raise ModelError(f"{name}: malformed response: no usage (the cost of the call is unknown)")
    details = getattr(usage, "output_tokens_details", None)
    thinking = getattr(details, "thinking_tokens", None)
    return ModelResponse(
        text="".join(texts),
        thinking="\n\n".join(thoughts),
        tool_calls=tuple(calls),
        usage=Usage(
            input=token_count(name, "input_tokens", getattr(usage, "input_tokens", None)),
            output=token_count(name, "output_tokens", getattr(usage, "output_tokens", None)),
            thinking=token_count(name, "thinking_tokens", thinking, absent=0),
        ),
        model=message.model,
        stop_reason=message.stop_reason,
        seconds=seconds,
    )


def _text(name: str, index: int, field: str, value: object) -> str:
    if not isinstance(value, str):
        raise ModelError(f"{name}: malformed response: content[{index}].{field} is {type(value).__name__}, not text")
    return value
