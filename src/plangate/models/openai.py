"""OpenAI models, and any OpenAI-compatible server, through the official ``openai`` SDK.

``openai:MODEL`` talks to OpenAI (key from ``OPENAI_API_KEY``), with ``reasoning_effort``
and structured output. ``openai-compatible:MODEL`` talks to any server that speaks the
same API (vLLM, Ollama, the llama.cpp server) at ``base_url``. A reply is read to at most
``max_response_bytes`` (8 MiB by default): past it the call fails as a malformed response.
Install with ``pip install 'plangate[openai]'``.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from plangate import _input
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
    import openai
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("the OpenAI adapter needs its SDK: pip install 'plangate[openai]'") from exc

StructuredOutput = Literal["json_schema", "json_object", "none"]


class OpenAIModel:
    """An OpenAI (or compatible) chat model.

    ``structured`` says how to ask for JSON of the request's schema: ``json_schema``
    (OpenAI, vLLM), ``json_object`` with the schema beside it (the llama.cpp server), or
    ``none`` (the planner then parses leniently). The plan schema leaves parameters open,
    which strict mode cannot express, so the schema is sent with ``strict: false``.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        provider: str = "openai",
        structured: StructuredOutput = "json_schema",
        reasoning: bool = True,
        client: Any = None,
        timeout: float = 600.0,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        **client_options: Any,
    ) -> None:
        self.model = model
        self.name = f"{provider}:{model}"
        self.structured = structured
        self.reasoning = reasoning
        if client is None and "http_client" not in client_options:
            client_options["http_client"] = bounded_http(openai.DefaultHttpxClient, self.name, max_response_bytes)
        try:
            self.client = client or openai.OpenAI(base_url=base_url, timeout=timeout, **client_options)
        except openai.OpenAIError as exc:
            raise ModelError(f"cannot set up the OpenAI client: {exc}") from None

    def complete(self, request: ModelRequest) -> ModelResponse:
        params: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "system", "content": request.system}, *(_message(m) for m in request.messages)],
        }
        # OpenAI's reasoning models take only max_completion_tokens; compatible servers
        # (vLLM, Ollama, the llama.cpp server) honour the classic max_tokens.
        params["max_completion_tokens" if self.reasoning else "max_tokens"] = request.max_tokens
        if self.reasoning and request.effort is not None:
            params["reasoning_effort"] = request.effort
        if request.temperature is not None and not (self.reasoning and request.effort):
            params["temperature"] = request.temperature
        if request.stop:
            params["stop"] = list(request.stop)
        if request.json_schema is not None and self.structured != "none":
            params["response_format"] = _response_format(self.structured, request.json_schema)
        if request.tools:
            params["tools"] = [
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
                }
                for t in request.tools
            ]
        start = time.perf_counter()
        try:
            completion = self.client.chat.completions.create(**params)
        except openai.APITimeoutError:
            raise ModelError(f"{self.name}: the request timed out", retryable=True) from None
        except (openai.APIConnectionError, RefusedInputError) as exc:  # the SDK lets a reply cut off pass as it is
            raise cut_off(self.name, exc) or ModelError(
                f"{self.name}: cannot reach the server: {exc}", retryable=True
            ) from None
        except openai.APIStatusError as exc:
            raise http_error(self.name, exc.status_code, exc) from None
        return _response(self.name, completion, time.perf_counter() - start)


def _response_format(mode: StructuredOutput, schema: dict[str, Any]) -> dict[str, Any]:
    if mode == "json_object":
        return {"type": "json_object", "schema": schema}
    return {"type": "json_schema", "json_schema": {"name": "plan", "schema": schema, "strict": False}}


def _message(message: Message) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    if message.tool_calls:
        return {
            "role": "assistant",
            "content": message.content or None,
            "tool_calls": [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                for c in message.tool_calls
            ],
        }
    return {"role": message.role, "content": message.content}


def _response(name: str, completion: Any, seconds: float) -> ModelResponse:
    if not getattr(completion, "choices", None):
        raise ModelError(f"{name} answered with no choices")
    choice = completion.choices[0]
    message = getattr(choice, "message", None)
    if message is None:
        raise ModelError(f"{name}: malformed response: choices[0] has no message (a streaming chunk?)")
    if getattr(message, "refusal", None):
        raise ModelError(f"{name} refused to answer: {message.refusal}")
    if choice.finish_reason == "content_filter":
        raise ModelError(f"{name}: the provider's content filter stopped the answer")
    if message.content is not None and not isinstance(message.content, str):
        raise ModelError(
            f"{name}: malformed response: the message content is {type(message.content).__name__}, not text"
        )
    calls = []
    for index, call in enumerate(message.tool_calls or ()):
        function: Any = getattr(call, "function", None)
        if not isinstance(getattr(function, "name", None), str):
            raise ModelError(f"{name}: malformed response: tool_calls[{index}] names no function")
        calls.append(ToolCall(id=str(call.id), name=function.name, arguments=_arguments(function.arguments)))
    usage = completion.usage
    details = getattr(usage, "completion_tokens_details", None) if usage else None
    thinking_text = (
        getattr(message, "reasoning_content", None) or (message.model_extra or {}).get("reasoning_content") or ""
    )
    return ModelResponse(
        text=message.content or "",
        thinking=thinking_text if isinstance(thinking_text, str) else "",
        tool_calls=tuple(calls),
        usage=Usage(
            input=token_count(name, "prompt_tokens", usage.prompt_tokens) if usage else 0,
            output=token_count(name, "completion_tokens", usage.completion_tokens) if usage else 0,
            thinking=token_count(name, "reasoning_tokens", getattr(details, "reasoning_tokens", None), absent=0),
        ),
        model=completion.model or name,
        stop_reason=choice.finish_reason,
        seconds=seconds,
    )


def _arguments(raw: object) -> dict[str, Any]:
    """A tool call's arguments: the JSON object the API sends as text. Anything else (not JSON, a JSON
    string of JSON, an array) is kept whole under ``__unparsed__`` for the tool's validation to refuse."""
    if isinstance(raw, dict):  # some compatible servers send the object itself
        return raw
    if raw is None or raw == "":
        return {}
    try:
        arguments = _input.loads_strict(raw, what="tool call arguments") if isinstance(raw, str) else None
    except RefusedInputError:
        arguments = None
    return arguments if isinstance(arguments, dict) else {"__unparsed__": raw if isinstance(raw, str) else repr(raw)}
