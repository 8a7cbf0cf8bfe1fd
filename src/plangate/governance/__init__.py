"""Governance exports: the artefacts an auditor asks for, written from the store, and their check.

``export`` writes a folder (see ``docs/governance.md``); ``verify`` checks one against its
manifest, and, given the store, the audit head it was taken at.
"""

from __future__ import annotations

from plangate.governance._approvals import COLUMNS as APPROVAL_COLUMNS
from plangate.governance._export import ARTEFACTS, ExportReport, export, parse_since, runbook
from plangate.governance._manifest import MANIFEST, Verdict, verify

__all__ = [
    "APPROVAL_COLUMNS",
    "ARTEFACTS",
    "MANIFEST",
    "ExportReport",
    "Verdict",
    "export",
    "parse_since",
    "runbook",
    "verify",
]
