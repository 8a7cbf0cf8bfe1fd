"""What model calls cost: a price table the user can edit, and the caps a policy sets."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from plangate import _input
from plangate._patterns import glob
from plangate.errors import RefusedInputError, UsageError
from plangate.models import ModelRequest, Usage

MESSAGE_TOKENS = 8
"""Tokens a chat format may add around each message (its role, its delimiters): three or four, as
providers count them, taken twice over."""


@dataclass(frozen=True, kw_only=True)
class Price:
    """US dollars per million tokens; thinking is billed as output."""

    input: float
    output: float

    def cost(self, usage: Usage) -> float:
        # Providers count thinking inside output when they report it; never bill it twice.
        output = max(usage.output, usage.thinking)
        return (usage.input * self.input + output * self.output) / 1_000_000


@dataclass(frozen=True)
class PriceTable:
    """Model name patterns to prices; the first pattern that matches wins."""

    entries: tuple[tuple[str, Price], ...]

    @classmethod
    def load(cls, path: str | Path | None = None) -> PriceTable:
        """The table at ``path``, or ``$PLANGATE_PRICES``, or the bundled one."""
        chosen = path or os.environ.get("PLANGATE_PRICES")
        try:
            if chosen:
                text = _input.read_text(chosen, what="price table", limit=_input.MAX_FILE_BYTES)
            else:
                text = resources.files("plangate").joinpath("prices.yaml").read_text(encoding="utf-8")
            data = _input.load_yaml(text, what=f"price table {str(chosen or 'prices.yaml')!r}") or {}
        except RefusedInputError as exc:
            raise UsageError(str(exc)) from None
        if not isinstance(data, dict):
            raise UsageError("a price table maps model patterns to {input: USD, output: USD} per million tokens")
        entries = []
        for pattern, row in data.items():
            if not (isinstance(row, dict) and {"input", "output"} <= set(row)):
                raise UsageError(f"price for {pattern!r}: write {{input: USD, output: USD}} per million tokens")
            price = Price(input=_usd(pattern, row["input"]), output=_usd(pattern, row["output"]))
            entries.append((str(pattern), price))
        return cls(tuple(entries))

    def price(self, model: str) -> Price | None:
        return next((price for pattern, price in self.entries if glob(pattern).match(model)), None)

    def cost(self, model: str, usage: Usage) -> float | None:
        """The cost in dollars, or ``None`` when the table has no price for the model."""
        price = self.price(model)
        return None if price is None else price.cost(usage)


def _usd(pattern: object, value: object) -> float:
    """A price per million tokens: a number, finite and not negative."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < float("inf"):
        raise UsageError(f"price for {pattern!r}: {value!r} is not a number of USD per million tokens")
    return float(value)


def most_prompt_tokens(request: ModelRequest) -> int:
    """The most tokens ``request``'s prompt can take, for a cost cap: an upper bound, not a guess.

    A byte-level BPE token covers at least one byte of UTF-8, so a text takes at most as many
    tokens as it has bytes; counted over everything the request sends (the system prompt, the
    messages and their tool calls, the tools offered, the output's schema), with
    :data:`MESSAGE_TOKENS` for the chat format around each message. Plain English runs about four
    bytes a token, so this counts about four times what such a prompt takes; but the prompt is the
    small part of a call's worst case, whose ``max_tokens`` and thinking budget are billed as
    output. Characters / 3, a guess for English, let text in CJK (three bytes a character, often a
    token each) or emoji (four bytes, as many as four tokens) cost several times the estimate.
    """
    parts = [request.system]
    for message in request.messages:
        parts += [message.content, *(json.dumps(c.arguments) for c in message.tool_calls)]
    parts += [json.dumps([t.name, t.description, t.parameters]) for t in request.tools]
    if request.json_schema is not None:
        parts.append(json.dumps(request.json_schema))
    return sum(len(part.encode()) for part in parts) + MESSAGE_TOKENS * (1 + len(request.messages))
