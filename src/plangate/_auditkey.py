"""Where the audit key comes from: outside the database, so whoever can write the database cannot forge the chain.

See :mod:`plangate._keys` for the order in which it is looked for and how the key file is made.
"""

from __future__ import annotations

from pathlib import Path

from plangate._keys import AUDIT_KEY

KEY_VARIABLE = AUDIT_KEY.variable
FILE_VARIABLE = AUDIT_KEY.file_variable


def key_path() -> Path:
    """The key file this process would use (whether or not it exists)."""
    return AUDIT_KEY.path()


def find_audit_key() -> bytes | None:
    """This process's audit key, or None when none is set and the key file does not exist."""
    return AUDIT_KEY.find()


def audit_key() -> bytes:
    """This process's audit key, making the key file on first use."""
    return AUDIT_KEY.get()
