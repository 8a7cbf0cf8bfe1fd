"""Basic tools, done safely: a calculator, today's date, and search over local documents.

- ``calculate`` evaluates arithmetic by walking the syntax tree itself: numbers, ``+ - *
  / // % **``, parentheses and a few functions (``abs round min max sqrt``). Names,
  attributes, calls to anything else, and Python's ``eval`` are never involved. Every
  operation is bounded before it runs, so none can take long or hold much memory: 1,000
  characters, 200 nodes, every value (operand, intermediate, result) a finite real number
  of magnitude at most 10^300 (about 1,000 bits), a power only when its result stays
  within that, ``round`` to at most 300 digits either side of the point; and a time
  budget of 50 ms as a last resort. Every refusal is a :class:`CalculationError`.
- ``get_current_date`` reads the date from the run context, so a replay sees the date
  the run saw.
- ``search`` ranks documents with BM25 (k1 1.5, b 0.75) over a folder of text files:
  ``$PLANGATE_SEARCH_DIR``, or the small collection bundled with plangate.
  ``search_tool(folder)`` makes a search tool over any folder.
"""

from __future__ import annotations

import ast
import math
import operator
import os
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from typing_extensions import TypedDict

from plangate.tools._context import RunContext
from plangate.tools._tool import Tool, tool

MAX_EXPRESSION = 1_000
MAX_NODES = 200
MAX_EXPONENT = 1_000
MAX_MAGNITUDE = 10.0**300
MAX_NDIGITS = 300
TIME_BUDGET = 0.05

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {"abs": abs, "round": round, "min": min, "max": max, "sqrt": math.sqrt}


class CalculationError(ValueError):
    """The expression is refused or cannot be computed; the message says why."""


@tool
def calculate(expression: str) -> float:
    """Evaluate an arithmetic expression, e.g. "4.90 * 1.2" or "(2026 - 2011) * 12".

    Args:
        expression: Numbers, + - * / // % ** and parentheses; abs, round, min, max, sqrt.
    """
    if len(expression) > MAX_EXPRESSION:
        raise CalculationError(f"the expression is {len(expression)} characters; the limit is {MAX_EXPRESSION}")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise CalculationError(f"not an arithmetic expression: {getattr(exc, 'msg', exc)}") from None
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > MAX_NODES:
        raise CalculationError(f"the expression has {nodes} parts; the limit is {MAX_NODES}")
    result = _Evaluator(time.perf_counter() + TIME_BUDGET).eval(tree.body)
    return float(result)


@dataclass
class _Evaluator:
    deadline: float

    def eval(self, node: ast.AST) -> int | float:
        """The value of ``node``: always a finite real of magnitude at most ``MAX_MAGNITUDE``."""
        if time.perf_counter() > self.deadline:
            raise CalculationError("the calculation took too long")
        return _bounded(self._eval(node))

    def _eval(self, node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            operand = self.eval(node.operand)
            return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return self._binary(node)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
            if node.keywords:
                raise CalculationError("functions take plain arguments here")
            args = [self.eval(arg) for arg in node.args]
            if node.func.id == "round" and len(args) == 2 and abs(args[1]) > MAX_NDIGITS:
                raise CalculationError(f"round: ndigits {_shown(args[1])} is outside -{MAX_NDIGITS}..{MAX_NDIGITS}")
            try:
                return _FUNCTIONS[node.func.id](*args)  # type: ignore[no-any-return]
            except (TypeError, ValueError, OverflowError) as exc:
                raise CalculationError(f"{node.func.id}: {exc}") from None
        raise CalculationError(
            f"{type(node).__name__} is not allowed: only numbers, + - * / // % **, "
            "parentheses and abs round min max sqrt"
        )

    def _binary(self, node: ast.BinOp) -> int | float:
        left, right = self.eval(node.left), self.eval(node.right)
        _check_size(node.op, left, right)
        try:
            return _BINARY[type(node.op)](left, right)  # type: ignore[no-any-return]
        except ZeroDivisionError:
            raise CalculationError("division by zero") from None
        except OverflowError:
            raise CalculationError("the result is too large") from None


def _check_size(op: ast.operator, left: int | float, right: int | float) -> None:
    """Refuse, before it runs, an operation whose result would be over ``MAX_MAGNITUDE``."""
    if isinstance(op, ast.Pow) and (
        abs(right) > MAX_EXPONENT or (abs(left) > 1 and abs(right) * math.log10(abs(left)) > 300)
    ):
        raise CalculationError(f"the exponent {_shown(right)} is too large")
    if isinstance(op, ast.Mult) and left and right and math.log10(abs(left)) + math.log10(abs(right)) > 300:
        raise CalculationError("the result is too large")


def _shown(value: int | float) -> str:
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:8]}... ({len(text.lstrip('-'))} digits)"


def _bounded(value: object) -> int | float:
    """``value`` when it is a finite real number within ``MAX_MAGNITUDE``; otherwise why not."""
    if isinstance(value, complex):
        raise CalculationError("the result is not a real number (it is complex)")
    if not isinstance(value, int | float):
        raise CalculationError(f"the result is not a number: {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculationError("the result is not a finite number")
    if abs(value) > MAX_MAGNITUDE:
        raise CalculationError("the result is too large")
    return value


@tool
def get_current_date(ctx: RunContext) -> str:
    """Today's date (YYYY-MM-DD), as the run's clock sees it."""
    return ctx.now.date().isoformat()


class Hit(TypedDict):
    document: str
    score: float
    text: str


_WORDS = re.compile(r"\w+")


def _terms(text: str) -> list[str]:
    return [w.lower() for w in _WORDS.findall(text)]


class SearchIndex:
    """A BM25 index over the text files of a folder (``*.md`` and ``*.txt``)."""

    def __init__(self, documents: dict[str, str], *, k1: float = 1.5, b: float = 0.75) -> None:
        self.documents = documents
        self.k1, self.b = k1, b
        self.terms = {name: Counter(_terms(text)) for name, text in documents.items()}
        self.lengths = {name: sum(counts.values()) for name, counts in self.terms.items()}
        self.average = sum(self.lengths.values()) / max(1, len(self.lengths))
        frequency: Counter[str] = Counter()
        for counts in self.terms.values():
            frequency.update(counts.keys())
        n = len(documents)
        self.idf = {term: math.log(1 + (n - df + 0.5) / (df + 0.5)) for term, df in frequency.items()}

    @classmethod
    def from_folder(cls, folder: str | Path) -> SearchIndex:
        root = Path(folder)
        if not root.is_dir():
            raise ValueError(f"no folder {str(root)!r} to search")
        files = sorted(p for p in root.rglob("*") if p.suffix in (".md", ".txt") and p.is_file())
        return cls({str(p.relative_to(root)): p.read_text(encoding="utf-8", errors="replace") for p in files})

    def search(self, query: str, k: int = 3) -> list[Hit]:
        scores: list[tuple[float, str]] = []
        for name, counts in self.terms.items():
            norm = self.k1 * (1 - self.b + self.b * self.lengths[name] / self.average)
            score = sum(
                self.idf.get(t, 0.0) * counts[t] * (self.k1 + 1) / (counts[t] + norm)
                for t in set(_terms(query))
                if t in counts
            )
            if score > 0:
                scores.append((score, name))
        scores.sort(key=lambda item: (-item[0], item[1]))
        return [
            Hit(document=name, score=round(score, 4), text=self.documents[name].strip())
            for score, name in scores[: max(1, min(k, 10))]
        ]


@cache
def _index(folder: str) -> SearchIndex:
    return SearchIndex.from_folder(folder)


def _default_folder() -> str:
    return os.environ.get("PLANGATE_SEARCH_DIR") or str(resources.files("plangate").joinpath("data", "docs"))


def search_tool(folder: str | Path | None = None, *, name: str = "search") -> Tool:
    """A search tool over ``folder`` (default: ``$PLANGATE_SEARCH_DIR`` or the bundled documents)."""

    def search(query: str, k: int = 3) -> list[Hit]:
        """Search the document collection; returns the best matching documents with their text.

        Args:
            query: Words to look for.
            k: How many documents to return (1 to 10).
        """
        return _index(str(folder) if folder else _default_folder()).search(query, k)

    return tool(search, name=name, untrusted_output=True)


search = search_tool()
