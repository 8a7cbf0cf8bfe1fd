"""The comparison's tools: the example business's (invoices, customers, refunds, email) and the basic ones.

Use it as ``--tools examples/compare/tools.py``. Emails go to the business's outbox table
(``$PLANGATE_EXAMPLE_DB``), never out.
"""

from __future__ import annotations

from pathlib import Path

from plangate.tools import Catalogue
from plangate.tools.basic import calculate, get_current_date, search

_business = Catalogue.from_module(Path(__file__).resolve().parent.parent / "business.py")

get_invoice = _business["get_invoice"]
lookup_customer = _business["lookup_customer"]
issue_refund = _business["issue_refund"]
void_refund = _business["void_refund"]
send_email = _business["send_email"]

__all__ = [
    "calculate",
    "get_current_date",
    "get_invoice",
    "issue_refund",
    "lookup_customer",
    "search",
    "send_email",
    "void_refund",
]
