"""What every recipe shares and no user writes: the example business, its policy, a store, the people."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plangate import Catalogue, Policy, Runtime

EXAMPLES = Path(__file__).resolve().parent.parent
TASK = "Refund invoice 42"
REQUESTER = "alice"  # support: asks for refunds
APPROVER = "dave"  # approver: a different person, who decides


def runtime(folder: str | Path) -> Runtime:
    """A runtime over the example business's tools and policy, with its store in ``folder``."""
    catalogue = Catalogue.from_module(EXAMPLES / "business.py")
    return Runtime(catalogue, Policy.load(EXAMPLES / "policy.yaml"), db=f"sqlite:///{folder}/plangate.db")


def written_plan(task: str) -> dict[str, Any]:
    """The plan a model writes for the task (here: always the same one, so no model is called)."""
    return {
        "task": task,
        "category": "refunds",
        "steps": [
            {"id": 1, "tool": "get_invoice", "params": {"invoice_id": "42"}, "rationale": "Need the amount."},
            {
                "id": 2,
                "tool": "issue_refund",
                "params": {"invoice_id": "42", "amount": "${1.total}"},
                "condition": '${1.status} == "paid"',
                "rationale": "The refund itself.",
                "rollback": "void_refund(refund_id=${2.refund_id})",
            },
        ],
    }
