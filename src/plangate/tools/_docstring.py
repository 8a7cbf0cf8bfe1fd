"""Read a tool's description and its parameters' descriptions from its docstring.

Google style (``Args:``) and reST fields (``:param name:``) are understood; the
description is everything before the first section.
"""

from __future__ import annotations

import inspect
import re

_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns?|Raises|Yields|Examples?|Notes?):\s*$")
_ARG = re.compile(r"^(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_REST = re.compile(r"^:param\s+(?:\w+\s+)?(\w+):\s*(.*)$")


def parse(doc: str | None) -> tuple[str, dict[str, str]]:
    """``(description, {param: description})`` from a docstring."""
    lines = inspect.cleandoc(doc or "").splitlines()
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    for line in lines:
        stripped = line.strip()
        heading = _SECTION.match(stripped)
        rest = _REST.match(stripped)
        if heading and not line.startswith(" "):
            section, current = heading.group(1), None
        elif rest:
            section, current = "rest", rest.group(1)
            params[current] = rest.group(2).strip()
        elif section is None:
            summary.append(line)
        elif section in ("Args", "Arguments", "Parameters"):
            current = _arg_line(line, stripped, current, params)
        elif section == "rest" and current and line.startswith(" "):
            params[current] = f"{params[current]} {stripped}".strip()
    return "\n".join(summary).strip(), params


def _arg_line(line: str, stripped: str, current: str | None, params: dict[str, str]) -> str | None:
    match = _ARG.match(stripped)
    indent = len(line) - len(line.lstrip())
    if match and indent <= 4:
        name = match.group(1).lstrip("*")
        params[name] = match.group(2).strip()
        return name
    if current and stripped:
        params[current] = f"{params[current]} {stripped}".strip()
    return current
