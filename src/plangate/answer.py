"""A plan's answer: the text the planner writes for the user, filled in from the outputs, with each part's sources.

A plan's optional ``answer`` is text with ``${N.path}`` references, interpolated as in a
parameter's text (strings as they are, anything else as compact JSON). It is rendered when
the run succeeds, from the recorded outputs, so replay renders it again exactly.

Each part of the rendered text keeps its sources: literal parts are plan text, a reference's
part derives from what step N's output derives from (:mod:`plangate.provenance`). A part
from an untrusted step is what an injection could have written; it is shown marked, and the
policy's answer sink rule (``answer: true``, see :mod:`plangate.policy`) decides what it leads to.

The rendered answer is cut at :data:`MAX_ANSWER` characters, with a note of how many more
there were (the outputs themselves are recorded in full with their steps).

A reference to a step that was skipped (its condition false) reads as the marker
``[step N skipped]``; one to an optional step that failed reads as ``null``. A reference's
part derives also from the steps whose condition decides whether step N runs: an e-mail
that picks which of two trusted records the user reads wrote that part as surely as if it
were quoted.

The recorded text keeps every character; what is shown (:func:`marked_text`, :func:`shown`)
is escaped so that the text cannot pass for its own marks: a fence's marks inside a part
are broken with a backslash, and characters that move the cursor or reorder or hide text
(controls, bidi overrides, line separators, and in an untrusted part newlines and tabs too)
are written as escapes (``\\x1b``, ``\\u202e``).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

from plangate import _display, references
from plangate.errors import RefError
from plangate.plan import Plan
from plangate.provenance import PLAN, Origin, Provenance, union

SKIPPED_MARK = "[step {step} skipped]"
"""What a reference to a skipped step reads as in the answer."""

MAX_ANSWER = 65_536
"""Characters of the rendered answer kept (the longest string a plan may hold): the outputs it quotes are
recorded in full in their own steps' events; the answer is what the user reads, not a second copy of them."""

CUT_MARK = " [... {more} more characters: the answer is cut at {limit}; the outputs are in full in the trace]"

_TOKEN = re.compile(r"\$\$\{|\$\{([^}]*)\}|\$\{")

OPEN, CLOSE = "[untrusted: {who}>>]", "[<<]"
"""The fence the CLI puts around an untrusted part of the answer."""

_MARKS = re.compile(r"\[<<\]|>>\]")
_BROKEN = {"[<<]": "[\\<<]", ">>]": ">\\>]"}


class Part(NamedTuple):
    """A piece of the rendered answer: literal plan text (no origins) or what one reference read."""

    text: str
    origins: tuple[Origin, ...] = ()
    ref: str | None = None

    @property
    def untrusted(self) -> tuple[Origin, ...]:
        return tuple(o for o in self.origins if o.untrusted)


class Answer(NamedTuple):
    """The rendered answer, in parts, with the origins of each."""

    parts: tuple[Part, ...]

    @property
    def text(self) -> str:
        return "".join(part.text for part in self.parts)

    @property
    def origins(self) -> tuple[Origin, ...]:
        return union(part.origins for part in self.parts)

    @property
    def sources(self) -> tuple[str, ...]:
        literal = any(not part.origins for part in self.parts) or not self.parts
        return ((PLAN,) if literal else ()) + tuple(o.source for o in self.origins)

    @property
    def untrusted(self) -> tuple[Origin, ...]:
        return tuple(o for o in self.origins if o.untrusted)

    def spans(self) -> list[list[int]]:
        """``[start, end, step]`` of each part an untrusted step fed (one per untrusted step of the part)."""
        out: list[list[int]] = []
        at = 0
        for part in self.parts:
            end = at + len(part.text)
            out.extend([at, end, o.step] for o in part.untrusted)
            at = end
        return out

    def provenance(self) -> dict[str, Any]:
        """What the ``run.succeeded`` event records as ``answer_provenance``."""
        return {
            "sources": list(self.sources),
            "untrusted": [{"step": o.step, "tool": o.tool} for o in self.untrusted],
            "spans": self.spans(),
        }

    def marked(self) -> str:
        """The text with each untrusted part fenced and named: how the CLI prints it."""
        return marked_text(self.text, self.provenance())


def refs(text: str) -> list[references.Ref]:
    """The references in an answer's text; raises :class:`RefError` on a malformed one."""
    return references.scan(text)


def origins(plan: Plan, flows: Provenance) -> tuple[Origin, ...]:
    """What the plan's answer derives from, worked out before anything runs (empty without an answer)."""
    if plan.answer is None or not references.has_refs(plan.answer):
        return ()
    try:
        found = refs(plan.answer)
    except RefError:
        return ()
    return union(_fed(flows, ref.step) for ref in found)


def _fed(flows: Provenance, step: int) -> tuple[Origin, ...]:
    """What a reference to ``step`` derives from: the step's output, and the steps that decide whether it runs."""
    flow = flows.of(step)
    return union((flows.outputs.get(step, ()), flow.control if flow is not None else ()))


def render(
    plan: Plan, outputs: Mapping[int, Any], nulls: Collection[int], skipped: Collection[int], flows: Provenance
) -> Answer | None:
    """The plan's answer over the run's outputs (``skipped``: the steps that were skipped); None without one."""
    return None if plan.answer is None else _render(plan.answer, outputs, nulls, flows, skipped)


def _render(
    text: str, outputs: Mapping[int, Any], nulls: Collection[int], flows: Provenance, skipped: Collection[int]
) -> Answer:
    parts: list[Part] = []
    at = 0
    for match in _TOKEN.finditer(text):
        if match.start() > at:
            parts.append(Part(text[at : match.start()]))
        at = match.end()
        if match.group(0) == "$${":
            parts.append(Part("${"))
            continue
        ref = references.scan(match.group(0))[0]  # the checker made sure it parses
        found = _fed(flows, ref.step)
        if ref.step in skipped:
            parts.append(Part(SKIPPED_MARK.format(step=ref.step), found, ref.text))
        else:
            parts.append(Part(references.as_text(references.lookup(ref, outputs, nulls)), found, ref.text))
    if at < len(text):
        parts.append(Part(text[at:]))
    return Answer(tuple(_merged(_cut(parts))))


def _cut(parts: list[Part], limit: int = MAX_ANSWER) -> list[Part]:
    """At most ``limit`` characters of the parts, each cut part keeping its sources, and a note of the rest."""
    total = sum(len(part.text) for part in parts)
    if total <= limit:
        return parts
    kept: list[Part] = []
    room = limit
    for part in parts:
        if room <= 0:
            break
        kept.append(part if len(part.text) <= room else part._replace(text=part.text[:room]))
        room -= len(kept[-1].text)
    return [*kept, Part(CUT_MARK.format(more=total - limit, limit=limit))]


def _merged(parts: list[Part]) -> list[Part]:
    """Adjacent literal parts as one (an escaped ``$${`` splits the text it sits in)."""
    out: list[Part] = []
    for part in parts:
        if out and not part.origins and not out[-1].origins and part.ref is None and out[-1].ref is None:
            out[-1] = Part(out[-1].text + part.text)
        else:
            out.append(part)
    return out


def event_data(found: Answer | None) -> dict[str, Any]:
    """The ``answer`` and ``answer_provenance`` a ``run.succeeded`` event records (nothing without an answer)."""
    if found is None:
        return {}
    return {"answer": found.text, "answer_provenance": found.provenance()}


def segments(text: str, provenance: Mapping[str, Any] | None) -> list[tuple[str, str | None]]:
    """A recorded answer cut at its untrusted spans: each piece, and for an untrusted one, who fed it."""
    untrusted = {int(o["step"]): str(o["tool"]) for o in (provenance or {}).get("untrusted", ())}
    spans: dict[tuple[int, int], list[int]] = {}
    for start, end, step in (provenance or {}).get("spans", ()):
        spans.setdefault((int(start), int(end)), []).append(int(step))
    out: list[tuple[str, str | None]] = []
    at = 0
    for (start, end), steps in sorted(spans.items()):
        who = ", ".join(f"step {s} (untrusted: {untrusted.get(s, '?')})" for s in steps)
        out += [(text[at:start], None), (text[start:end], who)]
        at = end
    out.append((text[at:], None))
    return [(piece, who) for piece, who in out if piece or who]


def shown(piece: str, *, lines: bool) -> str:
    """A piece of the answer as it may be displayed: no mark of a fence, nothing that moves or hides text.

    ``lines``: newlines and tabs may stay (the plan's own text in a block of its own); else they
    are escaped too, so that an untrusted piece cannot start a line that reads like the CLI's own.
    """
    return _display.printable(_MARKS.sub(lambda m: _BROKEN[m.group(0)], piece), lines=lines)


def shown_segments(text: str, provenance: Mapping[str, Any] | None) -> list[tuple[str, str | None]]:
    """:func:`segments`, each piece :func:`shown`: what the dashboard displays."""
    return [(shown(piece, lines=who is None), who) for piece, who in segments(text, provenance)]


def marked_text(text: str, provenance: Mapping[str, Any] | None) -> str:
    """A recorded answer with its untrusted spans fenced (``[untrusted: WHO>>]text[<<]``), each piece :func:`shown`."""
    pieces = shown_segments(text, provenance)
    return "".join(piece if who is None else f"{OPEN.format(who=who)}{piece}{CLOSE}" for piece, who in pieces)
