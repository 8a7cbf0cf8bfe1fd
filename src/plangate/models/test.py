"""Models for tests, shipped in the library so that no test needs the network.

``ScriptedModel`` answers from a list, in order; ``FunctionModel`` answers by calling a
function. Both count tokens with a tokenizer you give them (a real one, to compare
architectures fairly), or by splitting text into words and punctuation.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from plangate.models._base import ModelError, ModelRequest, ModelResponse, ToolCall, Usage

Tokenizer = Callable[[str], int]
_PIECES = re.compile(r"\w+|[^\w\s]")


def rough_tokens(text: str) -> int:
    """Words and punctuation marks: a stand-in when no real tokenizer is given."""
    return len(_PIECES.findall(text))


def prompt_text(request: ModelRequest) -> str:
    return "\n".join([request.system, *(m.content for m in request.messages)])


@dataclass(frozen=True, kw_only=True)
class Reply:
    """One scripted answer: text, and optionally thinking and tool calls."""

    text: str = ""
    thinking: str = ""
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass
class FunctionModel:
    """Answers each request by calling ``fn(request)`` (which returns a :class:`Reply` or text)."""

    fn: Callable[[ModelRequest], Reply | str]
    name: str = "function:test"
    tokenizer: Tokenizer = rough_tokens
    requests: list[ModelRequest] = field(default_factory=list)

    def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        start = time.perf_counter()
        reply = self.fn(request)
        if isinstance(reply, str):
            reply = Reply(text=reply)
        stop = next((s for s in request.stop if s in reply.text), None)
        text = reply.text.split(stop, 1)[0] if stop else reply.text
        thinking = self.tokenizer(reply.thinking) if reply.thinking else 0
        usage = Usage(
            input=self.tokenizer(prompt_text(request)),
            output=self.tokenizer(text) + thinking + sum(self.tokenizer(str(c.arguments)) for c in reply.tool_calls),
            thinking=thinking,
        )
        return ModelResponse(
            text=text,
            usage=usage,
            thinking=reply.thinking,
            tool_calls=reply.tool_calls,
            model=self.name,
            stop_reason="stop_sequence" if stop else "end_turn",
            seconds=time.perf_counter() - start,
        )


class ScriptedModel(FunctionModel):
    """Answers with the scripted replies in order; running out is an error, not a silent loop."""

    def __init__(
        self, replies: Iterable[Reply | str], *, name: str = "scripted:test", tokenizer: Tokenizer = rough_tokens
    ) -> None:
        self.script: Sequence[Reply | str] = list(replies)
        self.position = 0
        super().__init__(fn=self._next, name=name, tokenizer=tokenizer)

    def _next(self, request: ModelRequest) -> Reply | str:
        if self.position >= len(self.script):
            raise ModelError(f"the scripted model has no reply left (it had {len(self.script)})")
        reply = self.script[self.position]
        self.position += 1
        return reply
