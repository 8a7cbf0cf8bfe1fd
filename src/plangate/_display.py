"""Text from outside (a tool's output, an error) as it may be displayed on a terminal or a page.

A terminal obeys what it prints: an escape sequence moves the cursor or clears a line, a
carriage return writes over what came before, a bidi override prints text in another order
than it is stored. Text an injection could have written is escaped before it is shown, so
that a reader sees what it says and nothing it does.
"""

from __future__ import annotations

import unicodedata

_JOINERS = frozenset("\u200c\u200d")  # invisible, but scripts and emoji need them; they move nothing
_LINES = frozenset("\n\t")


def printable(text: str, *, lines: bool = False) -> str:
    """``text`` with every character that is not printable written as an escape (``\\x1b``, ``\\u202e``, ``\\r``).

    ``lines``: newlines and tabs may stay (text shown in a block of its own); else they are
    escaped too, so that the text cannot start a line that reads like the program's own.
    """
    if text.isprintable():
        return text
    return "".join(c if _kept(c, lines) else c.encode("unicode_escape").decode("ascii") for c in text)


def _kept(char: str, lines: bool) -> bool:
    if char.isprintable() or char in _JOINERS or unicodedata.category(char) == "Zs":
        return True
    return lines and char in _LINES
