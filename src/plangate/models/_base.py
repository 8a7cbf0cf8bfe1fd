"""One model interface: a request goes in, a response with text, tool calls, thinking and usage comes out."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from plangate.errors import PlangateError, RefusedInputError, UsageError

Effort = Literal["low", "medium", "high"]


@dataclass(frozen=True, kw_only=True)
class Message:
    role: Literal["user", "assistant", "tool"]
    content: str
    tool_call_id: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ToolSpec:
    """A tool offered to a model for native tool calling."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class ModelRequest:
    """What a model is asked.

    ``thinking_budget`` (tokens) is used by models that take one (Claude's extended
    thinking); ``effort`` by those that take a level (OpenAI's reasoning models); a model
    ignores what it cannot use. ``json_schema`` asks for output of that shape where the
    provider can constrain it.
    """

    system: str
    messages: tuple[Message, ...]
    max_tokens: int = 4096
    thinking_budget: int | None = None
    effort: Effort | None = None
    json_schema: dict[str, Any] | None = None
    stop: tuple[str, ...] = ()
    tools: tuple[ToolSpec, ...] = ()
    temperature: float | None = None


@dataclass(frozen=True, kw_only=True)
class Usage:
    """Tokens by kind. ``thinking`` is part of ``output`` when a provider counts it there."""

    input: int = 0
    output: int = 0
    thinking: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input=self.input + other.input, output=self.output + other.output, thinking=self.thinking + other.thinking
        )


@dataclass(frozen=True, kw_only=True)
class ModelResponse:
    text: str
    usage: Usage = field(default_factory=Usage)
    thinking: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    model: str = ""
    stop_reason: str | None = None
    seconds: float = 0.0


class Model(Protocol):
    """Anything that answers a :class:`ModelRequest`. ``name`` is ``provider:model``."""

    name: str

    def complete(self, request: ModelRequest) -> ModelResponse: ...


MAX_TOKEN_COUNT = 1_000_000_000
"""More tokens than any context holds: a count over this is a malformed response, not a bill."""


def token_count(model: str, what: str, value: object, *, absent: int | None = None) -> int:
    """A provider's token count, checked: a whole number from 0 to :data:`MAX_TOKEN_COUNT`.

    ``None`` becomes ``absent`` where the provider may leave the count out; anything else
    (negative, fractional, a string, huge) is a malformed response, refused plainly, so the
    cost ledger never records a negative, non-finite or made-up cost.
    """
    if value is None and absent is not None:
        return absent
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKEN_COUNT:
        raise ModelError(f"{model}: malformed response: usage {what} is {value!r}, not a count of tokens")
    return value


MAX_RESPONSE_BYTES = 8 * 1024 * 1024
"""The most a provider's reply may take on the wire unless an adapter is told otherwise: far more than any
real reply to the ``max_tokens`` a request may ask (a reply of 128,000 tokens is well under 2 MiB of JSON)."""


def bounded_http(default_client: Callable[..., Any], model: str, limit: int) -> Any:
    """An SDK's own default HTTP client, whose replies are cut off while read past ``limit`` bytes.

    The SDKs read a reply whole before looking at it, so a misconfigured or hostile base URL could
    send gigabytes; past the limit the read stops and the call fails (see :func:`cut_off`).
    """
    from plangate._bounded import BoundedTransport  # with the SDK: not when plangate alone is imported

    if limit < 1:
        raise UsageError(f"{model}: max_response_bytes must be at least 1")
    return _closing(default_client)(transport=BoundedTransport(limit, what=model))


@functools.cache
def _closing(default_client: type) -> type:
    """``default_client``, closed when it is collected, as the SDK's own is when the SDK makes it (a client
    given to the SDK is left to its giver): its connections are not left open."""

    class Closing(default_client):  # type: ignore[misc]
        def __del__(self) -> None:
            if not self.is_closed:
                with contextlib.suppress(Exception):
                    self.close()

    return Closing


def cut_off(model: str, exc: BaseException) -> ModelError | None:
    """The plain error for a call whose reply was refused while read (over the limit, compressed), if it was.

    Not retryable: the same endpoint would send the same reply.
    """
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, RefusedInputError):
        cause = cause.__cause__
    return ModelError(f"{model}: malformed response: {cause} (max_response_bytes)") if cause else None


def http_error(model: str, status: int, exc: Any) -> ModelError:
    """A provider's HTTP error in plain words; timeouts, conflicts, rate limits and 5xx may pass on retry."""
    body = getattr(exc, "body", None)
    detail = str(exc)
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            detail = str(error.get("message") or error)
    return ModelError(f"{model}: HTTP {status}: {detail}", retryable=status in (408, 409, 429) or status >= 500)


class ModelError(PlangateError):
    """A model call failed: the provider errored or timed out, refused, or answered nothing.

    ``retryable`` says whether the same call may succeed later (a timeout, an overloaded
    provider) or not (a refusal, a bad request, a missing key).
    """

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable
